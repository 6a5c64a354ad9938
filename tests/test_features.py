"""Chat-template tokenization with the assistant-only mask, and the resumable offline feature cache."""

import json
from pathlib import Path

import pytest
import torch

from conftest import TINY_WIDTH
from eagle3lab.io import InputError
from eagle3lab.models.target import aux_hidden_indices, forward_with_aux, load_target
from eagle3lab.train.features import online_features, open_cache, tokenize_conversation, tokenize_file
from tiny import save_tiny_chat_model

pytestmark = pytest.mark.usefixtures("one_thread")


WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "to", "see", "the", "big", "red", "dog"]


def save_tiny_target(folder: Path, layers: int = 4) -> Path:
    """A random 4-layer Llama (hidden 64) with SmolLM2's tokenizer and ChatML template: real text, tiny compute."""
    return save_tiny_chat_model(
        folder,
        **TINY_WIDTH,
        num_hidden_layers=layers,
        vocab_size=49152,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def write_conversations(path: Path, n: int, seed: int = 0) -> Path:
    g = torch.Generator().manual_seed(seed)

    def text(k):
        return " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (k,), generator=g))

    with open(path, "w") as f:
        for i in range(n):
            turns = []
            for _ in range(1 + i % 3):
                turns += [
                    {"role": "user", "content": text(4 + i % 5)},
                    {"role": "assistant", "content": text(6 + i % 17)},
                ]
            f.write(json.dumps({"id": f"c{i}", "conversations": turns}) + "\n")
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_target(str(save_tiny_target(tmp_path_factory.mktemp("tiny"))))


def test_assistant_only_mask(tiny):
    tok = tiny.tokenizer
    msgs = [
        {"role": "assistant", "content": "Welcome back."},
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "It is four."},
    ]
    ids, mask = tokenize_conversation(tok, msgs, 1000, "x")
    assert ids.tolist() == tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"]
    learned = tok.decode(ids[mask])
    assert learned == "Welcome back.<|im_end|>It is four.<|im_end|>"
    assert "two plus" not in learned and "system" not in learned
    short_ids, short_mask = tokenize_conversation(tok, msgs, 12, "x")
    assert torch.equal(short_ids, ids[:12]) and torch.equal(short_mask, mask[:12])


def test_bad_records_name_file_record_and_field(tmp_path, tiny):
    cases = [
        ({"conversations": []}, "field 'id'"),
        ({"id": "a", "conversations": []}, "'conversations' is empty"),
        ({"id": "b", "conversations": [{"role": "gpt", "content": "x"}]}, "conversations[0]: field 'role'"),
        ({"id": "c", "conversations": [{"role": "user"}]}, "field 'content'"),
    ]
    for row, needle in cases:
        path = tmp_path / "bad.jsonl"
        path.write_text(
            json.dumps({"id": "ok", "conversations": [{"role": "user", "content": "hi"}]})
            + "\n"
            + json.dumps(row)
            + "\n"
        )
        with pytest.raises(InputError) as e:
            tokenize_file(path, tiny.tokenizer, 100)
        assert str(path) in str(e.value) and "record 2" in str(e.value) and needle in str(e.value)


