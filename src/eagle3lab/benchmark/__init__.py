"""Measurement: the local benchmark, forward costs and the scaling fit."""
