"""The static doctor (a launch line, a draft folder, a target config; no --server) imports no torch: importing torch
costs seconds, most of the doctor's run. Each check runs in a fresh interpreter, since this one has torch already."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRAFT = ROOT / "drafts" / "smollm2-original-6960"
# README's "Try it in one minute", served with the right algorithm
LAUNCH = (
    "python -m sglang.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct "
    f"--speculative-draft-model-path {DRAFT} --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4 --context-length 2048 --speculative-algorithm EAGLE3"
)
HEAVY = ("torch", "transformers")
# SmolLM2-135M-Instruct's config.json, what the embedded target converts to (the conversion itself needs torch)
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pad_token_id": 2,
    "rms_norm_eps": 9.999999747378752e-06,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "unk_token_id": 0,
    "vocab_size": 49152,
}


def fresh(code: str) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON object as its last line."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_doctor_imports_no_torch():
    out = fresh(
        "import json, sys\n"
        "import eagle3lab.doctor.cli\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    assert out == []


def test_a_static_diagnosis_reads_the_vocab_maps_without_torch(tmp_path):
    target = tmp_path / "smollm2"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(SMOLLM2))
    out = fresh(
        "import json, sys\n"
        "from eagle3lab.doctor.diagnosis import diagnose\n"
        f"report = diagnose(launch={LAUNCH!r}, draft={str(DRAFT)!r}, target={str(target)!r})\n"
        "findings = [[f.check, f.severity, f.title, f.evidence] for f in report.findings]\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps({'findings': findings, 'exit': report.exit_code, 'heavy': heavy}))\n"
    )
    assert out["heavy"] == []
    assert out["exit"] == 0 and {f[1] for f in out["findings"]} == {"ok"}  # as README's EAGLE3 call: all ok
    vocab = [f for f in out["findings"] if f[0] == "draft_vocab"]
    # d2t and t2d were read in full (numpy): the target ids they reach and the ids t2d marks
    assert [f[1] for f in vocab] == ["ok"]
    assert "d2t/t2d consistent" in vocab[0][2]
    assert vocab[0][3] == ["d2t [4096] int64: target ids 2..48781", "t2d [49152]: 4096 target ids marked"]
    checks = {f[0] for f in out["findings"]}
    assert {"launch", "target", "draft", "algorithm", "aux_layers", "draft_fields", "spec_params"} <= checks
