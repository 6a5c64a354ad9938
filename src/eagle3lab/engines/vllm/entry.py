"""vLLM's one registry line (`engines.registry`)."""

from eagle3lab.engines.base import EngineEntry
from eagle3lab.engines.vllm import launch_line, probe
from eagle3lab.engines.vllm.fields import FIELDS
from eagle3lab.engines.vllm.server import VLLM

ENTRY = EngineEntry(
    name="vllm",
    title="vLLM",
    reads=launch_line.reads,
    read_launch=launch_line.read_launch,
    check_server=probe.check_server,
    fields=FIELDS,
    server=VLLM,
)
