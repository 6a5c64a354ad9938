"""SpecForge's inputs, written from one of our training runs so that both trainers see the same data: its feature
records from our feature cache, its vocabulary mapping and draft config from our draft, its run config from our run's
TTT length, epochs and maximum length.

SpecForge's offline feature file, one per conversation (torch.save): `{input_ids [T], loss_mask [T],
aux_hidden_state [1, T, 3H], hidden_state [1, T, H]}`, aux the three captured layers' outputs concatenated,
hidden_state the final state after the last norm, in bf16: the dtype of its draft and of its target head, which it
multiplies them with. Our cache holds the same states in fp16 (HF hidden_states[2, 15, 27] are SpecForge's layers
[1, 14, 26]) and the same assistant-token loss mask; SpecForge scores a draft position by that mask at the position
itself, ours at the token it predicts, so the two trainers weigh the turns' edges differently from the same mask.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3lab.io import InputError, atomic_path, require, sha256_file, write_json
from eagle3lab.models.checkpoint import open_checkpoint, read_json
from eagle3lab.models.target import resolve
from eagle3lab.train.features import FeatureCache

FEATURES = "features"
RECORD = "data_{:06d}.ckpt"  # SpecForge reads the files sorted by name: zero-padded, our record order
VOCAB_MAPPING = "vocab_mapping.pt"
DRAFT_CONFIG = "draft_config.json"
PROVENANCE = "inputs.json"
RUN_ID = "specforge"  # its checkpoints are RUN_ID-stepN/ under the run's output folder
# The shim's config-level CPU workarounds (train.specforge.cpu_shim lists them all).
CPU_SETTINGS = {"training": {"attention_backend": "sdpa"}, "data": {"dataloader_num_workers": 0}}


def our_run(folder) -> dict:
    """What SpecForge needs from one of our runs (a `train_draft` output folder): its settings, the feature cache
    folder and the number of file records it covers; errors name the file and field."""
    path = Path(folder) / "result.json"
    result = read_json(path)
    where = str(path)
    config = require(result, "config", where, dict)
    if config.get("online"):
        raise InputError(f"{where}: field 'config' says online: an online run has no feature cache to write from")
    cache = require(require(result, "features_cache", where, dict), "train", f"{where}: field 'features_cache'", dict)
    return {
        "folder": Path(folder),
        "config": config,
        "cache": Path(require(cache, "folder", f"{where}: field 'features_cache.train'", str)),
        "records": require(require(result, "data", where, dict), "records", f"{where}: field 'data'", int),
        "result_sha256": sha256_file(path),
    }


def write_feature_records(cache: FeatureCache, n_records: int, out: Path) -> dict:
    """One SpecForge feature file per cached record among the first n_records of the data file, written as one
    folder atomically. Returns the record and token counts."""
    try:
        index = cache.index(n_records)
    except FileNotFoundError as e:
        raise InputError(str(e)) from None
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        for k, (shard, _, start, length) in enumerate(index):
            record = cache.load(shard, start, length)
            features = {
                "input_ids": record["input_ids"].long(),
                "loss_mask": record["loss_mask"].long(),
                "aux_hidden_state": record["aux"].to(torch.bfloat16)[None],
                "hidden_state": record["final"].to(torch.bfloat16)[None],
            }
            torch.save(features, tmp / RECORD.format(k))
    return {"records": len(index), "tokens": sum(n for *_, n in index)}


def prepare_inputs(run_folder, out) -> dict:
    """SpecForge's inputs from our run in `out`: feature records, the vocabulary mapping and the draft config of
    our draft (so both drafts share d2t/t2d and shape), and their provenance. Kept when made from the same run."""
    run, out = our_run(run_folder), Path(out)
    provenance_path = out / PROVENANCE
    if provenance_path.exists():
        provenance = read_json(provenance_path)
        if provenance.get("result_sha256") == run["result_sha256"]:
            return provenance
    draft = open_checkpoint(run["folder"] / "draft")
    mapping = {name: draft.tensor(name) for name in ("d2t", "t2d")}
    missing = [name for name, tensor in mapping.items() if tensor is None]
    if missing:
        raise InputError(f"{draft.folder}: the draft has no {' and no '.join(missing)}: no vocabulary mapping to share")
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / VOCAB_MAPPING) as tmp:
        torch.save({"d2t": mapping["d2t"].long(), "t2d": mapping["t2d"].bool()}, tmp)
    write_json(out / DRAFT_CONFIG, draft.config)
    cache = FeatureCache(run["cache"], read_json(run["cache"] / "key.json"))
    counts = write_feature_records(cache, run["records"], out / FEATURES)
    provenance = {
        "run": str(run["folder"]),
        "result_sha256": run["result_sha256"],
        "feature_cache": str(run["cache"]),
        **counts,
        "settings": {k: run["config"][k] for k in ("target", "max_len", "ttt_length", "epochs", "aux_layer_ids")},
    }
    write_json(provenance_path, provenance)
    return provenance


def run_config(inputs, output, learning_rate: float | None = None) -> dict:
    """SpecForge's run config (`specforge train --config`) over the inputs in `inputs`, with our run's TTT length,
    epochs and maximum length, and SpecForge's own defaults for the rest: its learning rate unless one is given."""
    inputs, output = Path(inputs), Path(output)
    settings = read_json(inputs / PROVENANCE)["settings"]
    return {
        "model": {
            "target_model_path": str(resolve(settings["target"])),
            "draft_model_config": str(inputs / DRAFT_CONFIG),
            "vocab_mapping_path": str(inputs / VOCAB_MAPPING),
        },
        "data": {
            "hidden_states_path": str(inputs / FEATURES),
            "max_length": settings["max_len"],
            "cache_dir": str(output / "cache"),
            **CPU_SETTINGS["data"],
        },
        "training": {
            "num_epochs": settings["epochs"],
            "ttt_length": settings["ttt_length"],
            "log_interval": 10,
            **CPU_SETTINGS["training"],
            **({"learning_rate": learning_rate} if learning_rate is not None else {}),
        },
        "deployment": {"mode": "local_colocated"},
        "run_id": RUN_ID,
        "output_dir": str(output / "run"),
    }
