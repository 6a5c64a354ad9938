"""Stage 05's comparisons between drafts, each with a bootstrap interval over the evaluation prompts.

- Paired: an original-answer draft against the regenerated one it is matched to in target answer tokens, and the
  sampled (T=0.7) draft against its T=0 partner (train.json's `matched_to`): the difference in accept length prompt
  by prompt (paired by set and id), so what the prompts share cancels.
- Per source: a draft trained on one source's answers, its mean accept length against that source's on-policy score
  (the survey's NLL): the seeds' ranking criterion, tested by a rank correlation whose exact permutation p-value says
  how little a handful of points can show.
- Beside the curve: a draft trained elsewhere on regenerated answers against the pipeline's own draft nearest its
  size.
Input: the sweep's per-prompt rows (set, id, system, accept_length; one config) and train.json's draft records.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
from scipy.stats import rankdata, spearmanr

from eagle3lab.benchmark.scaling import LEVEL, quantiles

ALL_SETS = "all sets"  # the row over every prompt of every set
PAIRED = ("original", "sampled")  # the drafts compared with the regenerated (T=0) draft they are matched to
DRAFT_FIELDS = ("records", "responses", "answer_tokens", "matched_to", "source")
EXACT_UP_TO = 7  # points for which the rank correlation's p-value enumerates every permutation


def with_drafts(per_prompt: pd.DataFrame, drafts: dict[str, dict]) -> pd.DataFrame:
    """The per-prompt rows of the trained drafts, each with its training record's fields (None where a train.json
    written before issue 26 has no such field)."""
    rows = per_prompt[per_prompt.system.isin(drafts)].copy()
    for field in DRAFT_FIELDS:
        rows[field] = rows.system.map({name: draft.get(field) for name, draft in drafts.items()})
    return rows


def bootstrap_mean(values, *, boot: int, seed: int, level: float = LEVEL) -> dict:
    """Mean of per-prompt values with its bootstrap interval (prompts resampled with replacement)."""
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if not boot or len(values) < 2:
        return {"mean": mean, "low": None, "high": None, "prompts": len(values)}
    means = values[np.random.default_rng(seed).integers(0, len(values), (boot, len(values)))].mean(axis=1)
    low, high = quantiles(means, level)
    return {"mean": mean, "low": low, "high": high, "prompts": len(values)}


def paired_difference(per_prompt: pd.DataFrame, draft: str, partner: str, *, boot: int, seed: int) -> dict | None:
    """`draft` minus `partner` in accept length over the prompts both ran (paired by set and id): both means and the
    mean difference with its bootstrap interval; None when they share no prompt."""
    mine = per_prompt[per_prompt.system.isin([draft, partner])]
    pairs = mine.pivot_table(index=["set", "id"], columns="system", values="accept_length").dropna()
    if draft not in pairs or partner not in pairs or pairs.empty:
        return None
    difference = bootstrap_mean(pairs[draft] - pairs[partner], boot=boot, seed=seed)
    return {"draft_accept": float(pairs[draft].mean()), "partner_accept": float(pairs[partner].mean())} | {
        "difference": difference["mean"],
        "low": difference["low"],
        "high": difference["high"],
        "prompts": difference["prompts"],
    }


def by_set(per_prompt: pd.DataFrame):
    """(set, rows) over every prompt first, then set by set."""
    return [(ALL_SETS, per_prompt), *per_prompt.groupby("set")]


def paired_comparisons(per_prompt: pd.DataFrame, drafts: dict[str, dict], *, boot: int, seed: int):
    """Every original and sampled draft against its `matched_to` partner, over all prompts and set by set. Returns
    (rows, unmatched: one line per draft left out, saying why)."""
    rows, unmatched = [], []
    for name, draft in drafts.items():
        if draft.get("responses") not in PAIRED:
            continue
        partner = draft.get("matched_to")
        if not partner:
            unmatched.append(f"{name}: no `matched_to` in train.json (written before issue 26)")
            continue
        if partner not in drafts:
            unmatched.append(f"{name}: its partner {partner} is not among the trained drafts")
            continue
        for set_name, group in by_set(per_prompt):
            result = paired_difference(group, name, partner, boot=boot, seed=seed)
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
    rows = []
    for name, draft in drafts.items():
        mine = per_prompt[per_prompt.system == name]
        if draft.get("responses") != "source" or mine.empty:
            continue
        accept = bootstrap_mean(mine.accept_length, boot=boot, seed=seed)
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
                **{f"accept {s}": float(g.accept_length.mean()) for s, g in mine.groupby("set")},
                "onpolicy_nll": score.get("nll"),
                "nll_low": score.get("ci_low"),
                "nll_high": score.get("ci_high"),
            }
        )
    scored = [r for r in rows if r["onpolicy_nll"] is not None]
    return rows, rank_correlation([r["onpolicy_nll"] for r in scored], [r["accept_length"] for r in scored])


def beside_the_curve(per_prompt: pd.DataFrame, sizes: dict[str, float], labelled: list[dict], *, boot: int, seed: int):
    """Each draft trained elsewhere on regenerated answers (`scaling.labelled_points`) against the pipeline's
    regenerated draft nearest its conversations (`sizes`: draft -> conversations; nearest on a log scale): the paired
    difference where the sweep ran both (`per_prompt`: every system of the sweep), else the difference of the set means
    the benchmark measured (the point's `accept_length`), with no interval."""
    rows = []
    for point in labelled:
        if point["responses"] != "regenerated" or not sizes:
            continue
        nearest = min(sizes, key=lambda name: abs(math.log(sizes[name] / point["conversations"])))
        same = {"draft": point["draft"], "conversations": point["conversations"], "pipeline_draft": nearest}
        same["pipeline_records"] = sizes[nearest]
        if point["draft"] in set(per_prompt.system):
            for set_name, group in by_set(per_prompt):
                result = paired_difference(group, point["draft"], nearest, boot=boot, seed=seed)
                if result:
                    rows.append(same | {"set": set_name, "paired": True} | result)
            continue
        for set_name, tau in point["accept_length"].items():
            ours = per_prompt[(per_prompt.system == nearest) & (per_prompt.set == set_name)].accept_length.mean()
            rows.append(
                same
                | {"set": set_name, "paired": False, "draft_accept": tau, "partner_accept": float(ours)}
                | {"difference": tau - float(ours), "low": None, "high": None, "prompts": None}
            )
    return rows
