"""Training inputs for the draft: chat-template tokenization with an assistant-only loss mask, and the offline cache
of target features (aux hidden states [T, 3H], final hidden state [T, H], target argmax) in half precision.

The cache is keyed by data hash + target + capture layers + max length + chat template, so every draft trained on
the same data (each data scale, each vocab size) reuses it. It is written in shards of consecutive records, each
moved into place atomically: a killed build resumes where it stopped, and a larger data scale (a longer prefix of
the same file) only computes the shards it adds. The final hidden state is what the loss needs: the target's
distribution over any draft vocabulary is softmax(final @ W_head[draft ids].T), exact, and independent of the draft
vocab size (cheaper on disk than logits: H halves per token); the argmax over the full vocabulary (4 bytes) decides
which positions the draft vocabulary can score."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3lab.io import InputError, atomic_path, read_jsonl, require, sha256_file, write_json
from eagle3lab.models.target import Target, aux_hidden_indices, forward_with_aux

ROLES = ("system", "user", "assistant")
FORMAT_VERSION = 1


# ---- tokenization --------------------------------------------------------------------------------------------------


@dataclass
class Tokenized:
    index: int  # line order of the record in its file (data scales are prefixes of the file)
    id: str
    input_ids: torch.Tensor  # [T] long
    loss_mask: torch.Tensor  # [T] bool, True on assistant tokens (the tokens the draft learns to predict)

    def __len__(self):
        return self.input_ids.numel()


def _render(tokenizer, messages, generation_prompt=False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer, messages: list[dict], where: str) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each assistant turn (content + end-of-turn token).

    A turn's span starts where rendering the conversation before it with a generation prompt ends, and ends where
    rendering up to it ends (trailing whitespace excluded), so the template alone decides what the draft learns."""
    full = _render(tokenizer, messages)
    spans = []
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        try:
            head = _render(tokenizer, messages[:k], generation_prompt=True)
        except Exception:  # some templates refuse an empty or assistant-less conversation
            head = None
        upto = _render(tokenizer, messages[: k + 1])
        if not full.startswith(upto):
            raise InputError(f"{where}: turn {k}: the chat template does not render conversations prefix-stably")
        if head is not None and upto.startswith(head):
            start = len(head)
        else:  # locate the content itself after the previous turn
            start = full.find(msg["content"], len(_render(tokenizer, messages[:k])) if k else 0)
            if start < 0:
                raise InputError(f"{where}: turn {k}: assistant content not found in the rendered conversation")
        end = len(upto.rstrip())
        spans.append((start, end))
    return full, spans


def tokenize_conversation(
    tokenizer, messages: list[dict], max_len: int, where: str
) -> tuple[torch.Tensor, torch.Tensor]:
    text, spans = assistant_spans(tokenizer, messages, where)
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids = torch.tensor(enc["input_ids"][:max_len], dtype=torch.long)
    starts = torch.tensor([s for s, _ in enc["offset_mapping"][:max_len]], dtype=torch.long)
    mask = torch.zeros(ids.numel(), dtype=torch.bool)
    for s, e in spans:
        mask |= (starts >= s) & (starts < e)
    return ids, mask


def validate_record(row: dict, where: str) -> tuple[str, list[dict]]:
    rid = str(require(row, "id", where, (str, int)))
    where = f"{where} (id {rid})"
    convs = require(row, "conversations", where, list)
    if not convs:
        raise InputError(f"{where}: field 'conversations' is empty")
    messages = []
    for k, turn in enumerate(convs):
        at = f"{where}: conversations[{k}]"
        if not isinstance(turn, dict):
            raise InputError(f"{at}: expected an object with 'role' and 'content'")
        role = require(turn, "role", at, str)
        if role not in ROLES:
            raise InputError(f"{at}: field 'role' is '{role}', expected one of {list(ROLES)}")
        messages.append({"role": role, "content": require(turn, "content", at, str)})
    return rid, messages


def tokenize_file(path, tokenizer, max_len: int, limit: int | None = None) -> tuple[list[Tokenized], dict]:
    """Tokenize a ShareGPT-style JSONL file; records without any assistant token (after truncation) are skipped
    and counted. Returns (records, stats)."""
    path = Path(path)
    out, skipped, n = [], 0, 0
    for i, row in enumerate(read_jsonl(path)):
        if limit is not None and i >= limit:
            break
        n += 1
        where = f"{path}: record {i + 1}"
        rid, messages = validate_record(row, where)
        ids, mask = tokenize_conversation(tokenizer, messages, max_len, f"{where} (id {rid})")
        if mask[2:].any():  # the draft's first prediction is token 2 (it reads token 1 and the state of token 0)
            out.append(Tokenized(i, rid, ids, mask))
        else:
            skipped += 1
    stats = {
        "records": n,
        "used": len(out),
        "skipped_no_assistant_tokens": skipped,
        "tokens": sum(len(r) for r in out),
        "loss_tokens": sum(int(r.loss_mask.sum()) for r in out),
    }
    return out, stats


