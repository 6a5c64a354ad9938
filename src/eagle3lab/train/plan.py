"""The experiment plan of stage train_draft: which drafts to train, on which conversations.

- `scale-NNNNN`: the first N regenerated conversations, one draft per scale (stage 03 passes them in the mixture's
  order: `train.scales.in_input_order`).
- `original-NNNNN`: the sources' own answers (the mixture's train split), the fewest leading conversations whose
  answer tokens reach those of scale-NNNNN: the original answers run longer, so equal conversation counts would favour
  them.
- `sampled-NNNNN`: the temperature regeneration's answers to scale-NNNNN's conversations.
- `source-ID`: one source's regenerated conversations only, every listed source at the same answer tokens (the
  smallest source's total).
- `ablation-...`: regenerated answers at one scale with one recipe lever changed, matched to that scale's draft.
- `dflash-NNNNN`: the DFlash block drafter on scale-NNNNN's data and plan, matched to it (issue 48).
- `NAME-seedK`: with `seeds` > 1, every draft above again with training seed `seed` + K (initialisation and data
  order): the replicates whose spread puts training noise into every comparison's interval.

Answer tokens are counted as training tokenizes (`train.answer_tokens`); `count` maps a file to its per-record counts,
so tests can pass a fake one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from eagle3lab.io import InputError, read_jsonl, require
from eagle3lab.train.answer_tokens import prefix_reaching
from eagle3lab.train.config import TrainConfig

# TrainConfig fields a run's place in the experiment decides; the rest are shared settings or ablation levers.
PER_RUN = {"data", "val", "output", "features_cache", "max_records", "resume", "progress"}
AnswerCounter = Callable[[Path], list[int]]  # a file's answer tokens per record (train.answer_tokens.AnswerTokens)


@dataclass
class DraftRun:
    name: str
    data: str  # relative to the project root
    records: int  # conversations it trains on: the first `records` of `data`, or the `rows` picked from it
    responses: str  # regenerated, original, sampled, source, ablation (a recipe lever changed) or dflash
    answer_tokens: int  # target tokens of its assistant turns, at the shared max_len (train.answer_tokens)
    overrides: dict = field(default_factory=dict)  # TrainConfig fields that differ from the shared settings
    matched_to: str | None = None  # the regenerated draft an original or sampled draft is compared with
    source: str | None = None  # the source of a per-source draft
    rows: list[int] | None = None  # line indices of `data` when the draft trains on a subset rather than a prefix
    replicate_of: str | None = None  # the draft this one repeats with another training seed
    seed: int | None = None  # its training seed (None: the shared one)
    drafter: str = "eagle3"  # a drafter kind (eagle3lab.drafters.KINDS): whose trainer and format


def plan_rows(runs: list[DraftRun]) -> list[dict]:
    """The plan as a table: one row per draft, without the row lists."""
    return [{f.name: getattr(run, f.name) for f in fields(DraftRun) if f.name != "rows"} for run in runs]


def scale_name(n: int) -> str:
    return f"scale-{n:05d}"


def _ablation(spec, k: int) -> tuple[int, dict]:
    """(scale, overrides) of ablations[k], e.g. {scale: 1500, epochs: 10}; errors name the entry and field."""
    where = f"train_draft.ablations[{k}]"
    if not isinstance(spec, dict) or not isinstance(spec.get("scale"), int):
        raise InputError(f"{where}: expected a mapping with an integer 'scale' and the settings it changes")
    levers = {f.name for f in fields(TrainConfig)} - PER_RUN
    overrides = {key: value for key, value in spec.items() if key != "scale"}
    unknown = sorted(set(overrides) - levers)
    if unknown or not overrides:
        raise InputError(f"{where}: fields {unknown or '(none)'}: expected one or more of {sorted(levers)}")
    return spec["scale"], overrides


def _field(path: Path, name: str, kind=str) -> list:
    """Field `name` of every record of a JSONL file, in file order (ids as strings)."""
    return [str(require(row, name, f"{path}: record {i + 1}", kind)) for i, row in enumerate(read_jsonl(path))]


@dataclass
class _Regenerated:
    """The regenerated data and its drafts, which the comparison drafts are matched to."""

    root: Path
    count: AnswerCounter
    data: str
    counts: list[int]  # answer tokens of each regenerated conversation
    drafts: dict[int, DraftRun] = field(default_factory=dict)  # by conversation count

    def size(self, n: int | str) -> int:
        return len(self.counts) if n == "all" else n

    def matched(self, size: int, name: str) -> tuple[DraftRun | None, str]:
        """The regenerated draft of `size` conversations a comparison draft is matched to, or None and why."""
        draft = self.drafts.get(size)
        return draft, "" if draft else f"{name}: {scale_name(size)} is not trained ({len(self.counts)} regenerated)"


def _original_runs(regen: _Regenerated, original_data: str, original_scales) -> tuple[list[DraftRun], list[str]]:
    runs, skipped = [], []
    counts = regen.count(regen.root / original_data) if original_scales else []
    for size in sorted({regen.size(n) for n in original_scales}):
        name = f"original-{size:05d}"
        matched, why = regen.matched(size, name)
        m = prefix_reaching(counts, matched.answer_tokens) if matched else None
        if matched and m is None:
            why = f"{name}: {original_data} has {sum(counts)} answer tokens, {matched.name} {matched.answer_tokens}"
        if why:
            skipped.append(why)
            continue
        runs.append(DraftRun(name, original_data, m, "original", sum(counts[:m]), matched_to=matched.name))
    return runs, skipped


def _sampled_runs(regen: _Regenerated, sampled_data: str, sampled_scale) -> tuple[list[DraftRun], list[str]]:
    """The temperature draft on the sampled answers to the conversations of the regenerated draft it is matched to
    (by id: the sampled file is in completion order, the regenerated one in the mixture's). The sampled run
    answers the first prompts of the mixture, less those skipped as over-length, so it can hold a few fewer of them
    than the matched draft (836 of 880 in the reference run): the draft trains on those it holds."""
    if sampled_scale is None:
        return [], []
    size, path = regen.size(sampled_scale), regen.root / sampled_data
    name = f"sampled-{size:05d}"
    matched, why = regen.matched(size, name)
    if not matched:
        return [], [why]
    if not path.exists():
        return [], [f"{name}: {sampled_data} does not exist"]
    ids = _field(path, "id", (str, int))
    wanted = set(_field(regen.root / regen.data, "id", (str, int))[:size])
    rows = [i for i, rid in enumerate(ids) if rid in wanted]
    if not rows:
        return [], [f"{name}: {sampled_data} answers none of {matched.name}'s conversations"]
    counts = regen.count(path)
    tokens = sum(counts[i] for i in rows)
    return [DraftRun(name, sampled_data, len(rows), "sampled", tokens, matched_to=matched.name, rows=rows)], []


def _check_scales(scales, seeds, **placed) -> None:
    """Errors naming the train_draft key: seeds, the scales, and each key placing a draft at one of the scales."""
    if not isinstance(seeds, int) or seeds < 1:
        raise InputError(f"train_draft.seeds: {seeds!r}: expected a positive integer (training seeds per draft)")
    bad = [n for n in scales if n != "all" and (not isinstance(n, int) or n < 1)]
    if bad:
        raise InputError(f"train_draft.scales: {bad}: expected positive integers or 'all'")
    for key, values in placed.items():
        unknown = [n for n in values if n is not None and n not in scales]
        if unknown:
            raise InputError(f"train_draft.{key}: {unknown}: expected scales of train_draft.scales {list(scales)}")


def _dflash_runs(regen: _Regenerated, dflash_scale) -> tuple[list[DraftRun], list[str]]:
    """The block drafter on its scale's data and plan, matched to that scale's EAGLE-3 draft."""
    if dflash_scale is None:
        return [], []
    size = regen.size(dflash_scale)
    matched, why = regen.matched(size, f"dflash-{size:05d}")
    if not matched:
        return [], [why]
    return [
        replace(matched, name=f"dflash-{size:05d}", responses="dflash", matched_to=matched.name, drafter="dflash")
    ], []


def _source_runs(regen: _Regenerated, original_data: str, source_drafts) -> list[DraftRun]:
    """One draft per listed source on its regenerated conversations, all at the smallest source's answer tokens."""
    if not source_drafts:
        return []
    known = set(_field(regen.root / original_data, "source"))
    of_row = _field(regen.root / regen.data, "source")
    rows = {}
    for sid in dict.fromkeys(source_drafts):
        if sid not in known:
            raise InputError(f"train_draft.source_drafts: '{sid}' is not a source of {original_data} {sorted(known)}")
        rows[sid] = [i for i, s in enumerate(of_row) if s == sid]
        if not rows[sid]:
            raise InputError(f"train_draft.source_drafts: '{sid}' has no regenerated conversation in {regen.data}")
    tokens = min(sum(regen.counts[i] for i in picked) for picked in rows.values())
    runs = []
    for sid, picked in rows.items():
        chosen = picked[: prefix_reaching([regen.counts[i] for i in picked], tokens)]
        answer = sum(regen.counts[i] for i in chosen)
        runs.append(DraftRun(f"source-{sid}", regen.data, len(chosen), "source", answer, source=sid, rows=chosen))
    return runs


def plan_runs(
    root: Path,
    count: AnswerCounter,
    *,
    train_data: str,
    original_data: str,
    scales: list[int | str],
    original_scales: list[int | str] = (),
    sampled_data: str | None = None,
    sampled_scale: int | str | None = None,
    source_drafts: list[str] = (),
    ablations: list[dict] | None = None,
    dflash_scale: int | str | None = None,
    seeds: int = 1,
    seed: int = 0,
) -> tuple[list[DraftRun], list[str]]:
    """The drafts to train (paths relative to `root`), and why each planned one that cannot be trained is skipped.
    A scale "all" is every regenerated conversation, whatever their number. `seeds` trains each draft that many
    times, replicate K with training seed `seed` + K."""
    _check_scales(scales, seeds, original_scales=original_scales, sampled_scale=[sampled_scale],
                  dflash_scale=[dflash_scale])  # fmt: skip
    regen = _Regenerated(root, count, train_data, count(root / train_data))
    available = len(regen.counts)
    skipped = []
    for n in sorted({regen.size(n) for n in scales}):
        if n > available:
            skipped.append(f"{scale_name(n)}: {available} regenerated conversations")
        else:
            regen.drafts[n] = DraftRun(scale_name(n), train_data, n, "regenerated", sum(regen.counts[:n]))
    runs = list(regen.drafts.values())
    for more, why in (
        _original_runs(regen, original_data, original_scales),
        _sampled_runs(regen, sampled_data, sampled_scale),
        _dflash_runs(regen, dflash_scale),
    ):
        runs, skipped = runs + more, skipped + why
    runs += _source_runs(regen, original_data, source_drafts)
    for k, spec in enumerate(ablations or []):
        scale, overrides = _ablation(spec, k)
        label = "-".join(f"{key.replace('_', '')}{value}" for key, value in overrides.items())
        name = f"ablation-{label}-{scale:05d}"
        if scale > available:
            skipped.append(f"{name}: {available} regenerated conversations")
            continue
        partner = regen.drafts.get(scale)  # the shared recipe at the same scale, when that scale is trained
        tokens = sum(regen.counts[:scale])
        runs.append(DraftRun(name, train_data, scale, "ablation", tokens, overrides, partner and partner.name))
    replicates = [
        replace(run, name=f"{run.name}-seed{k}", replicate_of=run.name, seed=seed + k)
        for k in range(1, seeds)
        for run in runs
    ]
    return runs + replicates, skipped
