"""The evaluation set of exact offline acceptance: the evaluation sets' prompts (MT-bench with both turns, HumanEval,
a fixed GSM8K sample), the target's greedy answers to them as token ids, and the target's features along them.

A greedy chain draft's accept length on a prompt is fully determined by the target's greedy answer, so the answers
are generated once (batched, the costly part) and cached as token ids: text would not do, since re-tokenizing an
answer can give other ids than the ones the target produced. MT-bench's second turn is asked after the target's own
first answer. The cache is keyed by the target's weights, the dtype, the sets and the answer length; a killed build
loses at most the turn it was generating (each turn's file is written atomically).

The features come from one target forward over prompt + answer, record by record (no padding). That forward also
checks each answer against the target's own argmax along it: batched decoding rounds differently from a single
forward, so where the two disagree (a near-tie) the answer is cut before the first disagreement and the cut is
counted. What remains is the text every draft is scored on, identical for all of them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import torch

from eagle3lab.io import InputError, atomic_path, read_jsonl, require, write_json, write_jsonl
from eagle3lab.models.target import Target, aux_hidden_indices, forward_with_aux

# Records per set; null: every record. GSM8K's test split has 1,319: its first 120 are the fixed sample.
DEFAULT_SETS = {"mtbench": None, "humaneval": None, "gsm8k": 120}


@dataclass
class EvalRecord:
    id: str  # "<set record id>#<turn>"
    set: str
    turn: int  # 1 or 2 (MT-bench's second question, asked after the target's first answer)
    prompt_ids: list[int]
    answer_ids: list[int]  # the target's greedy answer, its stop token included
    finished_by: str  # "stop" or "length"
    home: Path | None = None  # the built set's cache folder (load_eval_set's): teacher_forced keeps features there


@dataclass
class TeacherForced:
    """One record with the target's features along it, the answer cut to where the target's own argmax agrees."""

    record: EvalRecord
    ids: torch.Tensor  # [L + N] prompt + the agreed answer
    aux: torch.Tensor  # [L + N, len(layers) * H] float32
    answer_tokens: int  # N
    cut: bool  # the batched answer disagreed with the single forward before its end


def parse_sets(sets: dict | list) -> dict[str, int | None]:
    """{set: records or None} from a mapping or a list of names (every record)."""
    from eagle3lab.data.sources import EVALUATION_SETS

    chosen = dict(sets) if isinstance(sets, dict) else {name: None for name in sets}
    for name, limit in chosen.items():
        if name not in EVALUATION_SETS:
            raise InputError(f"evaluation set '{name}': unknown (known: {', '.join(EVALUATION_SETS)})")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise InputError(f"evaluation set '{name}': records {limit!r} should be a positive integer or null")
    return chosen


def eval_key(target: Target, dtype: str, sets: dict, max_new_tokens: int) -> dict:
    from eagle3lab.data.sources import EVALUATION_SETS
    from eagle3lab.train.features import target_fingerprint

    return {
        "format": 1,
        "target": target.spec,
        "target_fingerprint": target_fingerprint(target),
        "dtype": dtype,
        "sets": sets,
        "max_new_tokens": max_new_tokens,
        "chat_template_sha256": hashlib.sha256(str(target.tokenizer.chat_template).encode()).hexdigest()[:16],
        "set_loaders": sorted(EVALUATION_SETS),
    }


def _generate(target: Target, jobs: list[tuple[dict, list[dict]]], max_new_tokens: int, batch_size: int) -> list:
    """Greedy answers to each job's messages, in job order: (job, prompt ids, TurnResult)."""
    from eagle3lab.benchmark.prompts import encode_chat
    from eagle3lab.regen.batching import BatchGenerator

    engine = BatchGenerator(target.model, target.tokenizer, batch_size=batch_size, max_new_tokens=max_new_tokens)
    prompts = [encode_chat(target.tokenizer, messages) for _, messages in jobs]
    for i, ids in enumerate(prompts):
        engine.submit(i, ids)
    results = {}
    engine.run(lambda i, result: results.__setitem__(i, result))
    return [(job, prompts[i], results[i]) for i, (job, _) in enumerate(jobs)]


def _turn_file(folder: Path, turn: int) -> Path:
    return folder / f"turn{turn}.jsonl"


