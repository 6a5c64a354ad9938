"""Survey signals per source: inventory (counts, lengths in target tokens, duplicates), on-policy score (the target's
per-token NLL of the source's own answers), and the projected cost of regenerating the source through the target."""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from eagle3lab.data.formats import clean_turns, normalize_text
from eagle3lab.data.sources import Record
from eagle3lab.devices import clock


def with_reference(record: Record) -> list[dict]:
    """The record's turns, with its reference answer (GSM8K, HumanEval) as the answer to a trailing prompt."""
    turns = list(record.conversations)
    if record.reference and turns and turns[-1]["role"] == "user":
        turns.append({"role": "assistant", "content": record.reference})
    return turns


def _quantiles(values) -> dict:
    if not len(values):
        return {"n": 0, "mean": None, "p10": None, "p50": None, "p90": None, "max": None}
    v = np.asarray(values, dtype=float)
    return {
        "n": int(v.size),
        "mean": round(float(v.mean()), 1),
        "p10": float(np.percentile(v, 10)),
        "p50": float(np.percentile(v, 50)),
        "p90": float(np.percentile(v, 90)),
        "max": float(v.max()),
    }


@dataclass
class Inventory:
    source: str
    category: str
    records: int
    turns: int
    user_turns: int
    assistant_turns: int
    starts_with_assistant: int  # records whose first non-system turn is the assistant's
    empty_turns: int
    duplicate_rate: float  # records whose whole normalized conversation repeats an earlier one
    prompt_duplicate_rate: float  # records whose normalized user turns repeat an earlier record's
    length_sample: int  # records tokenized for the length statistics
    prompt_tokens: dict  # per record: tokens of all user turns
    response_tokens: dict  # per assistant turn (reference answers included)
    prompt_lengths: list = field(default_factory=list, repr=False)
    response_lengths: list = field(default_factory=list, repr=False)
    per_record_responses: list = field(default_factory=list, repr=False)  # [[len of each answer]] per sampled record
    per_record_user_turns: list = field(default_factory=list, repr=False)

    def row(self) -> dict:
        """One flat table row (no raw arrays)."""
        d = {k: v for k, v in asdict(self).items() if not isinstance(v, list)}
        for key in ("prompt_tokens", "response_tokens"):
            stats = d.pop(key)
            d.update({f"{key}_{k}": v for k, v in stats.items() if k in ("mean", "p50", "p90")})
        return d


def inventory(
    records: list[Record], tokenizer, *, length_samples: int | None = None, seed: int = 0, category: str | None = None
) -> Inventory:
    """Counts and duplicates over all records; length distributions over a seeded sample of `length_samples`.
    `category` overrides the records' own (e.g. the catalog's category for the source)."""
    if not records:
        raise ValueError("inventory of an empty source")
    turns = user = assistant = starts_asst = empty = 0
    seen_conv, seen_prompt, dup_conv, dup_prompt = set(), set(), 0, 0
    for r in records:
        convs = with_reference(r)
        turns += len(convs)
        user += sum(t["role"] == "user" for t in convs)
        assistant += sum(t["role"] == "assistant" for t in convs)
        empty += sum(not t["content"].strip() for t in convs)
        first = next((t["role"] for t in convs if t["role"] != "system"), None)
        starts_asst += first == "assistant"
        conv_key = "\x00".join(f"{t['role']}:{normalize_text(t['content'])}" for t in convs)
        prompt_key = prompt_key_of(convs)
        dup_conv += conv_key in seen_conv
        dup_prompt += prompt_key in seen_prompt
        seen_conv.add(conv_key)
        seen_prompt.add(prompt_key)
    n = len(records)
    sample = (
        records if not length_samples or length_samples >= n else random.Random(seed).sample(records, length_samples)
    )
    cleaned = [clean_turns(with_reference(r))[0] for r in sample]
    user_texts = ["\n".join(t["content"] for t in c if t["role"] == "user") for c in cleaned]
    answers = [[t["content"] for t in c if t["role"] == "assistant"] for c in cleaned]
    prompt_lengths = _token_lengths(tokenizer, user_texts)
    flat = _token_lengths(tokenizer, [a for per in answers for a in per])
    per_record, k = [], 0
    for per in answers:
        per_record.append(flat[k : k + len(per)])
        k += len(per)
    return Inventory(
        source=records[0].source,
        category=category or records[0].category,
        records=n,
        turns=turns,
        user_turns=user,
        assistant_turns=assistant,
        starts_with_assistant=starts_asst,
        empty_turns=empty,
        duplicate_rate=round(dup_conv / n, 4),
        prompt_duplicate_rate=round(dup_prompt / n, 4),
        length_sample=len(sample),
        prompt_tokens=_quantiles(prompt_lengths),
        response_tokens=_quantiles(flat),
        prompt_lengths=prompt_lengths,
        response_lengths=flat,
        per_record_responses=per_record,
        per_record_user_turns=[sum(t["role"] == "user" for t in c) for c in cleaned],
    )


