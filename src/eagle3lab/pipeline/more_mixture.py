"""`python -m eagle3lab.pipeline.more_mixture [--params P]`: the prompts that grow stage 01's mixture to
`answers.more.mixture_total` conversations (issue 66's ten times the data), for the `more_answers` cells to answer.

A larger `mixture_total` in stage 01 would redraw its val split (the split is a seeded hash over whatever was drawn),
so every draft would rerun and the held-out pick would change under the curve. Instead this stage draws the grown
mixture (stage 01's draw with the larger total and no val split) and keeps only the prompts the first mixture lacks.
Each source's draw is a prefix of its seeded walk, so the grown draw holds the first one; a grown source can take a
prompt that another source took first, so the prompts are matched by prompt key, not by id. The new prompts come out
in the draw's hashed order (`artifacts/more_mixture/train.jsonl`, a cached output that `mixture_restore` rebuilds
bitwise on a machine without it), and `metrics/more_mixture.json` accounts for them per source.
"""

from __future__ import annotations

import sys
from pathlib import Path

from eagle3lab import paths
from eagle3lab.data.survey import prompt_key_of
from eagle3lab.io import InputError, command, read_jsonl, write_json, write_jsonl
from eagle3lab.pipeline import mixture_restore
from eagle3lab.pipeline.stages import cell_arguments, load_params, section_at

STAGE = "more_mixture"
FOLDER = "artifacts/more_mixture"  # train.jsonl: the new prompts
RECORD = "metrics/more_mixture.json"
SECTION = ("answers", "more")  # params.yaml's answers.more: mixture_total, and the more_answers cells


def grown_total(params: dict, params_file: Path) -> int:
    """answers.more.mixture_total, checked: more than stage 01's mixture_total, or there is nothing to grow."""
    total = (section_at(params, SECTION) or {}).get("mixture_total")
    first = params[mixture_restore.STAGE]["mixture_total"]
    if not isinstance(total, int) or isinstance(total, bool) or total <= first:
        raise InputError(
            f"{params_file}: section '{'.'.join(SECTION)}': field 'mixture_total' must be a whole number above "
            f"{mixture_restore.STAGE}.mixture_total ({first}), got {total!r}"
        )
    return total


def first_keys(root: Path) -> set[str]:
    """The prompt keys of stage 01's mixture, both splits: none of them is drawn again."""
    keys = set()
    for split in ("train", "val"):
        path = root / mixture_restore.FOLDER / f"{split}.jsonl"
        if not path.exists():
            raise InputError(f"{path}: no such file: stage 01 (dataset_survey) writes it (or `mixture_restore`)")
        for number, row in enumerate(read_jsonl(path), 1):
            try:
                keys.add(prompt_key_of(row["conversations"]))
            except (KeyError, TypeError) as e:
                raise InputError(f"{path}: record {number}: field 'conversations': unreadable ({e!r})") from None
    return keys


def grow(params: dict, params_file: Path, root: Path) -> tuple[list[dict], dict]:
    """The new prompts (the grown draw less the first mixture's, in the draw's order) and their accounting."""
    total = grown_total(params, params_file)
    first = first_keys(root)
    grown = mixture_restore.draw(params, total=total, val_fraction=0.0)
    keys = [prompt_key_of(row["conversations"]) for row in grown.train]
    new = [row for row, key in zip(grown.train, keys, strict=True) if key not in first]
    kept_keys = set(keys)
    per_source = {
        name: {
            "quota": stats["quota"],
            "available": stats["available"],
            "selected": stats["selected"],
            "shortfall": stats["shortfall"],
            "new": sum(row["source"] == name for row in new),
        }
        for name, stats in grown.summary["sources"].items()
    }
    record = {
        "mixture_total": total,
        "first_prompts": len(first),
        "grown_prompts": len(grown.train),
        "new_prompts": len(new),
        # every prompt of the first mixture is in the grown draw (each source's draw is a prefix of its walk); a
        # prompt missing here would mean the draw changed under the first mixture
        "first_missing_from_grown": len(first - kept_keys),
        "sources": per_source,
        "eval_prompts_checked": grown.summary["eval_prompts_checked"],
        "reserved_prompts_checked": grown.summary["reserved_prompts_checked"],
        "seed": grown.summary["seed"],
    }
    return new, record


def build(params: dict, folder: Path, root: Path, params_file: Path | None = None) -> dict:
    """The new prompts written to `folder`/train.jsonl; returns their accounting."""
    new, record = grow(params, params_file or root / "params.yaml", root)
    if record["first_missing_from_grown"]:
        raise InputError(
            f"{root / mixture_restore.FOLDER}: {record['first_missing_from_grown']} of its prompts are not in the "
            f"grown draw: the data, params or draw differ from the ones that made it"
        )
    write_jsonl(folder / "train.jsonl", new)
    return record


def restore(root: Path = paths.ROOT, params_file: Path | None = None) -> Path:
    """artifacts/more_mixture rebuilt on a machine without it (stage 01's mixture first, if that is missing too), kept
    only where DVC's hash of it is dvc.lock's."""
    mixture_restore.restore(root, params_file)
    return mixture_restore.restore(root, params_file, STAGE, FOLDER, build)


@command("python -m eagle3lab.pipeline.more_mixture")
def main(argv: list[str] | None = None) -> int:
    args = cell_arguments(STAGE, __doc__, argv)
    record = build(load_params(args.params), paths.ROOT / FOLDER, paths.ROOT, args.params)
    write_json(paths.ROOT / RECORD, record)
    print(
        f"more_mixture: {record['new_prompts']} new prompts of {record['grown_prompts']} drawn at "
        f"{record['mixture_total']} ({record['first_prompts']} already in stage 01's mixture): {FOLDER}/train.jsonl"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
