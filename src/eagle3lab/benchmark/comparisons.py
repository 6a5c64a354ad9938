"""Stage 05's comparisons between drafts, each with a bootstrap interval over the evaluation prompts.

- Paired: an original-answer draft against the regenerated one it is matched to in target answer tokens, and the
  sampled (T=0.7) draft against its T=0 partner (train.json's `matched_to`): the difference in accept length prompt
  by prompt (paired by set and id), so what the prompts share cancels.
- Per source: a draft trained on one source's answers, its mean accept length against that source's on-policy score
  (the survey's NLL): the seeds' ranking criterion, tested by a rank correlation whose exact permutation p-value says
  how little a handful of points can show.
- Beside the curve: a draft trained elsewhere on regenerated answers against the pipeline's own draft nearest its
  size.
Input: the sweep's per-prompt rows (set, id, system, accept_length; one config: stage 04's exact offline acceptance
on the evaluation set) and train.json's draft records.

Training seeds: a draft trained again with another seed (train.json's `replicate_of`) is one more replicate of it, and
every interval resamples both units that vary, the prompts (shared by the two sides of a paired difference) and each
side's seeds. A difference is "shown" only where its interval excludes zero; with one seed a side the interval holds
prompt noise only, and the row says so (`seeds`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
from scipy.stats import rankdata, spearmanr

from eagle3lab.benchmark.scaling import LEVEL, quantiles

ALL_SETS = "all sets"  # the row over every prompt of every set
# compared with the regenerated (T=0) EAGLE-3 draft they are matched to
PAIRED = ("original", "sampled", "ablation", "dflash")
DRAFT_FIELDS = ("records", "responses", "answer_tokens", "matched_to", "source", "replicate_of")
EXACT_UP_TO = 7  # points for which the rank correlation's p-value enumerates every permutation


def with_drafts(per_prompt: pd.DataFrame, drafts: dict[str, dict]) -> pd.DataFrame:
    """The per-prompt rows of the trained drafts, each with its training record's fields (None where a train.json
    written before issue 26 has no such field)."""
    rows = per_prompt[per_prompt.system.isin(drafts)].copy()
    for field in DRAFT_FIELDS:
        rows[field] = rows.system.map({name: draft.get(field) for name, draft in drafts.items()})
    return rows


def replicates(drafts: dict[str, dict]) -> dict[str, list[str]]:
    """Each draft that is not itself a replicate -> its seeds' systems (itself first)."""
    groups = {name: [name] for name, draft in drafts.items() if not draft.get("replicate_of")}
    for name, draft in drafts.items():
        if draft.get("replicate_of") in groups:
            groups[draft["replicate_of"]].append(name)
    return groups


ZERO = 1e-9  # an interval end this close to zero is zero (float noise of identical drafts, or of a flat fit)


def verdict(low, high) -> str:
    """'shown' where the interval excludes zero; 'not shown' otherwise (or without an interval)."""
    if low is None or high is None:
        return "not shown"
    return "shown" if low > ZERO or high < -ZERO else "not shown"


def seeds_and_prompts(a: np.ndarray, b: np.ndarray | None = None, *, boot: int, seed: int, level: float = LEVEL):
    """Mean of a [seeds, prompts] matrix, or of a minus b (two such matrices over the same prompts), with its
    bootstrap interval: each draw resamples the prompts (the same ones for both sides) and each side's seeds."""
    a = np.atleast_2d(np.asarray(a, dtype=float))
    b = None if b is None else np.atleast_2d(np.asarray(b, dtype=float))
    estimate = float(a.mean() - (b.mean() if b is not None else 0.0))
    n = a.shape[1]
    result = {
        "mean": estimate,
        "low": None,
        "high": None,
        "prompts": n,
        "seeds": [len(a)] + ([len(b)] if b is not None else []),
    }
    if not boot or n < 2:
        return result
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, n, (boot, n))

    def draws(m):
        rows = rng.integers(0, len(m), (boot, len(m)))
        return np.array([m[r][:, p].mean() for r, p in zip(rows, prompts)])

    values = draws(a) - (draws(b) if b is not None else 0.0)
    result["low"], result["high"] = quantiles(values, level)
    return result


