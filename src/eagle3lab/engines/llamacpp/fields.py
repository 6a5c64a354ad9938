"""The draft config.json fields llamacpp reads."""

from eagle3lab.engines.base import DraftField

FIELDS: tuple[DraftField, ...] = ()
