import gzip
import json

import pandas as pd
import pytest

from eagle3lab.data.formats import clean_turns, detect_format, load_records, normalize_text
from eagle3lab.io import InputError

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]},
    {"id": "b", "conversations": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
]
MESSAGES = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a colour"},
            {"role": "assistant", "content": "Blue"},
        ]
    }
]
ALPACA = [
    {"instruction": "Reverse a list", "input": "[1, 2]", "output": "[2, 1]"},
    {"instruction": "Say hi", "input": "", "output": "hi"},
]
PROMPT_RESPONSE = [{"question": "What is 3*3?", "answer": "9"}]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sharegpt_jsonl_both_turn_styles(tmp_path):
    recs = load_records(_jsonl(tmp_path / "chat.jsonl", SHAREGPT), source="chat", category="chat")
    assert [r.id for r in recs] == ["chat/a", "chat/b"]
    assert recs[0].conversations == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    assert recs[1].conversations[1] == {"role": "assistant", "content": "4"}


def test_messages_json_array(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps(MESSAGES))
    (rec,) = load_records(p)
    assert [t["role"] for t in rec.conversations] == ["system", "user", "assistant"]
    assert rec.id == "m.json/0"


def test_alpaca_gzipped_jsonl(tmp_path):
    p = tmp_path / "alpaca.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in ALPACA)
    recs = load_records(p, source="alpaca")
    assert recs[0].conversations[0]["content"] == "Reverse a list\n\n[1, 2]"
    assert recs[1].conversations == [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]


def test_prompt_response_parquet_file(tmp_path):
    p = tmp_path / "qa.parquet"
    pd.DataFrame(PROMPT_RESPONSE).to_parquet(p)
    (rec,) = load_records(p)
    assert rec.conversations == [{"role": "user", "content": "What is 3*3?"}, {"role": "assistant", "content": "9"}]


def test_hub_layout_folder_with_splits(tmp_path):
    folder = tmp_path / "org" / "name"
    (folder / "data").mkdir(parents=True)
    rows = [
        {"id": i, "conversations": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
        for i in ("a", "b", "c")
    ]
    pd.DataFrame(rows[:1]).to_parquet(folder / "data" / "train-00000-of-00002.parquet")
    pd.DataFrame(rows[1:2]).to_parquet(folder / "data" / "train-00001-of-00002.parquet")
    pd.DataFrame(rows[2:]).to_parquet(folder / "data" / "test-00000-of-00001.parquet")
    (folder / "README.md").write_text("# card")
    train = load_records(folder, source="org/name", category="chat")
    assert sorted(r.id for r in train) == ["org/name/a", "org/name/b"]
    assert [r.prompt for r in load_records(folder, split="test")] == ["qc"]
    assert len(load_records(folder, limit=1)) == 1
    with pytest.raises(InputError, match="no split 'validation'; found"):
        load_records(folder, split="validation")


def test_jsonl_folder(tmp_path):
    _jsonl(tmp_path / "train.jsonl", MESSAGES)
    assert load_records(tmp_path)[0].conversations[-1]["content"] == "Blue"


def test_pretokenized_splits_turns_at_loss_mask(tmp_path, smollm2):
    tok = smollm2.tokenizer
    prompt = tok("What is the capital of France?", add_special_tokens=False)["input_ids"]
    answer = tok("Paris is the capital.", add_special_tokens=False)["input_ids"]
    rows = [{"input_ids": prompt + answer, "loss_mask": [0] * len(prompt) + [1] * len(answer)}]
    p = _jsonl(tmp_path / "tok.jsonl", rows)
    (rec,) = load_records(p, tokenizer=tok)
    assert rec.conversations == [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris is the capital."},
    ]
    # a ChatML-rendered conversation: the prompt side is parsed back into its system and user turns
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of Italy?"},
        {"role": "assistant", "content": "Rome."},
    ]
    prefix = tok(
        tok.apply_chat_template(chat[:2], tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )["input_ids"]
    full = tok(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)["input_ids"]
    loss_mask = [0] * len(prefix) + [1] * (len(full) - len(prefix))
    p2 = _jsonl(tmp_path / "chatml.jsonl", [{"input_ids": full, "loss_mask": loss_mask}])
    assert load_records(p2, tokenizer=tok)[0].conversations == chat
    with pytest.raises(InputError, match="needs the tokenizer"):
        load_records(p)
    bad = _jsonl(tmp_path / "bad.jsonl", [{"input_ids": [1, 2, 3], "loss_mask": [0, 1]}])
    with pytest.raises(InputError, match=r"bad.jsonl: record 0: field 'loss_mask' has 2 entries"):
        load_records(bad, tokenizer=tok)


def test_detection_error_names_file_and_columns(tmp_path):
    p = _jsonl(tmp_path / "weird.jsonl", [{"text": "x", "label": 1}])
    with pytest.raises(InputError, match=r"weird.jsonl: cannot tell the format from columns \['label', 'text'\]"):
        load_records(p)
    assert detect_format(["instruction", "input", "output"], "w") == "alpaca"
    assert detect_format(["problem", "solution"], "w") == "prompt_response"


def test_bad_inputs(tmp_path, monkeypatch):
    p = _jsonl(tmp_path / "roles.jsonl", [{"conversations": [{"from": "robot", "value": "beep"}]}])
    with pytest.raises(InputError, match=r"roles.jsonl: record 0: field 'conversations' turn 0: unknown role 'robot'"):
        load_records(p)
    with pytest.raises(InputError, match="no such file or folder"):
        load_records(tmp_path / "missing.jsonl")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InputError, match="unsupported file type"):
        load_records(tmp_path / "notes.txt")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    _jsonl(mixed / "a.jsonl", SHAREGPT)
    pd.DataFrame(PROMPT_RESPONSE).to_parquet(mixed / "b.parquet")
    with pytest.raises(InputError, match="mixes file types"):
        load_records(mixed)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"conversations": [\n')
    with pytest.raises(InputError, match="broken.jsonl: could not be read"):
        load_records(broken)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(InputError, match=r"open-r1/Mixture-of-Thoughts: hub dataset is not reachable.*download"):
        load_records("open-r1/Mixture-of-Thoughts")


def test_normalize_and_clean_turns():
    assert normalize_text("  Hello\tWORLD\n ") == normalize_text("hello world") == "hello world"
    assert normalize_text("ｆｕｌｌ") == "full"  # NFKC folds full-width forms
    turns = [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": "orphan"},
        {"role": "user", "content": " "},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    cleaned, leading, empty = clean_turns(turns)
    assert cleaned == [turns[0], turns[3], turns[4]] and (leading, empty) == (1, 1)
