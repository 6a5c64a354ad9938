"""`eagle3lab generate`: one prompt decoded greedily with a draft of either kind in the local engine (its kind's
`DrafterTools.local_engine`), checked token for token against plain greedy decoding of the same target: a quick look
at a draft's rounds and at the engine's losslessness. Exit 1 when the two outputs differ."""

from __future__ import annotations

import argparse
import json

import torch

from eagle3lab.io import command


@command("eagle3lab generate")
def main(argv=None) -> int:
    from eagle3lab.benchmark.prompts import encode_chat
    from eagle3lab.benchmark.systems import check_draft_folders, eos_ids
    from eagle3lab.cli import COMMANDS
    from eagle3lab.decoding.engine import generate
    from eagle3lab.drafters.tools import tools_of
    from eagle3lab.models.target import DEFAULT_TARGET, load_target

    parser = argparse.ArgumentParser(
        prog="eagle3lab generate",
        description=COMMANDS["generate"][2]
        + " An EAGLE-3 draft drafts a chain (bench's first drafting shape), a DFlash draft its whole block; the target "
        "runs in float32. It prints the decoding's summary (rounds, accept length, times) and the text, and exits 1 "
        "when the output differs from plain greedy decoding's.",
    )
    parser.add_argument("draft", metavar="DRAFT", help="draft folder of either kind")
    parser.add_argument("prompt", help="a user message")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="target spec, model folder or HF id")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated")
    args = parser.parse_args(argv)
    (folder,) = check_draft_folders([args.draft], "DRAFT")  # before the target loads
    target = load_target(args.target, dtype=torch.float32)
    prompt = encode_chat(target.tokenizer, [{"role": "user", "content": args.prompt}])
    eos = eos_ids(target)
    out = tools_of(folder).local_engine(target, folder, eos).generate(prompt, args.max_new_tokens)
    plain = generate(target.model, prompt, args.max_new_tokens, eos_token_ids=eos)
    identical = out.tokens == plain.tokens
    print(json.dumps({**out.summary(), "identical_to_greedy": identical}, indent=1))
    print(target.tokenizer.decode(out.tokens))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
