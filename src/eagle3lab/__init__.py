"""eagle3lab: make EAGLE-3 speculative decoding pay off, reproducibly."""

__version__ = "0.1.0"
