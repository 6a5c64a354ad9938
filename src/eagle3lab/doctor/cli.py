"""`eagle3lab doctor`: catch a silently bypassed EAGLE-3 draft before launch (launch line, draft, target) and after
(a running SGLang server's accept length).

SGLang serves an EAGLE-3 draft under `--speculative-algorithm EAGLE` without any error: the target hands over its
final hidden state (width H) instead of three concatenated aux states (3H), the draft skips `fc` because the width
already equals its own, and every draft token is rejected (accept length 1.0). Each check turns one such silent
mismatch into a finding with evidence and a concrete corrected flag.
"""

from __future__ import annotations

import argparse
import sys

from eagle3lab.doctor.diagnosis import diagnose
from eagle3lab.doctor.probe import ACCEPT_LOW


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eagle3lab doctor",
        description="Check an SGLang launch line, an EAGLE-3 draft, its target and a running server for a silently "
        "unused draft. Exit 0: no errors; 1: errors; 2: bad usage.",
    )
    parser.add_argument(
        "--launch", help='the server command, quoted: "python -m sglang.launch_server --model-path ..."'
    )
    parser.add_argument("--draft", help="draft checkpoint folder (config.json + weights)")
    parser.add_argument("--target", help="target: a folder with config.json, the embedded id, or a cached hub id")
    parser.add_argument("--server", help="URL of a running server, e.g. http://127.0.0.1:30000")
    parser.add_argument("--probes", type=int, default=3, help="probe requests sent to --server (0: none; default 3)")
    parser.add_argument("--probe-tokens", type=int, default=64, help="max new tokens per probe (default 64)")
    parser.add_argument("--timeout", type=float, default=30.0, help="HTTP timeout in seconds (default 30)")
    parser.add_argument(
        "--low-accept",
        type=float,
        default=ACCEPT_LOW,
        help=f"accept length below this is a weak-draft warning (default {ACCEPT_LOW})",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage, 0 on --help
        return int(e.code or 0)
    if not any((args.launch, args.draft, args.target, args.server)):
        parser.print_usage(sys.stderr)
        print("eagle3lab doctor: give at least one of --launch, --draft, --target, --server", file=sys.stderr)
        return 2
    if args.probes < 0 or args.probe_tokens < 1 or args.timeout <= 0:
        print("eagle3lab doctor: --probes >= 0, --probe-tokens >= 1 and --timeout > 0 are required", file=sys.stderr)
        return 2
    report = diagnose(
        launch=args.launch,
        draft=args.draft,
        target=args.target,
        server=args.server,
        probes=args.probes,
        probe_tokens=args.probe_tokens,
        timeout=args.timeout,
        low_accept=args.low_accept,
    )
    print(report.to_json() if args.json else report.render())
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
