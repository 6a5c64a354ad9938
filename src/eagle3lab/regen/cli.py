"""`eagle3lab regen`: regenerate the assistant turns of a ShareGPT-style JSONL with the target; `eagle3lab regen bench`
measures regeneration throughput; `eagle3lab regen onpolicy` compares llama.cpp's bf16 answers with the HF target's.

    eagle3lab regen --backend local --input IN.jsonl --output OUT.jsonl [--resume] [--device auto|cpu|cuda[:N]]
    eagle3lab regen --backend openai --server-address HOST:PORT ... --input IN.jsonl --output OUT.jsonl
    eagle3lab regen --backend llamacpp --concurrency SLOTS --max-context PER_SLOT --input IN.jsonl --output OUT.jsonl
    eagle3lab regen bench [--device ...] [--engines batching continuous]
    eagle3lab regen onpolicy [--n 64] [--max-new-tokens 256]

Output is appended record by record; --resume continues a killed run; errors and skipped inputs get their own files
beside OUT, and every run ends by checking success + error + skipped = input. Exit status: 0 every input accounted
for and some regenerated; 1 errors, an aborted run or an accounting mismatch (rerun with --resume); 2 bad arguments
or input, or nothing regenerated (an empty input, every record skipped or failed: the first reasons are printed); 3
no server reachable.
"""

from __future__ import annotations

import argparse
import signal
import sys

from eagle3lab.io import command
from eagle3lab.options import add_options, from_options
from eagle3lab.regen.errors import NoServerError
from eagle3lab.regen.run import regenerate
from eagle3lab.regen.settings import RegenSettings

EXIT_OK, EXIT_INCOMPLETE, EXIT_NO_SERVER = 0, 1, 3  # bad input: 2 (eagle3lab.io.command)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eagle3lab regen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--input", required=True, help="ShareGPT-style JSONL ({id, conversations:[{role, content}]})")
    p.add_argument("--output", required=True, help="output JSONL; errors/skipped/progress files sit beside it")
    add_options(p, RegenSettings)
    return p


@command("eagle3lab regen")
def main(argv: list[str] | None = None) -> int:
    # SIGTERM (kill, a cancelled job) unwinds like Ctrl-C, so a llama-server the command started is stopped, not
    # orphaned; the previous handler comes back after (tests call main in-process)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str]) -> int:
    if argv and argv[0] in ("bench", "onpolicy"):
        from eagle3lab.regen import bench, onpolicy

        return (bench if argv[0] == "bench" else onpolicy).main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        result = regenerate(args.input, args.output, from_options(args, RegenSettings))
    except NoServerError as e:  # its own exit status: a run to retry once a server is up, not bad input
        print(f"eagle3lab regen: {e}", file=sys.stderr)
        return EXIT_NO_SERVER
    return EXIT_OK if result.accounting.ok and not result.accounting.errors and not result.aborted else EXIT_INCOMPLETE


if __name__ == "__main__":
    sys.exit(main())
