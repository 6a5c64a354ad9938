"""SGLang's one registry line (`engines.registry`)."""

from eagle3lab.engines.base import EngineEntry
from eagle3lab.engines.sglang import launch_line, probe
from eagle3lab.engines.sglang.fields import FIELDS

ENTRY = EngineEntry(
    name="sglang",
    title="SGLang",
    reads=launch_line.reads,
    read_launch=launch_line.read_launch,
    check_server=probe.check_server,
    fields=FIELDS,
)
