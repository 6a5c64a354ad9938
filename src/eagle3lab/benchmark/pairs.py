"""The grid's controlled pairs (issue 64): each original-answer and T=0.7 draft cell against the regenerated draft it
is matched to (its record's `matched_to`: the original answers at that draft's answer tokens, the same prompts
answered at T=0.7), all seeds of both, each trained to its plateau. So the pair is controlled for the answer tokens
trained on and the stop rule, not for the optimizer steps, which each side's plateau decides: the row keeps both
sides' steps so a reader sees how far they differ.

The difference is stage 05's paired one (`comparisons.paired_comparisons`: prompt by prompt, the interval resampling
the prompts and each side's seeds), read under every bootstrap seed: `shown` or `not shown` where all seeds agree,
`borderline` where the verdict depends on the bootstrap seed.
"""

from __future__ import annotations

import pandas as pd

from eagle3lab.benchmark.comparisons import paired_comparisons, replicates

PAIRED_RESPONSES = ("original", "sampled")  # the kinds of answers a grid cell is paired on
CONTROLLED = "equal answer tokens, each side at its plateau"  # what a pair holds equal (its steps are recorded)


def controlled_pairs(records: list[dict], *, boot: int, seeds: list[int]) -> dict:
    """`rows`: per pair and set, both means, the difference with its interval (the first bootstrap seed's), its
    verdict under every seed, and each side's steps; `waiting`: the pairs left out and why (a partner not yet run)."""
    per_prompt = pd.DataFrame(
        [
            {"set": row["set"], "id": row["id"], "system": record["name"], "accept_length": row["accept_length"]}
            for record in records
            for row in record["acceptance"]["per_prompt"]
        ],
        columns=["set", "id", "system", "accept_length"],
    )
    drafts = {record["name"]: record for record in records}
    runs = [paired_comparisons(per_prompt, drafts, boot=boot, seed=seed) for seed in seeds]
    rows, waiting = runs[0]
    seeds_of = replicates(drafts)
    for row, *others in zip(rows, *(other for other, _ in runs[1:])):
        said = {row["verdict"], *(other["verdict"] for other in others)}
        row["verdict"] = said.pop() if len(said) == 1 else "borderline"
        for side, name in (("steps", row["draft"]), ("partner_steps", row["partner"])):
            row[side] = [drafts[n]["training"]["steps"] for n in seeds_of[name]]
        row["controlled"] = CONTROLLED
    return {"rows": rows, "waiting": waiting}
