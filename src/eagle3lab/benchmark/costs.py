"""Per-forward costs on this machine, the inputs of the speedup model (`scaling.CostModel`, `tune`): a target decode
step, a target verify of k tokens (k = 1..32), a draft step, what a round spends outside the models, and the prefill
of a prompt of n tokens: the target's (every system runs it) and the draft's (what a speculative system adds: the
draft reads the prompt's captured hidden states). Measured here (CUDA-synchronised medians on a rolled-back cache) or
read from a JSON file: a `tune` result from another machine (`eagle3lab tune --device cuda` on the GPU box writes its
measured costs under "costs"), or numbers of your own:

    {"target_step": 0.0376, "verify": {"1": 0.0376, "2": 0.039, ..., "32": 0.07}, "draft_step": 0.0023, "other": 0.001,
     "prefill": {"target": {"64": 0.05, "256": 0.17}, "draft": {"64": 0.004, "256": 0.012}}}

"prefill" is optional (costs files from before it existed have none): without it `tune` predicts decoding alone.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import torch

from eagle3lab.decoding.tree import keep_cache_positions
from eagle3lab.devices import clock
from eagle3lab.io import InputError

VERIFY_KS = tuple(range(1, 33))


@torch.inference_mode()
def measure_forward_costs(
    model,
    draft=None,
    *,
    context: int = 200,
    ks=VERIFY_KS,
    repeats: int = 7,
    topk: int = 1,
    seed: int = 0,
    prefill_lengths=(),
) -> dict:
    """Median seconds of: a target decode step (1 token), a target verify of k tokens, and (with a draft) one draft
    step of `topk` tokens, each on a `context`-token cache rolled back after every call, on the model's device; and
    with `prefill_lengths`, the prefill of a prompt of each length (`measure_prefill_costs`)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, context), generator=gen).to(device)
    cache = DynamicCache(config=model.config)
    model.model(input_ids=ids, cache=cache, use_cache=True)

    def timed(fn):
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            t0 = clock(device)
            fn()
            times.append(clock(device) - t0)
        return statistics.median(times[1:])

    def verify(k):
        new = torch.randint(0, vocab, (1, k), generator=gen).to(device)
        positions = torch.arange(context, context + k, device=device)[None]
        out = model.model(input_ids=new, position_ids=positions, cache=cache, use_cache=True)
        model.lm_head(out.last_hidden_state)
        keep_cache_positions(cache, context, [])

    verify_costs = _monotone_medians(verify, sorted({1, *ks}), repeats, device)
    # a decode step is a verify of one token: one reading for both, so they never differ by the load of the moment
    costs = {"context": context, "target_step": verify_costs[1], "verify": verify_costs}
    if draft is not None:
        costs["draft_step"] = _draft_step(draft, ids, context, topk, gen, timed)
        costs["draft_topk"] = topk
    if prefill_lengths:
        costs["prefill"] = measure_prefill_costs(model, draft, prefill_lengths, repeats=repeats, seed=seed)
    return costs


@torch.inference_mode()
def measure_prefill_costs(model, draft=None, lengths=(64, 256), *, repeats: int = 7, seed: int = 0) -> dict:
    """Median seconds to prefill a prompt of each length as the engine does: the target's forward into a fresh cache
    (its last token's logits), and (with a draft) the draft's: `project` of the captured aux hidden states and a
    draft forward over the prompt into a fresh draft cache. {"target": {n: s}, "draft": {n: s}}."""
    from transformers import DynamicCache

    from eagle3lab.models.target import AuxCapture, aux_hidden_indices

    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    lengths = sorted({int(n) for n in lengths if int(n) >= 1})
    prompts = {n: torch.randint(0, model.config.vocab_size, (1, n), generator=gen).to(device) for n in lengths}
    positions = {n: torch.arange(n, device=device)[None] for n in lengths}

    def forward(n):
        cache = DynamicCache(config=model.config)
        return model.model(input_ids=prompts[n], position_ids=positions[n], cache=cache, use_cache=True)

    def target(n):  # the head on the last position as the engine slices it: a [1, 1, H] view is twice as slow on CPU
        model.lm_head(forward(n).last_hidden_state[0, -1:]).float()

    prefill = {"target": _monotone_medians(target, lengths, repeats, device)}
    if draft is None:
        return prefill
    indices = aux_hidden_indices(model.config.num_hidden_layers, draft.config.aux_layer_ids)
    features = {}
    for n in lengths:
        with AuxCapture(model, indices) as capture:
            forward(n)
            features[n] = capture.concat()[0].to(next(draft.parameters()).dtype)

    def draft_prefill(n):
        draft(prompts[n], draft.project(features[n])[None], positions[n], cache=draft.new_cache())

    prefill["draft"] = _monotone_medians(draft_prefill, lengths, repeats, device)
    return prefill


def _monotone_medians(fn, sizes, repeats: int, device) -> dict[int, float]:
    """Median seconds of `fn(size)` per size, over repeats taken round-robin over the sizes (so a burst of load on a
    shared machine hits every size alike), then made non-decreasing from the right: verifying (or prefilling) k
    tokens cannot cost more than more of them, so a higher reading at a smaller size is noise."""
    times: dict[int, list[float]] = {int(k): [] for k in sizes}
    fn(max(times))  # warm up the largest shape
    for _ in range(repeats):
        for k, samples in times.items():
            t0 = clock(device)
            fn(k)
            samples.append(clock(device) - t0)
    medians = {k: statistics.median(v) for k, v in sorted(times.items())}
    floor = float("inf")
    for k in sorted(medians, reverse=True):
        floor = medians[k] = min(medians[k], floor)
    return medians


