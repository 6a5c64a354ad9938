"""`eagle3lab doctor`: catch a silently bypassed EAGLE-3 draft before launch (an SGLang, vLLM or llama-server launch
line, draft, target) and after (a running server's accept length: SGLang's /server_info and meta_info, vLLM's /metrics
counters, llama-server's /slots and its responses' timings).

SGLang serves an EAGLE-3 draft under `--speculative-algorithm EAGLE` without any error: the target hands over its
final hidden state (width H) instead of three concatenated aux states (3H), the draft skips `fc` because the width
already equals its own, and every draft token is rejected (accept length 1.0). Each check turns one such silent
mismatch into a finding with evidence and a concrete corrected flag. vLLM has its own silent cases (a draft without
d2t, top-level aux layer ids other than the trained ones, no "method" in --speculative-config, an architecture name
that builds another family's class); the same checks catch them, and fixes come in vLLM's syntax. llama.cpp's own
(--spec-type draft-simple or none, a GGUF reading other target layers than the trained ones, p-min / n-min settings
under which no round drafts) are checked on the draft and target GGUFs and the llama-server line (doctor.llamacpp).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from eagle3lab.doctor.diagnosis import DoctorSettings, diagnose
from eagle3lab.io import command
from eagle3lab.options import add_options, from_options


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3lab doctor",
        description="Check an SGLang, vLLM or llama-server launch line, an EAGLE-3 draft (folder or GGUF), its target "
        "and a running SGLang, vLLM or llama.cpp server for a silently unused draft. Exit 0: no errors; 1: errors (the "
        "draft cannot work as launched, an option the engine refuses, a named path with nothing at it); 2: bad usage "
        "(no input, a launch line that is blank, not shell syntax or names no model).",
    )
    add_options(parser, DoctorSettings)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


@command("eagle3lab doctor")
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage, 0 on --help
        return int(e.code or 0)
    settings = from_options(args, DoctorSettings)
    if settings.launch is None and not any((settings.draft, settings.target, settings.server)):
        parser.print_usage(sys.stderr)
        print("eagle3lab doctor: give at least one of --launch, --draft, --target, --server", file=sys.stderr)
        return 2
    if settings.probes < 0 or settings.probe_tokens < 1 or settings.timeout <= 0:
        print("eagle3lab doctor: --probes >= 0, --probe-tokens >= 1 and --timeout > 0 are required", file=sys.stderr)
        return 2
    report = diagnose(**asdict(settings))
    print(report.to_json() if args.json else report.render())
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
