"""Bring a GPU run (what `pipeline.gpu_run` left in the device's $OUT) into the repository: its metrics and figures
under metrics/gpu and figures/gpu (`pipeline.report` renders the GPU run section of docs/results.md from them), and
its best draft under drafts/ with provenance.json, for `benchmark.third_party_drafts` so the CPU `make repro`
benchmarks it.

    python -m eagle3lab.pipeline.gpu_adopt RESULTS   # RESULTS: the folder the device call's files came back to
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
from pathlib import Path

from eagle3lab import paths
from eagle3lab.io import InputError, atomic_path, require, sha256_file, write_json
from eagle3lab.pipeline.gpu_run import YARDSTICK, yardstick


def adopt(results: Path, root: Path = paths.ROOT) -> Path:
    """Unpack `results` into root; returns the committed draft's folder."""
    run = json.loads((results / "run.json").read_text())
    if not run.get("exported_drafts"):
        raise ValueError(f"{results / 'run.json'}: no draft was exported; phases: {run['phases']}")
    metrics, figures = root / "metrics" / "gpu", root / "figures" / "gpu"
    with tarfile.open(results / "results.tar.gz") as tar:
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/")
            if member.isfile() and top in ("metrics", "figures") and "/" not in rest:
                folder = metrics if top == "metrics" else figures
                folder.mkdir(parents=True, exist_ok=True)
                (folder / rest).write_bytes(tar.extractfile(member).read())
    write_json(metrics / "run.json", run)
    best = run["exported_drafts"][0]
    target = json.loads((metrics / "benchmark.json").read_text())["final"]["meta"]["target"]
    folder = root / "drafts" / f"{target.split('-')[0]}-gpu-{best}"
    with atomic_path(folder) as tmp:
        shutil.copytree(results / "drafts" / best, tmp)
        write_json(tmp / "provenance.json", provenance(run, metrics, best) | {"sha256": weight_hashes(tmp)})
    return folder


def weight_hashes(folder: Path) -> dict[str, str]:
    """sha256 of each weight file of a draft folder (one, or shards), by file name."""
    return {f.name: sha256_file(f) for f in sorted(folder.glob("*.safetensors"))}


def read_provenance(folder: Path) -> dict | None:
    """A committed draft's provenance.json (the schema `provenance` writes), checked: the fields stage 05 places the
    draft by, and every weight file's sha256, so the record cannot silently describe other weights. None when the
    folder has none (a draft from elsewhere: benchmarked, but with no data size to place it at)."""
    path = folder / "provenance.json"
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
    for field in ("draft", "commit", "hardware"):
        require(record, field, str(path))
    data = require(record, "data", str(path), dict)
    require(data, "responses", f"{path}: data", str)
    for field in ("conversations", "tokens_trained"):
        require(data, field, f"{path}: data", int)
    recorded = require(record, "sha256", str(path), dict)
    actual = weight_hashes(folder)
    wrong = [
        f"{n}: recorded {recorded.get(n)}, found {actual.get(n)}"
        for n in sorted(recorded | actual)
        if recorded.get(n) != actual.get(n)
    ]
    if wrong:
        raise InputError(f"{path}: field 'sha256' does not match the weights beside it ({'; '.join(wrong)})")
    return record


def provenance(run: dict, metrics: Path, name: str) -> dict:
    train = json.loads((metrics / "train.json").read_text())
    record = next(d for d in train["drafts"] if d["name"] == name)
    regen = json.loads((metrics / "regen.json").read_text())
    config, accept = yardstick(metrics)
    return {
        "draft": name,
        "commit": run.get("kit", {}).get("commit"),
        "command": "python -m eagle3lab.pipeline.gpu_kit, then the device calls it prints (pipeline.gpu_run)",
        "hardware": run.get("hardware"),
        "data": {
            "responses": record["responses"],
            "conversations": record["records"],
            "tokens_trained": record["tokens"],
            "regeneration": regen["accounting"],
        },
        "recipe": record.get("overrides") or "the profile's shared settings (params.yaml in metrics/gpu/run.json)",
        "metrics": {
            "held_out_top1_per_ttt_step": (record.get("final_val") or {}).get("acc_pos"),
            f"accept_length_{YARDSTICK[0]}_{config}": accept.get(name),
        },
        "sizing": run.get("sizing"),
        "format": "SGLang LlamaForCausalLMEagle3, bf16, embed_tokens left out (load_draft restores it from the target)",
    }


def section(metrics: Path, table) -> str:
    """docs/results.md's GPU run section from metrics/gpu (`table` is report's table renderer)."""
    run = json.loads((metrics / "run.json").read_text())
    phases = ", ".join(f"{p['name']} {p['status']} {p['seconds']:.0f} s" for p in run["phases"])
    bench = run.get("regen_bench") or {}
    engines = ", ".join(
        f"{e} {bench[f'local_{e}_tok_s']:,.0f} tok/s"
        for e in ("batching", "continuous")
        if bench.get(f"local_{e}_tok_s")
    )
    parts = [
        f"### GPU run ({run.get('hardware')}, commit {run.get('kit', {}).get('commit', '?')[:7]})\n",
        f"`python -m eagle3lab.pipeline.gpu_run` inside {run['budget_s']:.0f} s: {phases}.\n",
    ]
    if engines:
        parts.append(f"Regeneration engines on the same {bench.get('n')} prompts (batch 512): {engines}.")
    regen = metrics / "regen.json"
    if regen.exists():
        r = json.loads(regen.read_text())
        parts.append(
            f"Regenerated {r['success']:,} conversations ({r['engine']} engine): {r['new_tokens']:,} tokens at "
            f"**{r['tokens_per_s']:,.0f} tok/s**. Accounting: `{r['accounting']}`.\n"
        )
    train = metrics / "train.json"
    if train.exists():
        config, accept = yardstick(metrics) if (metrics / "benchmark.json").exists() else (YARDSTICK[1], {})
        goal = " (goal 2.0)" if config == YARDSTICK[1] else ""
        rows = [
            [
                d["name"],
                d["responses"],
                d["records"],
                d["tokens"],
                d["tokens_per_s"],
                ", ".join(f"{a:.2f}" for a in (d["final_val"] or {}).get("acc_pos", [])),
                accept.get(d["name"]),
            ]
            for d in json.loads(train.read_text())["drafts"]
        ]
        header = ["draft", "responses", "conversations", "tokens", "train tok/s", "held-out top-1 per TTT step"]
        parts.append(table([*header, f"accept length, {YARDSTICK[0]} at {config}{goal}"], rows) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.pipeline.gpu_adopt", description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the folder the GPU run's files came back to")
    folder = adopt(parser.parse_args(argv).results)
    print(f"{folder}: add '{folder.relative_to(paths.ROOT)}' to benchmark.third_party_drafts in params.yaml, then")
    print("make repro (the CPU pipeline benchmarks it) and python -m eagle3lab.pipeline.report (docs/results.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