def test_tokenize_file_skips_records_without_assistant_tokens(tmp_path, tiny):
    path = tmp_path / "d.jsonl"
    rows = [
        {"id": "u", "conversations": [{"role": "user", "content": "only a question"}]},
        {"id": "a", "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "an answer"}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs, stats = tokenize_file(path, tiny.tokenizer, 100)
    assert [r.id for r in recs] == ["a"] and [r.index for r in recs] == [1]
    assert stats["records"] == 2 and stats["skipped_no_assistant_tokens"] == 1


def test_cache_matches_target_resumes_and_grows(tmp_path, tiny):
    data = write_conversations(tmp_path / "train.jsonl", 10)
    recs, _ = tokenize_file(data, tiny.tokenizer, 128)
    cache = open_cache(tmp_path / "feat", data, tiny, None, 128, shard_records=4)
    first = cache.build(recs, tiny, 6, progress=False)  # a small data scale: records 0..5 -> shards 0, 1
    assert first["shards_built"] == 2 and not cache.missing_shards(6)
    index = cache.index(6)
    assert len(index) == 6
    ex = cache.load(*[index[5][i] for i in (0, 2, 3)])
    indices = aux_hidden_indices(tiny.num_layers)
    with torch.no_grad():
        ref = forward_with_aux(tiny.model, recs[5].input_ids[None], indices)
    assert ex["aux"].dtype == torch.float16 and ex["aux"].shape == (len(recs[5]), 3 * 64)
    torch.testing.assert_close(ex["aux"].float(), ref.aux[0], atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(ex["final"].float(), ref.final[0], atol=2e-2, rtol=1e-2)
    assert torch.equal(ex["argmax"], ref.logits[0].argmax(-1))
    assert torch.equal(ex["input_ids"], recs[5].input_ids) and torch.equal(ex["loss_mask"], recs[5].loss_mask)

    # a kill lost shard 1; a bigger scale needs shards 1 and 2: only those are computed, shard 0 is untouched
    cache.shard_path(1).unlink()
    stamp = cache.shard_path(0).stat().st_mtime_ns
    again = open_cache(tmp_path / "feat", data, tiny, None, 128, shard_records=4)
    assert again.folder == cache.folder
    assert again.build(recs, tiny, 10, progress=False)["shards_built"] == 2
    assert cache.shard_path(0).stat().st_mtime_ns == stamp and len(again.index(10)) == 10
    assert again.build(recs, tiny, 10, progress=False)["shards_built"] == 0

    # other capture layers or another max length: another cache
    assert open_cache(tmp_path / "feat", data, tiny, [0, 1, 2], 128, 4).folder != cache.folder
    assert open_cache(tmp_path / "feat", data, tiny, None, 64, 4).folder != cache.folder


def test_a_bf16_cache_is_its_own_and_leaves_the_target_in_fp32(tmp_path, tiny):
    data = write_conversations(tmp_path / "train.jsonl", 4)
    recs, _ = tokenize_file(data, tiny.tokenizer, 128)
    fp32 = open_cache(tmp_path / "feat", data, tiny, None, 128, shard_records=4)
    bf16 = open_cache(tmp_path / "feat", data, tiny, None, 128, shard_records=4, dtype="bfloat16")
    assert bf16.folder != fp32.folder
    for cache in (fp32, bf16):
        cache.build(recs, tiny, 4, progress=False)
    assert tiny.model.dtype == torch.float32  # the draft's embedding and head are copied from it
    exact, rounded = (c.load(*[c.index(4)[3][i] for i in (0, 2, 3)]) for c in (fp32, bf16))
    assert not torch.equal(exact["aux"], rounded["aux"])  # really computed in bf16
    torch.testing.assert_close(rounded["aux"].float(), exact["aux"].float(), atol=0.1, rtol=0.05)


def test_a_shard_written_for_a_smaller_scale_is_rebuilt_for_a_larger_one(tmp_path, tiny):
    data = write_conversations(tmp_path / "train.jsonl", 10)
    cache = open_cache(tmp_path / "feat", data, tiny, None, 128, shard_records=4)
    small, _ = tokenize_file(data, tiny.tokenizer, 128, limit=6)  # scale 6: shard 1 holds records 4, 5 only
    assert cache.build(small, tiny, 6, progress=False)["shards_built"] == 2
    assert len(cache.index(6)) == 6 and cache.missing_shards(10) == [1, 2]
    full, _ = tokenize_file(data, tiny.tokenizer, 128)
    assert cache.build(full, tiny, 10, progress=False)["shards_built"] == 2
    assert len(cache.index(10)) == 10
    assert cache.missing_shards(6) == [] and len(cache.index(6)) == 6  # the smaller scale still reads its prefix


def test_online_features_match_cache_on_padded_batch(tmp_path, tiny):
    data = write_conversations(tmp_path / "train.jsonl", 3)
    recs, _ = tokenize_file(data, tiny.tokenizer, 128)
    t = max(len(r) for r in recs)
    ids = torch.stack([torch.nn.functional.pad(r.input_ids, (0, t - len(r))) for r in recs])
    mask = torch.arange(t)[None] < torch.tensor([len(r) for r in recs])[:, None]
    out = online_features(tiny, ids, mask, aux_hidden_indices(tiny.num_layers))
    for b, r in enumerate(recs):
        with torch.no_grad():
            ref = forward_with_aux(tiny.model, r.input_ids[None], aux_hidden_indices(tiny.num_layers))
        torch.testing.assert_close(out["aux"][b, : len(r)], ref.aux[0], atol=1e-4, rtol=1e-4)
        assert torch.equal(out["argmax"][b, : len(r)], ref.logits[0].argmax(-1))


@pytest.mark.cuda
def test_cache_built_on_cuda_matches_the_cpu_one(tmp_path, tiny):
    """The cache stays fp16 on disk whichever device computes it; a GPU target gives the CPU's features."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gpu = load_target(str(tiny.path), device="cuda")
    data = write_conversations(tmp_path / "train.jsonl", 4)
    recs, _ = tokenize_file(data, tiny.tokenizer, 128)
    cpu_cache = open_cache(tmp_path / "cpu", data, tiny, None, 128, shard_records=4)
    gpu_cache = open_cache(tmp_path / "gpu", data, gpu, None, 128, shard_records=4)
    cpu_cache.build(recs, tiny, 4, progress=False)
    gpu_cache.build(recs, gpu, 4, progress=False)
    for shard, _, start, length in cpu_cache.index(4):
        a, b = cpu_cache.load(shard, start, length), gpu_cache.load(shard, start, length)
        assert b["aux"].dtype == torch.float16 and b["aux"].device.type == "cpu"
        torch.testing.assert_close(b["aux"].float(), a["aux"].float(), atol=2e-2, rtol=2e-2)
    ids = recs[0].input_ids[None]
    out = online_features(gpu, ids, torch.ones_like(ids, dtype=torch.bool), aux_hidden_indices(gpu.num_layers))
    assert out["aux"].device.type == "cuda"


def test_batched_feature_groups_respect_the_budget_and_keep_order(tmp_path, tiny):
    from eagle3lab.train.features import length_groups, record_features

    recs, _ = tokenize_file(write_conversations(tmp_path / "train.jsonl", 9), tiny.tokenizer, 128)
    groups = length_groups(recs, 300)
    assert sorted(r.index for g in groups for r in g) == sorted(r.index for r in recs)
    assert all(len(g) == 1 or len(g) * max(len(r) for r in g) <= 300 for g in groups) and len(groups) < len(recs)
    indices = aux_hidden_indices(tiny.num_layers)
    single = record_features(tiny.model, recs, indices)  # the CPU default: one record per forward
    batched = record_features(tiny.model, recs, indices, batch_tokens=300)  # the GPU path, here on the CPU
    assert [f[0].shape[0] for f in batched] == [len(r) for r in recs] and batched[0][0].dtype == torch.float16
    for (a1, f1, m1), (a2, f2, m2) in zip(single, batched, strict=True):
        torch.testing.assert_close(a2.float(), a1.float(), atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(f2.float(), f1.float(), atol=2e-3, rtol=2e-3)
        assert (m1 == m2).float().mean() > 0.99