def _draft_step(draft, ids, context: int, topk: int, gen, timed) -> float:
    device, dtype = ids.device, next(draft.parameters()).dtype
    dcache = draft.new_cache()
    h = draft.config.hidden_size
    prefix = torch.randn(1, context - 1, h, generator=gen).to(device, dtype)
    draft(ids[:, 1:], prefix, torch.arange(context - 1, device=device)[None], cache=dcache)

    def step():
        tokens = torch.randint(0, draft.config.vocab_size, (1, topk), generator=gen).to(device)
        mask = None
        if topk > 1:
            mask = torch.cat([torch.ones(topk, dcache.length, dtype=torch.bool), torch.eye(topk, dtype=torch.bool)], 1)
        hidden = torch.randn(1, topk, h, generator=gen).to(device, dtype)
        draft(tokens, hidden, torch.full((1, topk), dcache.length, device=device), cache=dcache, attn_mask=mask)
        dcache.crop(context - 1)

    return timed(step)


def verify_cost(costs: dict, k: int) -> float:
    """Seconds to verify k tokens: measured, or interpolated linearly between the measured ks."""
    verify = costs["verify"]
    if k in verify:
        return verify[k]
    ks = sorted(verify)
    return float(np.interp(k, ks, [verify[j] for j in ks]))


def prefill_cost(costs: dict, part: str, tokens: int) -> float:
    """Seconds of the `part` ("target" or "draft") prefill of a `tokens`-token prompt: interpolated linearly between
    the measured lengths and extended along the nearest measured segment (in proportion to the length when only one
    was measured); 0 when the costs have no such prefill (a costs file from before prefill was measured)."""
    table = costs.get("prefill", {}).get(part)
    if not table:
        return 0.0
    ns = sorted(table)
    if len(ns) == 1:
        return table[ns[0]] * tokens / ns[0]
    if ns[0] <= tokens <= ns[-1]:
        return float(np.interp(tokens, ns, [table[n] for n in ns]))
    a, b = ns[:2] if tokens < ns[0] else ns[-2:]
    slope = (table[b] - table[a]) / (b - a)
    return max(table[a] + slope * (tokens - a), 0.0)


def _positive(value, where, field: str, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InputError(f"{where}: field '{field}' should be a number of seconds {bound}, got {value!r}")
    return float(value)


def read_costs(path) -> dict:
    """Costs from a JSON file (see the module docstring), checked: an InputError names the file and the field."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: costs file not found")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e})") from None
    if isinstance(raw, dict) and isinstance(raw.get("costs"), dict):  # a `tune` result: its measured costs
        raw = raw["costs"]
    return parse_costs(raw, path) | {"source": str(path)}


def parse_costs(raw, where) -> dict:
    """Checked costs from a JSON object (a costs file, or the `costs` of a `tune` result); `where` names its source."""
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a JSON object with target_step, verify, draft_step")
    for field in ("target_step", "verify", "draft_step"):
        if field not in raw:
            raise InputError(f"{where}: missing field '{field}'")
    if not isinstance(raw["verify"], dict) or not raw["verify"]:
        raise InputError(f"{where}: field 'verify' should be an object {{k: seconds}} for k tokens verified")
    verify = {}
    for k, v in raw["verify"].items():
        if not str(k).isdigit() or int(k) < 1:
            raise InputError(f"{where}: field 'verify' has key {k!r}; keys are token counts 1, 2, ...")
        verify[int(k)] = _positive(v, where, f"verify.{k}")
    costs = {
        "target_step": _positive(raw["target_step"], where, "target_step"),
        "verify": verify,
        "draft_step": _positive(raw["draft_step"], where, "draft_step"),
    }
    if "other" in raw:  # else `tune` uses the overhead it measured in its traced runs
        costs["other"] = _positive(raw["other"], where, "other", allow_zero=True)
    if "prefill" in raw:  # else `tune` predicts decoding alone (costs files from before prefill was measured)
        costs["prefill"] = _parse_prefill(raw["prefill"], where)
    return costs


def _parse_prefill(raw, where) -> dict:
    """{"target": {n: seconds}, "draft": {n: seconds}} (either part may be absent), keys prompt lengths in tokens."""
    if not isinstance(raw, dict) or not raw or set(raw) - {"target", "draft"}:
        raise InputError(f"{where}: field 'prefill' should be an object with 'target' and/or 'draft'")
    prefill = {}
    for part, table in raw.items():
        if not isinstance(table, dict) or not table:
            raise InputError(f"{where}: field 'prefill.{part}' should be an object {{tokens: seconds}}")
        for n in table:
            if not str(n).isdigit() or int(n) < 1:
                raise InputError(f"{where}: field 'prefill.{part}' has key {n!r}; keys are prompt lengths 1, 2, ...")
        prefill[part] = {int(n): _positive(v, where, f"prefill.{part}.{n}") for n, v in table.items()}
    return prefill
