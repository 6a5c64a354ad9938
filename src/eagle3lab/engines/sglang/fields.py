"""The draft config.json fields sglang reads."""

from eagle3lab.engines.base import DraftField

FIELDS: tuple[DraftField, ...] = ()
