"""The doctor's output: a finding (check id, severity, evidence, a concrete fix) and the report that renders them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

ERROR, WARNING, OK = "error", "warning", "ok"
_RANK = {ERROR: 0, WARNING: 1, OK: 2}


@dataclass
class Finding:
    # stable id: launch, algorithm, aux_layers, draft_vocab, context_length, spec_params, draft, target, server,
    # gguf (llama.cpp's draft vs target GGUF), dflash_config and dflash_target (a DFlash draft's), metrics, ...
    check: str
    severity: str  # error | warning | ok
    title: str
    evidence: list[str] = field(default_factory=list)
    fix: str | None = None  # a concrete corrected flag or command


@dataclass
class Report:
    findings: list[Finding]
    inputs: dict[str, Any]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def by_check(self, check: str) -> list[Finding]:
        return [f for f in self.findings if f.check == check]

    def summary(self) -> dict[str, int]:
        return {s: sum(f.severity == s for f in self.findings) for s in (ERROR, WARNING, OK)}

    def to_dict(self) -> dict:
        return {
            "exit_code": self.exit_code,
            "summary": self.summary(),
            "inputs": self.inputs,
            "findings": [asdict(f) for f in self.findings],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def render(self) -> str:
        s = self.summary()
        lines = [f"eagle3lab doctor: {s[ERROR]} error(s), {s[WARNING]} warning(s), {s[OK]} ok"]
        for key, value in self.inputs.items():
            if value is not None:
                lines.append(f"  {key}: {value}")
        for f in sorted(self.findings, key=lambda f: _RANK[f.severity]):
            lines.append("")
            lines.append(f"{f.severity.upper():<8}[{f.check}] {f.title}")
            for e in f.evidence:
                lines.append(f"          {e}")
            if f.fix:
                first, *rest = f.fix.splitlines()
                lines.append(f"  fix:    {first}")
                lines.extend(f"          {r}" for r in rest)
        launched = self.inputs.get("launch") or self.inputs.get("server")
        verdict = (
            "no errors"
            if not self.errors
            else "errors found: the draft is not (fully) used as launched"
            if launched
            else "errors found in the draft or target given"  # no launch line or server: nothing was launched
        )
        lines += ["", f"exit {self.exit_code}: {verdict}"]
        return "\n".join(lines)
