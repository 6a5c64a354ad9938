"""Draft training: tokenized conversations, target features, the training-time-test objective and loop."""
