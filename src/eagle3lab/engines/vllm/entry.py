"""vLLM's one registry line (`engines.registry`)."""

from eagle3lab.engines.base import EngineEntry
from eagle3lab.engines.vllm import launch_line, probe
from eagle3lab.engines.vllm.fields import FIELDS
from eagle3lab.engines.vllm.server import VLLM

ENTRY = EngineEntry.of("vllm", "vLLM", launch_line, probe, FIELDS, server=VLLM)
