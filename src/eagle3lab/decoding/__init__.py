"""Speculative decoding: the draft-shape rules and the engine (chain and tree, greedy and sampling)."""
