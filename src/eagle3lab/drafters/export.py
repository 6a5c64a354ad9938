"""`eagle3lab export DRAFT`: a draft folder of any kind as the GGUF llama.cpp serves (its kind's export, through
llama.cpp's own converter), checked against the target."""

from __future__ import annotations

import argparse
import sys

from eagle3lab.drafters.tools import tools_of
from eagle3lab.io import command, folder_argument
from eagle3lab.models.target import DEFAULT_TARGET


@command("eagle3lab export")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eagle3lab export",
        description="Convert a draft folder of any drafter kind (an EAGLE-3 draft in SGLang's format, a DFlash one in "
        "z-lab's) to a bf16 GGUF for llama.cpp with llama.cpp's own convert_hf_to_gguf.py (from the pinned source "
        "tree `make llamacpp` keeps), and check it against the target's GGUF with the rules the doctor uses; a draft "
        "that does not fit is deleted and the export exits 2.",
    )
    parser.add_argument("draft", metavar="DRAFT", help="draft folder (its config.json says its kind)")
    parser.add_argument("--format", choices=("gguf",), default="gguf", help="what to write (llama.cpp's GGUF)")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="the target the draft serves (an embedded spec)")
    parser.add_argument("--out", help="output file (default: beside the draft folder, DRAFT.gguf)")
    args = parser.parse_args(argv)
    folder_argument(args.draft, "DRAFT")
    print(tools_of(args.draft).export_gguf(args.draft, args.target, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
