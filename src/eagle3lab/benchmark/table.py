"""The one text renderer for benchmark rows: `eagle3lab bench`, `eagle3lab sglang bench` and `eagle3lab tune` print
their rows (one per set, system and config) through it, each choosing its columns."""

from __future__ import annotations

from dataclasses import dataclass

DO_NOT_SPECULATE = "do not speculate"  # tune's decision where no shape beats the baseline


@dataclass(frozen=True)
class Column:
    header: str
    key: str
    width: int
    fmt: str = ""  # format spec for numbers; "" = text, cut to width
    left: bool = False

    def cell(self, row: dict) -> str:
        value = row.get(self.key)
        if value is None:
            text = "-"
        elif self.fmt:
            text = format(value, self.fmt)
        else:
            text = str(value)[: self.width]
        return f"{text:<{self.width}}" if self.left else f"{text:>{self.width}}"

    def head(self) -> str:
        return f"{self.header:<{self.width}}" if self.left else f"{self.header:>{self.width}}"


KEY = [Column("set", "set", 10, left=True), Column("system", "system", 32, left=True)]  # fits "<draft> [EAGLE]"
CONFIG = Column("config", "config", 9, left=True)
ACCEPT = Column("accept", "accept_length", 6, ".2f")
TOKENS_PER_S = Column("tok/s", "tokens_per_s", 7, ".1f")
X_BASE = Column("x base", "speedup_vs_baseline", 6, ".2f")

BENCH_COLUMNS = (
    *KEY,
    CONFIG,
    ACCEPT,
    TOKENS_PER_S,
    X_BASE,
    Column("x HF", "speedup_vs_hf_generate", 6, ".2f"),
    Column("ident", "identical_rate", 5, ".2f"),
)
SGLANG_COLUMNS = (
    Column("set", "set", 10, left=True),
    Column("system", "system", 16, left=True),
    CONFIG,
    ACCEPT,
    TOKENS_PER_S,
    Column("thru", "throughput_tok_s", 8, ".1f"),
    X_BASE,
)


def _details(row: dict, indent: str) -> list[str]:
    """Lines under a row: per-position acceptance, the time split of a draft's run, the first divergences."""
    lines = []
    if row.get("position_acceptance"):
        lines.append(f"{indent}per-position acceptance " + " ".join(f"{a:.2f}" for a in row["position_acceptance"]))
    if row.get("time_split") and row.get("draft"):
        lines.append(f"{indent}time: " + ", ".join(f"{k} {v:.0%}" for k, v in row["time_split"].items()))
    for d in (row.get("divergences") or [])[:3]:
        lines.append(f"{indent}diverges on {d['id']} at token {d['index']}, logit gap {d['logit_gap']:.3g}")
    return lines


def render_rows(rows: list[dict], columns=BENCH_COLUMNS, details: bool = True) -> str:
    """A fixed-width table, one line per row (plus detail lines for rows that carry them)."""
    header = " ".join(c.head() for c in columns)
    indent = " " * (columns[0].width + columns[1].width + 2)
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(" ".join(c.cell(row) for c in columns))
        if details:
            lines += _details(row, indent)
    return "\n".join(lines)