def build_eval_set(
    target: Target, folder, sets: dict | list = DEFAULT_SETS, max_new_tokens: int = 128, batch_size: int = 32
) -> list[EvalRecord]:
    """The evaluation set's records, generated into `folder`/<key digest> once and read from there afterwards."""
    from eagle3lab.data.sources import EVALUATION_SETS

    sets = parse_sets(sets)
    dtype = str(target.model.dtype).removeprefix("torch.")
    key = eval_key(target, dtype, sets, max_new_tokens)
    home = Path(folder) / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "key.json").exists():  # what the digest stands for, for a person reading the cache
        write_json(home / "key.json", key)
    first = _turn_file(home, 1)
    if not first.exists():
        jobs = [
            ({"set": name, "source_id": record.id, "turns": record.conversations}, record.conversations[:1])
            for name, limit in sets.items()
            for record in EVALUATION_SETS[name]()[:limit]
        ]
        answers = _generate(target, jobs, max_new_tokens, batch_size)
        write_jsonl(first, (_row(job, 1, ids, result) for job, ids, result in answers))
    second = _turn_file(home, 2)
    if not second.exists():
        jobs = []
        for row in read_jsonl(first):
            if len(row["turns"]) > 1:  # MT-bench: the follow-up question after the target's own first answer
                answer = target.tokenizer.decode(row["answer_ids"], skip_special_tokens=True)
                messages = [row["turns"][0], {"role": "assistant", "content": answer}, row["turns"][1]]
                jobs.append((row, messages))
        answers = _generate(target, jobs, max_new_tokens, batch_size)
        write_jsonl(second, (_row(job, 2, ids, result) for job, ids, result in answers))
    return load_eval_set(home)


def _row(job: dict, turn: int, prompt_ids: list[int], result) -> dict:
    return {
        "id": f"{job['source_id']}#{turn}",
        "set": job["set"],
        "source_id": job["source_id"],
        "turn": turn,
        "turns": job["turns"],
        "prompt_ids": prompt_ids,
        "answer_ids": result.token_ids,
        "finished_by": result.finish_reason,
    }


def load_eval_set(home) -> list[EvalRecord]:
    """The records of a built evaluation set (turn 1 then turn 2), each field checked."""
    records = []
    for turn in (1, 2):
        path = _turn_file(Path(home), turn)
        if not path.exists():
            raise InputError(f"{path}: missing: build the evaluation set first (eagle3lab acceptance builds it)")
        for i, row in enumerate(read_jsonl(path)):
            where = f"{path}: record {i + 1}"
            records.append(
                EvalRecord(
                    id=require(row, "id", where, str),
                    set=require(row, "set", where, str),
                    turn=require(row, "turn", where, int),
                    prompt_ids=require(row, "prompt_ids", where, list),
                    answer_ids=require(row, "answer_ids", where, list),
                    finished_by=require(row, "finished_by", where, str),
                    home=Path(home),
                )
            )
    return records


def features_folder(target: Target, records: list[EvalRecord], indices: list[int]) -> Path | None:
    """Where the teacher-forced features of records from one built set are kept: under its home, keyed by the target's
    weights, dtype and device kind and the layers read (None for records of no single built set)."""
    homes = {record.home for record in records}
    if len(homes) != 1 or None in homes:
        return None
    from eagle3lab.train.features import target_fingerprint

    parameter = next(target.model.parameters())
    key = {"target_fingerprint": target_fingerprint(target), "dtype": str(parameter.dtype), "layers": indices}
    key["device"] = parameter.device.type
    folder = homes.pop() / "features" / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    if not (folder / "key.json").exists():  # what the digest stands for, for a person reading the cache
        write_json(folder / "key.json", key)
    return folder


def teacher_forced(target: Target, records: list[EvalRecord], layer_ids: list[int] | None) -> Iterator[TeacherForced]:
    """Each record's target features along prompt + answer (float32, on the CPU), the answer cut where the
    target's own argmax first disagrees with it. Records of a built set keep them in its cache (`features_folder`),
    one file per record written atomically: the target forward is most of a draft's scoring and the same for every
    draft, so the next draft scored on this machine reads them (bitwise what the forward gave)."""
    indices = aux_hidden_indices(target.num_layers, layer_ids)
    device = next(target.model.parameters()).device
    cache = features_folder(target, records, indices)
    for record in records:
        kept = cache and cache / f"{quote(record.id, safe='')}.pt"
        if kept and kept.exists():
            yield TeacherForced(record, **torch.load(kept, weights_only=True))
            continue
        ids = torch.tensor(record.prompt_ids + record.answer_ids, dtype=torch.long)
        start = len(record.prompt_ids)
        with torch.inference_mode():
            out = forward_with_aux(target.model, ids[None].to(device), indices, logits=False)
            argmax = target.model.lm_head(out.final[0, start - 1 : -1]).argmax(-1).cpu()  # the answer's rows only
        disagree = (argmax != ids[start:]).nonzero()
        n = int(disagree[0]) if len(disagree) else len(record.answer_ids)
        forced = {
            "ids": ids[: start + n],
            "aux": out.aux[0, : start + n].float().cpu(),
            "answer_tokens": n,
            "cut": n < len(record.answer_ids),
        }
        if kept:
            with atomic_path(kept) as tmp:
                torch.save(forced, tmp)
        yield TeacherForced(record, **forced)


def summary(records: list[EvalRecord]) -> dict:
    """Prompts and answer tokens per set and turn (what the evaluation set holds)."""
    out: dict[str, dict] = {}
    for r in records:
        row = out.setdefault(r.set, {"prompts": 0, "answer_tokens": 0, "turns": {}})
        row["prompts"] += 1
        row["answer_tokens"] += len(r.answer_ids)
        row["turns"][str(r.turn)] = row["turns"].get(str(r.turn), 0) + 1
    return out
