"""SGLang on GPUs from a params profile: print the launch command, or benchmark a running server or one server
launched per config (doctor first) through eagle3lab.engines.sglang.bench.

    python -m eagle3lab.engines.sglang.cli launch-command --params params/gpu-llama3-8b.yaml [--config 1,3,1,4]
    python -m eagle3lab.engines.sglang.cli bench --params params/gpu-llama3-8b.yaml --launch   # one server per config
    python -m eagle3lab.engines.sglang.cli bench --params params/gpu-llama3-8b.yaml --url http://127.0.0.1:30000
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import httpx

from eagle3lab.engines.sglang.bench import add_speedups, bench_server
from eagle3lab.engines.sglang.launch import BASELINE_CONFIG, command_for_config, parse_config
from eagle3lab.io import InputError, command, write_json
from eagle3lab.serving.client import ServerError
from eagle3lab.serving.processes import start_server


def format_rows(rows: list[dict]) -> str:
    from eagle3lab.benchmark.table import SGLANG_COLUMNS, render_rows

    return render_rows(rows, SGLANG_COLUMNS, details=False)


# ---- CLI: reads the GPU params profile ---------------------------------------------------------------------------

SETTINGS_KEYS = (
    "host",
    "port",
    "tp",
    "mem_fraction",
    "context_length",
    "cuda_graph_max_bs",
    "algorithm",
    "draft_path",
    "steps",
    "topk",
    "num_draft_tokens",
    "startup_timeout",
    "log_dir",
    "extra",
)


def load_profile(path: str | os.PathLike) -> tuple[str, dict, dict]:
    """(target, sglang settings, benchmark section) from a params file with an `sglang:` section."""
    from eagle3lab.pipeline.stages import StageError, load_params

    try:
        params = load_params(Path(path))
    except StageError as e:
        raise InputError(str(e)) from None
    settings = params.get("sglang")
    if not isinstance(settings, dict):
        raise InputError(f"{path}: no section 'sglang' (server settings); see params/gpu-llama3-8b.yaml")
    missing = [k for k in SETTINGS_KEYS if k not in settings]
    unknown = [k for k in settings if k not in SETTINGS_KEYS]
    if missing or unknown:
        raise InputError(f"{path}: section 'sglang': missing key(s) {missing}, unknown key(s) {unknown}")
    target = (params.get("common") or {}).get("target")
    if not target:
        raise InputError(f"{path}: section 'common' has no 'target'")
    return target, settings, params.get("benchmark") or {}


def _default_config(settings: dict) -> str:
    return f"1,{settings['steps']},{settings['topk']},{settings['num_draft_tokens']}"


def _doctor_ok(cmd: list[str]) -> bool:
    from eagle3lab.doctor.diagnosis import diagnose

    report = diagnose(launch=cmd)
    print(report.render())
    return report.exit_code == 0


def _bench_prompts(target: str, bench_params: dict, limit: int | None):
    from transformers import AutoTokenizer

    from eagle3lab.benchmark.prompts import load_prompts

    tokenizer = AutoTokenizer.from_pretrained(target)
    return load_prompts(
        tokenizer,
        bench_params.get("sets") or ["mtbench"],
        None,
        limit if limit is not None else bench_params.get("limit"),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3lab.engines.sglang.cli",
        description="Run SGLang on GPUs from a params profile: print its launch command, or benchmark a running "
        "server or one server launched per config (the doctor checks each drafting launch line first).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    lc = sub.add_parser(
        "launch-command",
        help="print the SGLang launch command of a params profile",
        description="Print the SGLang launch command of a params profile's `sglang:` section, for its own draft shape "
        "or the one --config gives (1,0,0,0: the target alone, no draft).",
    )
    lc.add_argument("--params", type=Path, required=True, help="params file with an `sglang:` section")
    lc.add_argument(
        "--config", help="batch,steps,topk,ndraft (default: the profile's steps/topk/ndraft; 1,0,0,0 = no draft)"
    )
    b = sub.add_parser(
        "bench",
        help="benchmark an SGLang server (or one launched per config) on the eval sets",
        description="Benchmark SGLang on the profile's evaluation sets: a running server (--url) as one config, or "
        "one server launched per config (--launch, each drafting launch line checked by the doctor first), with "
        "tokens/s and speedups against the target alone (config 1,0,0,0).",
    )
    b.add_argument("--params", type=Path, required=True)
    where = b.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:30000 (benchmarked as --config)")
    where.add_argument("--launch", action="store_true", help="start one server per benchmark config, doctor first")
    b.add_argument("--config", help="the running server's config label (default: the profile's)")
    b.add_argument("--configs", nargs="+", help="with --launch: configs (default: the profile's benchmark.configs)")
    b.add_argument("--limit", type=int, help="prompts per set (default: benchmark.limit)")
    b.add_argument("--skip-doctor", action="store_true", help="launch even when the doctor finds errors")
    b.add_argument("--output", type=Path, help="write the JSON result here")
    return parser


@command("eagle3lab sglang")
def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        target, settings, bench_params = load_profile(args.params)
        if args.command == "launch-command":
            print(shlex.join(command_for_config(settings, target, args.config or _default_config(settings))))
            return 0
        prompts = _bench_prompts(target, bench_params, args.limit)
        max_new = bench_params.get("max_new_tokens", 256)
        url = f"http://{settings['host']}:{settings['port']}"
        result = {"meta": {"target": target, "params": str(args.params)}, "rows": [], "per_prompt": [], "servers": []}
        if args.url:
            config = args.config or _default_config(settings)
            runs = [(config, None)]
            url = args.url
        else:
            runs = [
                (c, command_for_config(settings, target, c, python=sys.executable))
                for c in (args.configs or bench_params.get("configs") or [BASELINE_CONFIG, _default_config(settings)])
            ]
        for config, cmd in runs:
            bs, steps, *_ = parse_config(config)
            draft = settings["draft_path"] if steps else None
            system = "sglang-eagle3" if steps else "sglang-baseline"
            if cmd is None:
                part = bench_server(url, prompts, max_new, bs, system=system, config=config, draft=draft, model=target)
            else:
                if steps and not args.skip_doctor and not _doctor_ok(cmd):
                    print(
                        f"doctor found errors in the launch line for config {config}; fix them or --skip-doctor",
                        file=sys.stderr,
                    )
                    return 1
                log = Path(settings["log_dir"]) / f"sglang-{config.replace(',', '_')}.log"
                print(f"starting: {shlex.join(cmd)} (log {log})", flush=True)
                with start_server(cmd, url, settings["startup_timeout"], log_path=log) as server:
                    part = bench_server(
                        url, prompts, max_new, bs, system=system, config=config, draft=draft, model=target
                    )
                    result["servers"].append(
                        {"config": config, "command": cmd, "startup_s": server.started_s, "server_info": server.info}
                    )
            result["rows"] += part["rows"]
            result["per_prompt"] += part["per_prompt"]
            result["meta"].setdefault("runs", []).append(part["meta"])
        add_speedups(result["rows"])
    except httpx.HTTPError as e:  # a server that stopped answering: a failed run, as a ServerError is
        raise ServerError(f"{url}: {e.__class__.__name__}: {e}") from None
    print(format_rows(result["rows"]))
    if args.output:
        write_json(args.output, result)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
