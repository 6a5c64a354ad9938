"""`eagle3lab serve`: start the target with a draft in a real serving engine on loopback, print the launch line and
the URL, and serve until interrupted (the engine's whole process group stops with it).

    eagle3lab serve --engine vllm --draft drafts/smollm2-original-6960 --k 2
    eagle3lab serve --engine vllm --draft drafts/smollm2-original-6960 --k 2 --print-only   # the line, no server
    eagle3lab serve --engine llamacpp --draft drafts/smollm2-original-6960 --k 2 --p-min 0.5
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass

from eagle3lab.benchmark.engine_choice import ENGINES, make_engine
from eagle3lab.io import command
from eagle3lab.models.target import DEFAULT_TARGET
from eagle3lab.options import add_options, from_options, option
from eagle3lab.serving.processes import free_port


@dataclass
class ServeSettings:
    """Every `serve` option (the CLI is generated from these fields)."""

    engine: str = option("vllm", "the serving engine", choices=ENGINES[1:])
    target: str = option(DEFAULT_TARGET, "target spec or model folder")
    draft: str | None = option(None, "draft folder (SGLang/SpecForge format); none: the target alone")
    k: int = option(2, "draft tokens per round (with --draft)")
    p_min: float = option(0.0, "llamacpp: stop a round's draft below this draft probability (--spec-draft-p-min)")
    port: int | None = option(None, "port on 127.0.0.1 (default: a free one)")
    dtype: str = option("bfloat16", "model dtype", choices=("float32", "bfloat16", "float16"))
    eager: bool = option(False, "vllm: --enforce-eager instead of compiling")
    device: str = option("cpu", "cpu or cuda: which build of the engine")
    print_only: bool = option(False, "print the launch line and exit")


@command("eagle3lab serve")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eagle3lab serve", description=__doc__.split("\n\n")[0])
    add_options(parser, ServeSettings)
    settings = from_options(parser.parse_args(argv), ServeSettings)
    try:
        engine = make_engine(settings)
        k = settings.k if settings.draft else 0
        port = settings.port or free_port()
        command = engine.launch_command(
            engine.model(settings.target), port=port, draft=settings.draft, k=k, threshold=settings.p_min
        )
        print(shlex.join(command), flush=True)
        if settings.print_only:
            return 0
        with engine.serve(command) as server:
            print(f"serving at {server.url} (started in {server.started_s:.0f} s; log {server.log_path}); Ctrl-C stops")
            while server.process.poll() is None:
                time.sleep(1.0)
            print(f"the server exited with code {server.process.returncode}; log {server.log_path}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0
