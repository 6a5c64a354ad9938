"""SpecForge's own trainer on inputs written from one of our runs (train.specforge.inputs): `specforge train` in its
environment through the CPU shim, its log kept and its step lines shown, then its checkpoint exported into our
draft format. A run folder holds run.json (the config SpecForge read), train.log, run/ (SpecForge's output and the
config it resolved), draft/ and result.json (written last: a folder without it is trained again)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from eagle3lab.io import InputError, write_json
from eagle3lab.models.checkpoint import read_json
from eagle3lab.train.loop import TrainingError
from eagle3lab.train.specforge.environment import shim_command
from eagle3lab.train.specforge.export import export_draft, latest_state, read_state, target_embedding
from eagle3lab.train.specforge.inputs import DRAFT_CONFIG, PROVENANCE, run_config

STEP_LINE = re.compile(r"^step \d+: ")  # SpecForge's logger: `step N: {metrics}` every log_interval steps


def _stream(cmd: list[str], log: Path, show: bool) -> tuple[int, str]:
    """Run `cmd`, every line into `log`, SpecForge's step lines on stderr; (exit code, last lines)."""
    tail: list[str] = []
    with open(log, "w") as out, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        for line in p.stdout:
            out.write(line)
            tail = (tail + [line.rstrip()])[-20:]
            if show and STEP_LINE.match(line):
                print(f"specforge {line.strip()[:200]}", file=sys.stderr, flush=True)
    return p.returncode, "\n".join(tail)


def train_specforge(inputs, output, learning_rate: float | None = None, progress: bool = True) -> dict:
    """Train with SpecForge on `inputs` into `output` (its own learning rate unless one is given) and export the
    draft to OUTPUT/draft. Returns result.json's content; a finished run with the same config is kept."""
    inputs, output = Path(inputs), Path(output)
    config = run_config(inputs, output, learning_rate)
    provenance = read_json(inputs / PROVENANCE)
    result_path = output / "result.json"
    if result_path.exists():
        result = read_json(result_path)
        if result.get("run_config") == config and result.get("inputs") == provenance:
            return result
        raise InputError(f"{result_path}: a SpecForge run with other settings; choose another output folder")
    output.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(output / "run", ignore_errors=True)  # a killed run starts over: it is minutes, not hours
    write_json(output / "run.json", config)
    log = output / "train.log"
    start = time.monotonic()
    code, tail = _stream(shim_command("train", "--config", output / "run.json"), log, progress)
    seconds = time.monotonic() - start
    if code:
        raise TrainingError(f"SpecForge's training failed (exit {code}); {log} ends:\n{tail}")
    state_path = latest_state(output / "run")
    embedding = target_embedding(provenance["settings"]["target"])
    draft = export_draft(state_path, read_json(inputs / DRAFT_CONFIG), embedding, output / "draft")
    result = {
        "trainer": "specforge",
        "run_config": config,
        "inputs": provenance,
        "learning_rate": read_json(output / "run" / "resolved_config.json")["training"]["learning_rate"],
        "steps": read_state(state_path)["global_step"],
        "wall_seconds": round(seconds, 1),
        "checkpoint": str(state_path),
        "draft": str(draft),
        "log": str(log),
    }
    write_json(result_path, result)
    return result
