"""The models: the target (with aux hidden-state capture), the EAGLE-3 draft and its vocabulary."""
