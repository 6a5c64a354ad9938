"""The doctor knows every draft config field an engine reads: each engine's table (engines/<engine>/fields.py) lists
them, every field some engine serves silently when it is wrong has a check, and each check fires on a copy of the
committed draft with that field broken (and on no other field), with the engine's own consequence in its evidence."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import TRAINED_DRAFT
from eagle3lab.doctor.diagnosis import diagnose
from eagle3lab.doctor.findings import ERROR, OK, WARNING
from eagle3lab.drafters.eagle3.fields import CHECKED_ELSEWHERE, RULES
from eagle3lab.engines.registry import ENGINES
from eagle3lab.paths import ROOT

TARGET = "smollm2-135m-instruct"
VLLM_LINE = (
    "python -m vllm.entrypoints.openai.api_server --model T --speculative-config "
    """'{{"method": "eagle3", "model": "{draft}", "num_speculative_tokens": 2}}'"""
)
LLAMACPP_LINE = "llama-server -m T.gguf -md D.gguf --spec-type draft-eagle3 --spec-draft-n-max 2"


def test_every_field_an_engine_serves_silently_is_checked():
    for entry in ENGINES.values():
        names = [f.name for f in entry.fields]
        assert len(names) == len(set(names)), f"{entry.name}: a field listed twice"
        unchecked = [f.name for f in entry.fields if f.silent and f.name not in RULES | CHECKED_ELSEWHERE]
        assert not unchecked, f"{entry.title} serves these silently and the doctor does not check them: {unchecked}"
    read = {f.name for e in ENGINES.values() for f in e.fields}
    assert set(RULES) <= read, "a rule for a field no engine reads"


def draft_with(tmp_path, edit) -> str:
    folder = tmp_path / "draft"
    shutil.copytree(ROOT / TRAINED_DRAFT, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def field_findings(report):
    return [f for f in report.findings if f.check == "draft_fields"]


def test_the_committed_draft_passes_every_field_check():
    [ok] = field_findings(diagnose(draft=ROOT / TRAINED_DRAFT, target=TARGET))
    assert ok.severity == OK and str(len(RULES)) in ok.title


BROKEN = {
    "eagle_config.use_aux_hidden_state": lambda c: c["eagle_config"].update(use_aux_hidden_state=False),
    "norm_before_residual": lambda c: c.update(norm_before_residual=True),
    "norm_before_fc": lambda c: c.update(norm_before_fc=True),
    "norm_output": lambda c: c.update(norm_output=True),
    "fc_norm": lambda c: c.update(fc_norm=True),
    "attention_bias": lambda c: c.update(attention_bias=True),
    "bias": lambda c: c.update(bias=True),
    "rope_theta": lambda c: c.update(rope_theta=10000.0),
    "rope_scaling": lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "rms_norm_eps": lambda c: c.update(rms_norm_eps=1.0),
    "head_dim": lambda c: c.update(head_dim=32, num_attention_heads=18, num_key_value_heads=6),
    "num_hidden_layers": lambda c: c.update(num_hidden_layers=2),
    "hidden_act": lambda c: c.update(hidden_act="gelu"),
    "model_type": lambda c: c.pop("model_type"),
    "num_aux_hidden_states": lambda c: c.update(num_aux_hidden_states=2),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_field_is_found_before_launch(tmp_path, name):
    draft = draft_with(tmp_path, BROKEN[name])
    found = [f for f in field_findings(diagnose(draft=draft, target=TARGET)) if f.severity != OK]
    named = {f.title.split()[0] for f in found}
    assert name in named, [f.title for f in found]
    assert named <= {name, "num_attention_heads", "num_key_value_heads"}  # a head split breaks all three
    [finding] = [f for f in found if f.title.split()[0] == name]
    assert finding.fix.startswith(f'"{name.rpartition(".")[2]}": ')
    readers = [e.title for e in ENGINES.values() if name in {f.name for f in e.fields}]
    assert all(any(line.startswith(f"{t}: ") for line in finding.evidence) for t in readers)


def test_rope_theta_missing_is_the_engines_default_not_the_targets(tmp_path):
    draft = draft_with(tmp_path, lambda c: c.pop("rope_theta"))
    [err] = [f for f in field_findings(diagnose(draft=draft, target=TARGET)) if f.severity == ERROR]
    assert err.title.startswith("rope_theta None") and "100000" in err.title


def test_severity_follows_what_the_launch_engine_does_with_the_field(tmp_path):
    """use_aux_hidden_state false: vLLM drops fc without a word (an error), llama.cpp never reads it (a warning)."""
    draft = draft_with(tmp_path, BROKEN["eagle_config.use_aux_hidden_state"])
    in_vllm = field_findings(diagnose(launch=VLLM_LINE.format(draft=draft), draft=draft, target=TARGET))
    in_llamacpp = field_findings(diagnose(launch=LLAMACPP_LINE, draft=draft, target=TARGET))
    assert [f.severity for f in in_vllm] == [ERROR] and in_vllm[0].evidence[1].startswith("vLLM: ")
    assert [f.severity for f in in_llamacpp] == [WARNING] and in_llamacpp[0].evidence[1].startswith("llama.cpp: ")