def prompt_key_of(turns: list[dict]) -> str:
    """Duplicate key of a conversation's prompts: its normalized user turns (answers get regenerated anyway)."""
    return "\x00".join(normalize_text(t["content"]) for t in turns if t["role"] == "user")


def _token_lengths(tokenizer, texts: list[str], chunk: int = 256) -> list[int]:
    out = []
    for i in range(0, len(texts), chunk):
        out += [len(ids) for ids in tokenizer(texts[i : i + chunk], add_special_tokens=False)["input_ids"]]
    return out


# ---------------------------------------------------------------------------------------------- on-policy score


def encode_for_scoring(tokenizer, turns: list[dict], max_tokens: int) -> tuple[list[int], list[bool]] | None:
    """Chat-template token ids of the conversation and a mask over the assistant answers' tokens (each answer's
    text and end-of-turn). Truncated to max_tokens; None when no answer token survives.

    The rendered text is cut at every answer boundary and each piece tokenized on its own, as generation sees it
    (the answer starts after the generation prompt's tokens), so BPE never merges across a boundary."""
    turns, _, _ = clean_turns(turns)
    ids, mask, done = [], [], ""
    for i, turn in enumerate(turns):
        if turn["role"] != "assistant":
            continue
        prefix = tokenizer.apply_chat_template(turns[:i], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(turns[: i + 1], tokenize=False)
        if not (prefix.startswith(done) and full.startswith(prefix)):
            break  # a template that is not incremental here: stop rather than mislabel tokens
        context, answer = _ids(tokenizer, prefix[len(done) :]), _ids(tokenizer, full[len(prefix) :])
        ids += context + answer
        mask += [False] * len(context) + [True] * len(answer)
        done = full
        if len(ids) >= max_tokens:
            break
    ids, mask = ids[:max_tokens], mask[:max_tokens]
    return (ids, mask) if any(mask[1:]) else None


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@dataclass
class OnPolicyScore:
    source: str
    nll: float  # mean negative log-likelihood per answer token (nats); lower = closer to the target
    ci_low: float  # 95% bootstrap interval over records
    ci_high: float
    n_records: int  # records scored (the sample size)
    n_tokens: int  # answer tokens scored
    max_tokens: int
    dtype: str
    seconds: float
    per_record_nll: list = field(default_factory=list, repr=False)  # summed NLL of each record's answer tokens
    per_record_tokens: list = field(default_factory=list, repr=False)

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)

    def row(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if not isinstance(v, list)}
        d["perplexity"] = round(self.perplexity, 2)
        return d


@torch.inference_mode()
def token_nll(
    model, batch: list[tuple[list[int], list[bool]]], pad_id: int, chunk: int = 1024
) -> list[tuple[float, int]]:
    """(summed NLL, token count) of the masked tokens of each sequence, in one right-padded forward.

    Only masked positions go through the output head, so memory stays at chunk x vocab, not T x vocab."""
    base = getattr(model, model.base_model_prefix)
    head = model.get_output_embeddings()
    T = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), T), dtype=torch.long)
    target_mask = torch.zeros((len(batch), T), dtype=torch.bool)
    for b, (ids, mask) in enumerate(batch):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attn[b, : len(ids)] = 1
        target_mask[b, 1 : len(ids)] = torch.tensor(mask[1:])
    device = next(model.parameters()).device
    input_ids, attn, target_mask = input_ids.to(device), attn.to(device), target_mask.to(device)
    hidden = base(input_ids=input_ids, attention_mask=attn).last_hidden_state
    rows, cols = target_mask.nonzero(as_tuple=True)
    sums = torch.zeros(len(batch), dtype=torch.float64, device=device)
    for k in range(0, rows.numel(), chunk):
        r, c = rows[k : k + chunk], cols[k : k + chunk]
        logits = head(hidden[r, c - 1]).float()  # the state at t-1 predicts token t
        nll = torch.nn.functional.cross_entropy(logits, input_ids[r, c], reduction="none")
        sums.index_add_(0, r, nll.double())
    counts = target_mask.sum(1)
    return [(float(sums[b]), int(counts[b])) for b in range(len(batch))]


