"""llama.cpp's one registry line (`engines.registry`)."""

from eagle3lab.engines.base import EngineEntry
from eagle3lab.engines.llamacpp import launch_line, probe, rules
from eagle3lab.engines.llamacpp.fields import FIELDS
from eagle3lab.engines.llamacpp.server import LlamaCpp

ENTRY = EngineEntry.of("llamacpp", "llama.cpp", launch_line, probe, FIELDS, server=LlamaCpp, files=rules.gguf_pair)
