"""DFlash: the config and checkpoint the engines read, the block mask, training (loss, resume, held-out pick), the
local engine's greedy block decoding (identical to plain greedy) and exact offline acceptance equal to it."""

import json

import pytest
import torch

from conftest import TINY_WIDTH
from eagle3lab.benchmark.prompts import encode_chat
from eagle3lab.decoding.engine import generate
from eagle3lab.decoding.offline import walk
from eagle3lab.drafters.dflash.config import DFlashConfig, default_target_layers
from eagle3lab.drafters.dflash.engine import DFlashEngine, target_indices
from eagle3lab.drafters.dflash.model import DFlashDraft, block_mask, draft_blocks, load_dflash, save_dflash
from eagle3lab.drafters.dflash.offline import block_hits
from eagle3lab.drafters.dflash.train import DFlashTrainConfig, mask_token, train_dflash
from eagle3lab.io import InputError, read_jsonl
from eagle3lab.models.checkpoint import DraftFormatError
from eagle3lab.models.target import forward_with_aux, load_target
from test_features import WORDS, save_tiny_target
from tiny import save_tiny_chat_model

pytestmark = pytest.mark.usefixtures("one_thread")
TINY_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
TINY_FIELDS += ("vocab_size", "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id")


def tiny_config(**kw) -> DFlashConfig:
    base = dict(
        **TINY_WIDTH,
        head_dim=16,
        vocab_size=49152,
        num_target_layers=4,
        target_layer_ids=[1, 1, 0],
        mask_token_id=16,
        block_size=4,
    )
    return DFlashConfig(**{**base, **kw}).checked()


def test_config_is_what_vllm_and_llamacpp_read_and_round_trips():
    cfg = tiny_config(num_hidden_layers=2)
    hf = cfg.to_hf()
    assert hf["architectures"] == ["DFlashDraftModel"] and hf["block_size"] == 4 and hf["is_causal"] is False
    assert hf["dflash_config"] == {"block_size": 4, "mask_token_id": 16, "target_layer_ids": [1, 1, 0]}
    assert DFlashConfig.from_hf(json.loads(json.dumps(hf))) == cfg
    assert default_target_layers(30) == [1, 14, 26]  # SmolLM2: the EAGLE-3 cache's hidden_states[2, 15, 27]
    for broken, message in (
        ({k: v for k, v in hf.items() if k != "block_size"} | {"dflash_config": {}}, "block_size"),
        (hf | {"is_causal": True}, "both ways"),
        (hf | {"architectures": ["LlamaForCausalLMEagle3"]}, "DFlashDraftModel"),
        (hf | {"dflash_config": hf["dflash_config"] | {"target_layer_ids": [3]}}, "target_layer_ids"),
        (hf | {"dflash_config": {"block_size": 4, "target_layer_ids": [1]}}, "mask_token_id"),
    ):
        with pytest.raises(DraftFormatError, match=message):
            DFlashConfig.from_hf(broken, where="draft/config.json")


def test_block_mask_sees_context_before_its_anchor_and_its_whole_block():
    mask = block_mask(torch.tensor([2, 4]), context_len=5, block_size=2)
    assert mask.tolist() == [
        [True, True, False, False, False, True, True, False, False],
        [True, True, False, False, False, True, True, False, False],
        [True, True, True, True, False, False, False, True, True],
        [True, True, True, True, False, False, False, True, True],
    ]


def test_checkpoint_round_trips_and_names_what_is_wrong(tmp_path):
    torch.manual_seed(0)
    draft = DFlashDraft(tiny_config())
    save_dflash(draft, tmp_path / "d")
    names = set(json.loads((tmp_path / "d" / "config.json").read_text())) & {"embed_tokens", "lm_head"}
    assert not names
    back = load_dflash(tmp_path / "d")
    assert all(torch.equal(back.state_dict()[k], v) for k, v in draft.state_dict().items())
    state = {**draft.state_dict(), "lm_head.weight": torch.zeros(3)}
    from eagle3lab.models.checkpoint import write_checkpoint

    write_checkpoint(tmp_path / "extra", draft.config.to_hf(), state)
    with pytest.raises(DraftFormatError, match=r"unexpected keys \['lm_head.weight'\]"):
        load_dflash(tmp_path / "extra")