def onpolicy_score(
    model,
    tokenizer,
    records: list[Record],
    *,
    samples: int = 64,
    seed: int = 0,
    batch_size: int = 8,
    max_tokens: int = 512,
    bootstrap: int = 1000,
    progress: bool = True,
) -> OnPolicyScore:
    """The target's mean per-token NLL of a source's own answers (references count as answers), over a seeded
    sample of `samples` scorable records, with a 95% bootstrap interval (records resampled)."""
    from tqdm.auto import tqdm

    start = time.perf_counter()
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    encoded = []
    for i in order:  # walk a seeded permutation so unscorable records (no answer) are replaced, not counted
        enc = encode_for_scoring(tokenizer, with_reference(records[i]), max_tokens)
        if enc is not None:
            encoded.append(enc)
            if len(encoded) >= samples:
                break
    if not encoded:
        raise ValueError(f"source {records[0].source if records else '?'}: no record has an answer to score")
    encoded.sort(key=lambda e: len(e[0]))  # length-sorted batches waste little on padding
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    results = []
    for k in tqdm(
        range(0, len(encoded), batch_size), desc=f"on-policy {records[0].source}", disable=not progress, unit="batch"
    ):
        results += token_nll(model, encoded[k : k + batch_size], pad)
    nll = np.array([s for s, _ in results])
    tok = np.array([c for _, c in results])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(results), size=(bootstrap, len(results)))
    boot = nll[idx].sum(1) / tok[idx].sum(1)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    return OnPolicyScore(
        source=records[0].source,
        nll=float(nll.sum() / tok.sum()),
        ci_low=float(np.percentile(boot, 2.5)),
        ci_high=float(np.percentile(boot, 97.5)),
        n_records=len(results),
        n_tokens=int(tok.sum()),
        max_tokens=max_tokens,
        dtype=dtype,
        seconds=round(time.perf_counter() - start, 2),
        per_record_nll=nll.tolist(),
        per_record_tokens=tok.tolist(),
    )


# ------------------------------------------------------------------------------------------- regeneration cost


def project_regeneration(n_prompts: int, tokens_per_prompt, throughput_tok_s) -> dict:
    """Tokens to generate and hours at a throughput; either argument may be a (low, high) pair.

    The seeds' figure: 83,288 prompts at 830 tok/s with 861-1,973 tokens per prompt gives 24-55 h."""
    lo_tpp, hi_tpp = _pair(tokens_per_prompt)
    lo_thr, hi_thr = _pair(throughput_tok_s)
    if min(lo_thr, hi_thr) <= 0:
        raise ValueError(f"throughput must be positive, got {throughput_tok_s}")
    tokens = (n_prompts * lo_tpp, n_prompts * hi_tpp)
    hours = (tokens[0] / max(lo_thr, hi_thr) / 3600, tokens[1] / min(lo_thr, hi_thr) / 3600)
    return {
        "prompts": int(n_prompts),
        "tokens_per_prompt": [lo_tpp, hi_tpp],
        "throughput_tok_s": [lo_thr, hi_thr],
        "tokens": [int(round(t)) for t in tokens],
        "hours": [round(h, 2) for h in hours],
    }


def regeneration_projections(
    inventories: dict[str, Inventory],
    shares: dict[str, int],
    throughput_tok_s: float,
    *,
    max_new_tokens: int,
    max_turns: int,
    available: dict[str, int] | None = None,
) -> list[dict]:
    """Projected regeneration cost of each training source: the whole source (`available` records, before per-set
    caps), what its set caps keep when they cut, and its mixture share (`shares`: conversations per source)."""
    rows = []
    for sid, inv in inventories.items():
        tpp = tokens_per_prompt(inv, max_new_tokens, max_turns)
        whole = (available or {}).get(sid, inv.records)
        scopes = [("whole source", whole)] + ([("after set caps", inv.records)] if whole != inv.records else [])
        for scope, n in scopes + [("mixture share", shares.get(sid, 0))]:
            p = project_regeneration(n, tpp, throughput_tok_s)
            rows.append(
                {
                    "source": sid,
                    "scope": scope,
                    "prompts": n,
                    "tokens_per_prompt": tpp,
                    "tokens": p["tokens"],
                    "hours": p["hours"],
                }
            )
    return rows


def _pair(x) -> tuple[float, float]:
    if isinstance(x, (tuple, list)):
        lo, hi = x
        return float(lo), float(hi)
    return float(x), float(x)


def tokens_per_prompt(inv: Inventory, max_new_tokens: int, max_turns: int) -> tuple[float, float]:
    """Expected tokens the target generates per record, as a (low, high) bracket.

    Regeneration answers each of the first `max_turns` user turns, each answer capped at `max_new_tokens`. Low:
    the target answers as long as the source did (source lengths, capped); high: every answer runs to the cap.
    Records without a source answer count at the cap in both."""
    lows, highs = [], []
    for answers, n_user in zip(inv.per_record_responses, inv.per_record_user_turns):
        n = min(n_user, max_turns)
        high = n * max_new_tokens
        known = [min(a, max_new_tokens) for a in answers[:n]]
        lows.append(sum(known) + (n - len(known)) * max_new_tokens)
        highs.append(high)
    if not lows:
        return 0.0, 0.0
    return round(float(np.mean(lows)), 1), round(float(np.mean(highs)), 1)


@torch.inference_mode()
def measure_throughput(model, tokenizer, prompts: list[str], *, batch_size: int = 8, new_tokens: int = 32) -> float:
    """Batched greedy generation tokens/s on this machine (a quick estimate; `eagle3lab regen` reports the real one)."""
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts[:batch_size]
    ]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(
            texts, return_tensors="pt", padding=True, truncation=True, max_length=256, add_special_tokens=False
        )
    finally:
        tokenizer.padding_side = side
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    enc = enc.to(device)
    start = clock(device)
    out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
    elapsed = clock(device) - start
    return (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0] / elapsed