def bootstrap_mean(per_prompt: pd.DataFrame, systems: list[str], *, boot: int, seed: int) -> dict:
    """Accept length of one draft's seeds (`systems`) over the prompts all of them ran, with its interval."""
    matrix = per_prompt[per_prompt.system.isin(systems)].pivot_table(
        index=["set", "id"], columns="system", values="accept_length"
    )
    matrix = matrix.dropna()
    return seeds_and_prompts(matrix.T.values, boot=boot, seed=seed)


def paired_difference(
    per_prompt: pd.DataFrame, draft: list[str] | str, partner: list[str] | str, *, boot: int, seed: int
) -> dict | None:
    """`draft` minus `partner` in accept length over the prompts every seed of both ran (paired by set and id): both
    means and the difference with its interval over prompts and seeds, and its verdict; None when they share no
    prompt. Each side is a system or the list of its seeds' systems."""
    mine, theirs = [draft] if isinstance(draft, str) else draft, [partner] if isinstance(partner, str) else partner
    rows = per_prompt[per_prompt.system.isin(mine + theirs)]
    pairs = rows.pivot_table(index=["set", "id"], columns="system", values="accept_length").dropna()
    if pairs.empty or not set(mine + theirs) <= set(pairs.columns):
        return None
    a, b = pairs[mine].T.values, pairs[theirs].T.values
    difference = seeds_and_prompts(a, b, boot=boot, seed=seed)
    return {"draft_accept": float(a.mean()), "partner_accept": float(b.mean())} | {
        "difference": difference["mean"],
        "low": difference["low"],
        "high": difference["high"],
        "prompts": difference["prompts"],
        "seeds": difference["seeds"],
        "verdict": verdict(difference["low"], difference["high"]),
    }


def by_set(per_prompt: pd.DataFrame):
    """(set, rows) over every prompt first, then set by set."""
    return [(ALL_SETS, per_prompt), *per_prompt.groupby("set")]


def paired_comparisons(per_prompt: pd.DataFrame, drafts: dict[str, dict], *, boot: int, seed: int):
    """Every original and sampled draft against its `matched_to` partner, over all prompts and set by set. Returns
    (rows, unmatched: one line per draft left out, saying why)."""
    rows, unmatched = [], []
    seeds = replicates(drafts)
    for name, draft in drafts.items():
        if draft.get("responses") not in PAIRED or draft.get("replicate_of"):
            continue
        partner = draft.get("matched_to")
        if not partner:
            unmatched.append(f"{name}: no `matched_to` in train.json (written before issue 26)")
            continue
        if partner not in drafts:
            unmatched.append(f"{name}: its partner {partner} is not among the trained drafts")
            continue
        for set_name, group in by_set(per_prompt):
            result = paired_difference(group, seeds[name], seeds.get(partner, [partner]), boot=boot, seed=seed)
            if result is None:
                unmatched.append(f"{name} ({set_name}): the sweep ran it and {partner} on no common prompt")
                continue
            rows.append(
                {
                    "draft": name,
                    "responses": draft["responses"],
                    "partner": partner,
                    "scale": drafts[partner]["records"],
                    "records": draft["records"],
                    "answer_tokens": draft.get("answer_tokens"),
                    "partner_answer_tokens": drafts[partner].get("answer_tokens"),
                    "set": set_name,
                    **result,
                }
            )
    return rows, unmatched


