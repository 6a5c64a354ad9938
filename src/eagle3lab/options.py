"""Command-line options generated from a settings dataclass, so the dataclass is the one home of every default
and its help text (`eagle3lab regen`, `regen bench`, `train`, `tune`, `bench`, `doctor`).

    @dataclass
    class Settings:
        data: str = option(help="input file")                      # no default: a required option
        epochs: int = option(3, "passes over the data")
        servers: list[str] = option(("a:1",), "servers", flag="--server", group="openai backend")
        sets: list[str] = option(("x",), "comma-separated", type=split, exclusive="source")  # one string, split
        prompts: str | None = option(None, "a file instead of --sets", exclusive="source")  # at most one of the two

The option's type comes from the annotation (int, float, str, bool, list[...], each optionally `| None`) unless
`type=` is given; bool fields become switches (`--no-NAME` when on by default); list fields take several values
(or, with `type=`, one value that type turns into the list); fields of one `exclusive` name exclude each other.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import MISSING, Field, field, fields

_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


def option(default=MISSING, help: str = "", **cli):
    """A dataclass field with its command-line help; `cli` may set flag, type, choices, metavar, group, exclusive."""
    return field(default=default, metadata={"help": help, **cli})


def _annotation(f: Field) -> tuple[str, bool]:
    """(scalar type name, is a list) of a field's annotation, `| None` ignored."""
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    text = text.replace(" | None", "").replace("None | ", "").strip()
    listed = re.fullmatch(r"(?:list|tuple)\[(\w+)(?:, \.\.\.)?\]", text)
    return (listed.group(1), True) if listed else (text, False)


def add_options(parser: argparse.ArgumentParser, cls) -> None:
    """One option per field of dataclass `cls`; its default is the field's own."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for f in fields(cls):
        meta = f.metadata
        where = parser
        if "group" in meta:
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_argument_group(meta["group"])
            where = groups[meta["group"]]
        if "exclusive" in meta:
            if meta["exclusive"] not in exclusive:
                exclusive[meta["exclusive"]] = where.add_mutually_exclusive_group()
            where = exclusive[meta["exclusive"]]
        name, listed = _annotation(f)
        required = f.default is MISSING and f.default_factory is MISSING
        switch_off = name == "bool" and f.default is True
        flag = meta.get("flag") or "--" + ("no-" if switch_off else "") + f.name.replace("_", "-")
        quiet = required or listed or name == "bool" or f.default is None
        kw = {"dest": f.name, "help": meta.get("help", "") + ("" if quiet else f" (default {f.default})")}
        if name == "bool":
            kw["action"] = "store_false" if switch_off else "store_true"
        elif listed and "type" not in meta:  # None when absent, so from_options keeps the field's default
            kw.update(action="extend", nargs="+", type=_SCALARS[name], metavar=meta.get("metavar"), default=None)
        else:
            kw.update(type=meta.get("type", _SCALARS.get(name)), choices=meta.get("choices"))
            kw.update(metavar=meta.get("metavar"), **({"required": True} if required else {"default": f.default}))
        where.add_argument(flag, **kw)


def from_options(args: argparse.Namespace, cls):
    """An instance of `cls` from parsed options; a list option left out keeps the field's default."""
    values = {f.name: getattr(args, f.name) for f in fields(cls)}
    return cls(**{k: v for k, v in values.items() if v is not None or k not in _list_fields(cls)})


def _list_fields(cls) -> set[str]:
    return {f.name for f in fields(cls) if _annotation(f)[1] and "type" not in f.metadata}