# ---- offline feature cache -----------------------------------------------------------------------------------------

GPU_BATCH_TOKENS = 16384  # padded tokens per target forward when building the cache on a GPU


def length_groups(rows: list[Tokenized], batch_tokens: int) -> list[list[Tokenized]]:
    """Records of similar length packed so rows x longest <= batch_tokens (at least one record a group)."""
    groups = []
    for r in sorted(rows, key=len):  # ascending: the record joining a group is its longest
        if groups and len(r) * (len(groups[-1]) + 1) <= batch_tokens:
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


def padded_batch(group: list[Tokenized], device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A group's input ids right-padded to its longest record, and their attention mask (None for one record)."""
    t = max(len(r) for r in group)
    ids = torch.stack([torch.nn.functional.pad(r.input_ids, (0, t - len(r))) for r in group]).to(device)
    if len(group) == 1:
        return ids, None
    return ids, (torch.arange(t)[None] < torch.tensor([len(r) for r in group])[:, None]).to(device, torch.long)


def record_features(model, rows: list[Tokenized], indices: list[int], on_record=None, batch_tokens: int | None = None):
    """(aux fp16, final fp16, argmax int32) of each record, on the CPU, in `rows` order. By default one record per
    forward on the CPU (0.92 of the target's batched prefill rate there; batches were slower: docs/training.md) and
    right-padded batches of up to GPU_BATCH_TOKENS on a GPU."""
    device = next(model.parameters()).device
    if batch_tokens is None:
        batch_tokens = 0 if device.type == "cpu" else GPU_BATCH_TOKENS
    groups = length_groups(rows, batch_tokens) if batch_tokens else [[r] for r in rows]
    found = {}
    for group in groups:
        ids, mask = padded_batch(group, device)
        with torch.no_grad():
            out = forward_with_aux(model, ids, indices, attention_mask=mask)
        for b, r in enumerate(group):
            n = len(r)
            found[r.index] = (
                out.aux[b, :n].to(torch.float16).cpu(),
                out.final[b, :n].to(torch.float16).cpu(),
                out.logits[b, :n].argmax(-1).to(torch.int32).cpu(),
            )
            if on_record is not None:
                on_record(r)
    return [found[r.index] for r in rows]


def target_fingerprint(target: Target) -> str:
    """Identify the target's weights cheaply: config + a checksum of a slice of the embedding and of the last layer."""
    model = target.model
    emb = model.get_input_embeddings().weight
    last = next(reversed(list(model.parameters())))
    # summed on the CPU: the same key whichever device holds the target
    probe = [float(emb[:64].detach().cpu().double().sum()), float(last.detach().cpu().double().sum())]
    blob = json.dumps([target.spec, model.config.to_dict(), probe], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_key(data_sha: str, target: Target, indices: list[int], max_len: int, shard_records: int, dtype: str) -> dict:
    return {
        "format": FORMAT_VERSION,
        "data_sha256": data_sha,
        "target": target.spec,
        "target_fingerprint": target_fingerprint(target),
        "hidden_states_indices": list(indices),
        "max_len": max_len,
        "chat_template_sha256": hashlib.sha256(str(target.tokenizer.chat_template).encode()).hexdigest()[:16],
        "shard_records": shard_records,
        "dtype": dtype,
    }


class FeatureCache:
    """Shards `shard-NNNNN.safetensors` holding, for records [k*S, (k+1)*S) of the file, the concatenation of their
    tokens: aux fp16 [N, 3H], final fp16 [N, H], argmax int32 [N], input_ids int32 [N], loss_mask uint8 [N],
    offsets int64 [n+1]; metadata lists each record's file index and id."""

    def __init__(self, folder: Path, key: dict):
        self.folder = folder
        self.key = key
        self.shard_records = key["shard_records"]
        self._handles = {}
        self._index = None

    @staticmethod
    def locate(root, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        return Path(root) / digest

    def shard_path(self, k: int) -> Path:
        return self.folder / f"shard-{k:05d}.safetensors"

    def shard_end(self, k: int, n_records: int) -> int:
        """One past the last file record shard k must cover when the first n_records are used."""
        return min(n_records, (k + 1) * self.shard_records)

    def missing_shards(self, n_records: int) -> list[int]:
        """Shards absent, or written for a smaller scale (covering fewer records than this scale needs)."""
        from safetensors import safe_open

        missing = []
        for k in range(-(-n_records // self.shard_records)):
            path = self.shard_path(k)
            if not path.exists():
                missing.append(k)
                continue
            with safe_open(str(path), framework="pt") as f:
                if int(f.metadata()["end"]) < self.shard_end(k, n_records):
                    missing.append(k)
        return missing

    def build(self, records: list[Tokenized], target: Target, n_records: int, progress: bool = True) -> dict:
        """Compute every missing shard covering the first n_records records of the file. Returns build stats."""
        from safetensors.torch import save_file
        from tqdm import tqdm

        self.folder.mkdir(parents=True, exist_ok=True)
        meta = self.folder / "key.json"
        if not meta.exists():
            write_json(meta, self.key)
        todo = self.missing_shards(n_records)
        by_shard: dict[int, list[Tokenized]] = {}
        for r in records:
            if r.index < n_records:
                by_shard.setdefault(r.index // self.shard_records, []).append(r)
        tokens = sum(len(r) for k in todo for r in by_shard.get(k, []))
        indices = self.key["hidden_states_indices"]
        model, dtype = target.model, getattr(torch, self.key["dtype"])
        if todo and model.dtype != dtype:
            model = copy.deepcopy(model).to(dtype)  # the target itself stays as loaded
        bar = tqdm(total=tokens, unit="tok", desc="target features", disable=not progress or not tokens)
        for k in todo:
            rows = by_shard.get(k, [])
            aux, final, argmax = [], [], []
            for a, f, m in record_features(model, rows, indices, on_record=lambda r: bar.update(len(r))):
                aux.append(a)
                final.append(f)
                argmax.append(m)
            lengths = torch.tensor([0] + [len(r) for r in rows], dtype=torch.long)
            hidden = model.config.hidden_size
            tensors = {
                "aux": torch.cat(aux) if rows else torch.zeros(0, len(indices) * hidden, dtype=torch.float16),
                "final": torch.cat(final) if rows else torch.zeros(0, hidden, dtype=torch.float16),
                "argmax": torch.cat(argmax) if rows else torch.zeros(0, dtype=torch.int32),
                "input_ids": torch.cat([r.input_ids for r in rows]).to(torch.int32)
                if rows
                else torch.zeros(0, dtype=torch.int32),
                "loss_mask": torch.cat([r.loss_mask for r in rows]).to(torch.uint8)
                if rows
                else torch.zeros(0, dtype=torch.uint8),
                "offsets": lengths.cumsum(0),
            }
            metadata = {
                "record_index": json.dumps([r.index for r in rows]),
                "ids": json.dumps([r.id for r in rows]),
                "end": str(self.shard_end(k, n_records)),
            }
            with atomic_path(self.shard_path(k)) as tmp:
                save_file(tensors, str(tmp), metadata=metadata)
        bar.close()
        self._index = None
        return {"shards_built": len(todo), "tokens_computed": tokens, "folder": str(self.folder)}

    def index(self, n_records: int) -> list[tuple[int, int, int, int]]:
        """(shard, row, start, length) of every cached record among the first n_records of the file."""
        from safetensors import safe_open

        missing = self.missing_shards(n_records)
        if missing:
            raise FileNotFoundError(f"feature cache {self.folder} lacks shards {missing}; build it first")
        out = []
        for k in range(-(-n_records // self.shard_records)):
            with safe_open(str(self.shard_path(k)), framework="pt") as f:
                rec = json.loads(f.metadata()["record_index"])
                offsets = f.get_tensor("offsets")
            for row, idx in enumerate(rec):
                if idx < n_records:
                    start, end = int(offsets[row]), int(offsets[row + 1])
                    out.append((k, row, start, end - start))
        return out

    def load(self, shard: int, start: int, length: int) -> dict:
        from safetensors import safe_open

        if shard not in self._handles:
            self._handles[shard] = safe_open(str(self.shard_path(shard)), framework="pt")
        f = self._handles[shard]
        sl = slice(start, start + length)
        return {
            "input_ids": f.get_slice("input_ids")[sl].long(),
            "loss_mask": f.get_slice("loss_mask")[sl].bool(),
            "aux": f.get_slice("aux")[sl],
            "final": f.get_slice("final")[sl],
            "argmax": f.get_slice("argmax")[sl].long(),
        }


def open_cache(
    root,
    data_path,
    target: Target,
    layer_ids: list[int] | None,
    max_len: int,
    shard_records: int = 64,
    dtype: str = "float32",
) -> FeatureCache:
    """The cache of one data file's features, computed by the target in `dtype` (float32 or bfloat16)."""
    indices = aux_hidden_indices(target.num_layers, layer_ids)
    key = cache_key(sha256_file(data_path), target, indices, max_len, shard_records, dtype)
    return FeatureCache(FeatureCache.locate(root, key), key)


def online_features(target: Target, input_ids: torch.Tensor, attention_mask: torch.Tensor, indices: list[int]) -> dict:
    """The same features computed inside the training step (online mode), for a right-padded batch [B, T], on the
    target's device."""
    device = next(target.model.parameters()).device
    with torch.no_grad():
        out = forward_with_aux(
            target.model, input_ids.to(device), indices, attention_mask=attention_mask.to(device, torch.long)
        )
    return {"aux": out.aux, "final": out.final, "argmax": out.logits.argmax(-1)}
