import copy

import pytest
import torch

from eagle3lab.models import target as target_mod
from eagle3lab.models.target import TargetError, aux_hidden_indices, forward_with_aux, load_target


def test_smollm2_answers_a_factual_question(smollm2):
    tok = smollm2.tokenizer
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = smollm2.model.generate(**enc, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
    assert (smollm2.num_layers, smollm2.hidden_size, smollm2.vocab_size) == (30, 576, 49152)


def test_default_and_explicit_layer_indices_follow_sglang():
    assert aux_hidden_indices(30) == [2, 15, 27]
    assert aux_hidden_indices(61) == [2, 30, 58]
    # an explicit id i is the output of layer i, i.e. hidden_states[i + 1]
    assert aux_hidden_indices(30, [1, 14, 26]) == [2, 15, 27]
    with pytest.raises(TargetError, match="outside the decoder layers"):
        aux_hidden_indices(30, [1, 14, 29])


@pytest.mark.parametrize("layer_ids", [None, [0, 3, 4]])
def test_aux_capture_equals_output_hidden_states(tiny_llama, layer_ids):
    ids = torch.randint(0, 320, (2, 11))
    indices = aux_hidden_indices(tiny_llama.config.num_hidden_layers, layer_ids)
    got = forward_with_aux(tiny_llama, ids, indices)
    ref = tiny_llama(ids, output_hidden_states=True)
    expected = torch.cat([ref.hidden_states[i] for i in indices], dim=-1)
    assert got.aux.shape == (2, 11, 3 * 64)
    torch.testing.assert_close(got.aux, expected)
    torch.testing.assert_close(got.final, ref.hidden_states[-1])
    torch.testing.assert_close(got.logits, ref.logits)


def test_aux_capture_on_smollm2_matches_hidden_states(smollm2):
    ids = smollm2.tokenizer("The quick brown fox jumps over the lazy dog.", return_tensors="pt").input_ids
    indices = aux_hidden_indices(smollm2.num_layers)
    got = forward_with_aux(smollm2.model, ids, indices)
    ref = smollm2.model(ids, output_hidden_states=True)
    torch.testing.assert_close(got.aux, torch.cat([ref.hidden_states[i] for i in indices], dim=-1))
    assert got.aux.shape[-1] == 1728


def test_unknown_spec_names_the_choices():
    with pytest.raises(TargetError, match="unknown target 'not-a-model'.*smollm2-135m-instruct"):
        load_target("not-a-model")


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(TargetError, match="has no config.json"):
        load_target(str(tmp_path))


def test_offline_hub_id_says_what_to_do(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable once, at import (earlier tests imported it): without this the lookup goes
    # to the network and, on a closed one, waits out its retries (about 45 s) before the same error
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TargetError, match="local-dir"):
        load_target("someone/some-model-that-is-not-cached")


def test_local_folder_target_loads(tmp_path, tiny_llama):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tiny_llama.save_pretrained(tmp_path)
    PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    ).save_pretrained(tmp_path)
    t = load_target(str(tmp_path))
    assert t.num_layers == 6 and not any(p.requires_grad for p in t.model.parameters())
    assert t.device == torch.device("cpu")
    auto = load_target(str(tmp_path), device="auto")
    assert auto.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="expected auto"):
        load_target(str(tmp_path), device="tpu")


@pytest.mark.cuda
def test_aux_capture_on_cuda_matches_cpu(tiny_llama):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ids = torch.randint(0, 320, (2, 11))
    indices = aux_hidden_indices(tiny_llama.config.num_hidden_layers)
    ref = forward_with_aux(tiny_llama, ids, indices)
    got = forward_with_aux(copy.deepcopy(tiny_llama).to("cuda"), ids.to("cuda"), indices)
    assert got.aux.device.type == "cuda"
    torch.testing.assert_close(got.aux.cpu(), ref.aux, atol=1e-4, rtol=1e-4)


def test_failed_conversion_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3LAB_CACHE", str(tmp_path))

    def broken(gguf, out):
        with target_mod.atomic_path(out) as tmp:
            tmp.mkdir()
            (tmp / "config.json").write_text("{}")
            raise KeyboardInterrupt  # killed mid-conversion

    monkeypatch.setattr(target_mod, "_convert_gguf", broken)
    with pytest.raises(KeyboardInterrupt):
        target_mod.resolve("smollm2-135m-instruct")
    assert not (tmp_path / "models" / "smollm2-135m-instruct").exists()
    assert list((tmp_path / "models").iterdir()) == []


def test_aux_capture_with_kv_cache_matches_full_forward(tiny_llama):
    ids = torch.randint(0, 320, (1, 12))
    indices = aux_hidden_indices(tiny_llama.config.num_hidden_layers)
    full = forward_with_aux(tiny_llama, ids, indices)
    first = forward_with_aux(tiny_llama, ids[:, :8], indices, use_cache=True)
    rest = forward_with_aux(tiny_llama, ids[:, 8:], indices, cache=first.cache, use_cache=True)
    torch.testing.assert_close(torch.cat([first.aux, rest.aux], dim=1), full.aux, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rest.logits, full.logits[:, 8:], atol=1e-5, rtol=1e-5)
