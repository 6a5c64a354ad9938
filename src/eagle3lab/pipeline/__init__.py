"""The pipeline: stage runner, report, smoke run and shared plots."""