def test_mask_token_is_a_spare_row_or_the_rarest_special_token():
    class Tokenizer:
        all_special_ids = [0, 1, 2]
        added_tokens_decoder = {0: "", 1: "", 2: "", 16: ""}

        def __len__(self):
            return 20

    counts = torch.zeros(30, dtype=torch.long)
    assert mask_token(Tokenizer(), 30, counts) == 20  # a row past the tokenizer's
    counts[16] = 5
    assert mask_token(Tokenizer(), 20, counts) == 2  # no spare row: the unseen special token of highest id


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny target, its own greedy answers to 24 prompts as training data (and 4 held out), and a DFlash draft
    trained on them. Its weights are drawn wider than the usual tiny target's, whose answers are one token repeated:
    these start varied and fall into loops, so blocks hit some tokens and miss others."""
    root = tmp_path_factory.mktemp("dflash")
    config = json.loads((save_tiny_target(root / "tiny") / "config.json").read_text())
    save_tiny_chat_model(root / "tiny", **{k: config[k] for k in TINY_FIELDS}, initializer_range=0.1)
    target = load_target(str(root / "tiny"))
    g = torch.Generator().manual_seed(0)

    def conversations(path, n):
        with open(path, "w") as f:
            for i in range(n):
                question = " ".join(WORDS[int(k)] for k in torch.randint(0, len(WORDS), (5,), generator=g))
                messages = [{"role": "user", "content": question}]
                prompt = encode_chat(target.tokenizer, messages)
                answer = generate(target.model, prompt, 24).tokens
                text = target.tokenizer.decode(answer, skip_special_tokens=True)
                f.write(
                    json.dumps({"id": f"c{i}", "conversations": messages + [{"role": "assistant", "content": text}]})
                    + "\n"
                )
        return path

    cfg = DFlashTrainConfig(
        data=str(conversations(root / "train.jsonl", 24)),
        val=str(conversations(root / "val.jsonl", 4)),
        output=str(root / "run"),
        target=str(root / "tiny"),
        features_cache=str(root / "features"),
        epochs=30,
        batch_tokens=512,
        max_len=160,
        lr=3e-3,
        eval_every=40,
        checkpoint_every=25,
        dtype="fp32",
        progress=False,
    )
    return {"root": root, "target": target, "cfg": cfg, "result": train_dflash(cfg)}


def test_training_learns_and_exports_its_best_held_out_draft(trained):
    result, cfg = trained["result"], trained["cfg"]
    rows = list(read_jsonl(trained["root"] / "run" / "metrics.jsonl"))
    train_rows = [r for r in rows if r["split"] == "train"]
    assert train_rows[-1]["loss"] < train_rows[0]["loss"] and train_rows[-1]["acc_pos"][0] > 0.3
    held_out = [r["accept_length"] for r in rows if r["split"] == "val"]
    assert result["best"]["accept_length"] == max(held_out) > 1.0
    draft = load_dflash(result["draft"])
    assert draft.config.target_layer_ids == [1, 1, 0] and draft.config.block_size == cfg.block_size


def test_a_killed_run_resumes_to_the_same_weights(trained, tmp_path):
    from dataclasses import replace

    class Killed(Exception):
        pass

    def kill(step, row):
        if step == 7:
            raise Killed

    base = replace(trained["cfg"], epochs=2, eval_every=3, checkpoint_every=4)
    whole = train_dflash(replace(base, output=str(tmp_path / "whole")))
    with pytest.raises(Killed):
        train_dflash(replace(base, output=str(tmp_path / "killed")), on_step=kill)
    resumed = train_dflash(replace(base, output=str(tmp_path / "killed"), resume=True))
    assert resumed["param_checksum"] == whole["param_checksum"] and resumed["best"] == whole["best"]
    with pytest.raises(InputError, match="already holds a checkpoint"):
        train_dflash(replace(base, output=str(tmp_path / "whole")))


@pytest.mark.parametrize("k", [None, 2, 1])
def test_block_decoding_is_greedy_and_offline_acceptance_equals_it(trained, k):
    """At the whole block (k None) and truncated to the anchor and k masks, as the engines serve k < block - 1."""
    target = trained["target"]
    draft = load_dflash(trained["result"]["draft"], dtype=torch.float32)
    engine = DFlashEngine(target.model, draft, drafted=k)
    accepted = 0
    for i, row in enumerate(read_jsonl(trained["cfg"].val)):
        prompt = encode_chat(target.tokenizer, row["conversations"][:1])
        plain = generate(target.model, prompt, 20)
        block = engine.generate(prompt, 20)
        assert block.tokens == plain.tokens, f"prompt {i}"
        assert max(block.accepted) <= engine.drafted
        ids = torch.tensor(prompt + block.tokens)
        features = forward_with_aux(target.model, ids[None], target_indices(draft)).aux[0]
        hits = block_hits(draft, engine.embed, engine.head, features, ids, first=len(prompt) - 1, drafted=k)
        offline = walk(hits, len(prompt), len(block.tokens), engine.drafted)
        # the last round may verify drafts past the length limit, which the offline walk counts as misses
        assert offline[:-1] == block.accepted[:-1] and offline[-1] <= block.accepted[-1], f"prompt {i}"
        accepted += sum(block.accepted)
    assert accepted > 0


def test_a_truncated_block_is_its_own_forward_not_the_whole_blocks_first_slots(trained):
    """The slots see each other: the first slot of a block of anchor + 1 mask is not the first slot of the whole
    block (so the offline profile at k must draft the truncated block, as the engines do)."""
    target = trained["target"]
    draft = load_dflash(trained["result"]["draft"], dtype=torch.float32)
    ids = torch.tensor(encode_chat(target.tokenizer, [{"role": "user", "content": "a b c d e f"}]))
    features = forward_with_aux(target.model, ids[None], target_indices(draft)).aux[0]
    embed, head = target.model.get_input_embeddings().weight, target.model.lm_head.weight
    anchors = torch.arange(1, ids.numel())
    with torch.inference_mode():
        whole = draft_blocks(draft, embed, head, features, ids, anchors)
        short = draft_blocks(draft, embed, head, features, ids, anchors, drafted=1)
    assert whole.shape[1] == draft.config.drafted and short.shape[1] == 1
    assert not torch.allclose(whole[:, 0], short[:, 0])
    with pytest.raises(ValueError, match="drafts 1 to 3 tokens"):
        DFlashEngine(target.model, draft, drafted=4)


def test_live_curves_take_a_dflash_runs_rows(trained):
    """DFlash's held-out rows carry its exact accept length alone (no loss, no per-position accuracy): the stage's
    dvclive curves log what each row has."""
    from eagle3lab.train.live import curve_values

    rows = list(read_jsonl(trained["root"] / "run" / "metrics.jsonl"))
    val = next(r for r in rows if r["split"] == "val")
    assert curve_values(val) == {"val/accept_length": val["accept_length"]}
    train = next(r for r in rows if r["split"] == "train")
    assert curve_values(train) == {"train/loss": train["loss"], "train/tokens_per_s": train["tokens_per_s"]}
