"""The launch doctor: is an EAGLE-3 draft actually used as launched?"""
