"""SGLang's one registry line (`engines.registry`)."""

from eagle3lab.engines.base import EngineEntry
from eagle3lab.engines.sglang import launch_line, probe
from eagle3lab.engines.sglang.fields import FIELDS

ENTRY = EngineEntry.of("sglang", "SGLang", launch_line, probe, FIELDS)
