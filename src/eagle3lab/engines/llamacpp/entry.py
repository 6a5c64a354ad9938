"""llama.cpp's one registry line (`engines.registry`)."""

from eagle3lab.engines.base import EngineEntry
from eagle3lab.engines.llamacpp import launch_line, probe, rules
from eagle3lab.engines.llamacpp.fields import FIELDS
from eagle3lab.engines.llamacpp.server import LlamaCpp

ENTRY = EngineEntry(
    name="llamacpp",
    title="llama.cpp",
    reads=launch_line.reads,
    read_launch=launch_line.read_launch,
    check_server=probe.check_server,
    fields=FIELDS,
    server=LlamaCpp,
    files=rules.gguf_pair,
)