def rank_correlation(x, y) -> dict | None:
    """Spearman's rho of two score lists and its two-sided p-value, exact (every permutation of y) up to EXACT_UP_TO
    points: with n points even a perfect ranking has p = 2 / n!, 0.33 for three. None below three points or where
    one list is constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    rho = float(spearmanr(x, y).statistic)
    if len(x) > EXACT_UP_TO:
        return {"rho": rho, "p_value": float(spearmanr(x, y).pvalue), "points": len(x), "exact": False}
    rx, ry = rankdata(x), np.array(list(itertools.permutations(rankdata(y))))
    centred = ry - ry.mean(axis=1, keepdims=True)
    rhos = centred @ (rx - rx.mean()) / (np.linalg.norm(centred, axis=1) * np.linalg.norm(rx - rx.mean()))
    p_value = float(np.mean(np.abs(rhos) >= abs(rho) - 1e-9))
    return {"rho": rho, "p_value": p_value, "points": len(x), "exact": True}


def per_source(per_prompt: pd.DataFrame, drafts: dict[str, dict], onpolicy: dict, *, boot: int, seed: int):
    """Each per-source draft (`responses == "source"`): its accept length over every evaluation prompt (mean and
    interval) beside its source's on-policy score (survey.json's `onpolicy[source]`: NLL of the source's answers
    under the target, nats/token, and its interval; None where the survey scored no such source). Returns (rows, the
    rank correlation of accept length with NLL over the scored drafts, None below three). The seeds' criterion
    predicts rho = -1: the lower the NLL (the closer to the target's own answers), the more the draft accepts."""
    rows, seeds = [], replicates(drafts)
    for name, draft in drafts.items():
        mine = per_prompt[per_prompt.system == name]
        if draft.get("responses") != "source" or draft.get("replicate_of") or mine.empty:
            continue
        accept = bootstrap_mean(per_prompt, seeds[name], boot=boot, seed=seed)
        score = onpolicy.get(draft["source"]) or {}
        rows.append(
            {
                "draft": name,
                "source": draft["source"],
                "records": draft["records"],
                "answer_tokens": draft.get("answer_tokens"),
                "accept_length": accept["mean"],
                "low": accept["low"],
                "high": accept["high"],
                "prompts": accept["prompts"],
                "seeds": accept["seeds"][0],
                **{f"accept {s}": float(g.accept_length.mean()) for s, g in mine.groupby("set")},
                "onpolicy_nll": score.get("nll"),
                "nll_low": score.get("ci_low"),
                "nll_high": score.get("ci_high"),
            }
        )
    scored = [r for r in rows if r["onpolicy_nll"] is not None]
    return rows, rank_correlation([r["onpolicy_nll"] for r in scored], [r["accept_length"] for r in scored])


def beside_the_curve(
    per_prompt: pd.DataFrame,
    sizes: dict[str, float],
    labelled: list[dict],
    *,
    boot: int,
    seed: int,
    seeds: dict[str, list[str]] | None = None,
):
    """Each draft trained elsewhere on regenerated answers (`scaling.labelled_points`) against the pipeline's
    regenerated draft nearest its conversations (`sizes`: draft -> conversations; nearest on a log scale): the paired
    difference where the sweep ran both (`per_prompt`: every system of the sweep), else the difference of the set means
    the benchmark measured (the point's `accept_length`), with no interval. `seeds`: a pipeline draft -> its seeds'
    systems (`replicates`), all of which the difference then reads."""
    seeds = seeds or {}
    rows = []
    for point in labelled:
        if point["responses"] != "regenerated" or not sizes:
            continue
        nearest = min(sizes, key=lambda name: abs(math.log(sizes[name] / point["conversations"])))
        same = {"draft": point["draft"], "conversations": point["conversations"], "pipeline_draft": nearest}
        same["pipeline_records"] = sizes[nearest]
        if point["draft"] in set(per_prompt.system):
            for set_name, group in by_set(per_prompt):
                result = paired_difference(group, point["draft"], seeds.get(nearest, [nearest]), boot=boot, seed=seed)
                if result:
                    rows.append(same | {"set": set_name, "paired": True} | result)
            continue
        for set_name, tau in point["accept_length"].items():
            ours = per_prompt[(per_prompt.system == nearest) & (per_prompt.set == set_name)].accept_length.mean()
            rows.append(
                same
                | {"set": set_name, "paired": False, "draft_accept": tau, "partner_accept": float(ours)}
                | {"difference": tau - float(ours), "low": None, "high": None, "prompts": None, "verdict": "not shown"}
            )
    return rows
