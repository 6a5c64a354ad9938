"""SGLang on GPUs: build the launch command from a params profile, start the server and wait for health, and
benchmark it through its native `/generate` (accept length from `meta_info.spec_verify_ct`), with the OpenAI
`/v1/chat/completions` API as the fallback for servers without `/generate` (e.g. `transformers serve`).

    python -m eagle3lab.serving.sglang launch-command --params params/gpu-llama3-8b.yaml [--config 1,3,1,4]
    python -m eagle3lab.serving.sglang bench --params params/gpu-llama3-8b.yaml --launch   # one server per config
    python -m eagle3lab.serving.sglang bench --params params/gpu-llama3-8b.yaml --url http://127.0.0.1:30000

Rows are shaped like `eagle3lab.benchmark.run`'s, so both engines fit one table. `accept_length` here is SGLang's
definition, completion_tokens / spec_verify_ct (bonus token included), the same as bench's `sglang_accept_length`.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from eagle3lab.io import InputError, write_json
from eagle3lab.serving.processes import ServerError, start_server

BASELINE_CONFIG = "1,0,0,0"


def launch_command(
    model: str,
    *,
    port: int,
    host: str = "127.0.0.1",
    tp: int = 1,
    draft: str | os.PathLike | None = None,
    algorithm: str = "EAGLE3",
    steps: int | None = None,
    topk: int | None = None,
    num_draft_tokens: int | None = None,
    context_length: int | None = None,
    mem_fraction: float | None = None,
    cuda_graph_max_bs: int | None = None,
    python: str = "python",
    extra=(),
) -> list[str]:
    """`python -m sglang.launch_server ...` with SGLang's own flag names (server_args.py). Without `draft` the server
    does not speculate and the speculative flags must be absent; with it, steps/topk/num_draft_tokens are all three
    given or none (SGLang picks per-model defaults only when none is set)."""
    spec = {"steps": steps, "topk": topk, "num_draft_tokens": num_draft_tokens}
    given = {k: v for k, v in spec.items() if v is not None}
    if draft is None and given:
        raise InputError(f"speculative settings {sorted(given)} given without a draft: set the draft path too")
    if given and len(given) != 3:
        missing = sorted(set(spec) - set(given))
        raise InputError(f"set all three of steps / topk / num_draft_tokens, or none (missing: {', '.join(missing)})")
    if any(v < 1 for v in given.values()):
        raise InputError(f"steps / topk / num_draft_tokens must be >= 1, got {given}")
    if tp < 1:
        raise InputError(f"tp must be >= 1, got {tp}")
    if mem_fraction is not None and not 0 < mem_fraction < 1:
        raise InputError(f"mem_fraction must be in (0, 1), got {mem_fraction}")
    cmd = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--host",
        host,
        "--port",
        str(port),
        "--tp-size",
        str(tp),
    ]
    if draft is not None:
        if not algorithm:
            raise InputError("a draft needs a speculative algorithm (EAGLE3 for an EAGLE-3 draft)")
        cmd += ["--speculative-algorithm", algorithm.upper(), "--speculative-draft-model-path", str(draft)]
        if given:
            cmd += [
                "--speculative-num-steps",
                str(steps),
                "--speculative-eagle-topk",
                str(topk),
                "--speculative-num-draft-tokens",
                str(num_draft_tokens),
            ]
    if context_length is not None:
        cmd += ["--context-length", str(context_length)]
    if mem_fraction is not None:
        cmd += ["--mem-fraction-static", str(mem_fraction)]
    if cuda_graph_max_bs is not None:
        cmd += ["--cuda-graph-max-bs", str(cuda_graph_max_bs)]
    return cmd + [str(a) for a in extra]


def parse_config(config: str) -> tuple[int, int, int, int]:
    """SpecForge's benchmark config `batch,steps,topk,num_draft_tokens`; steps 0 = no draft (the baseline)."""
    try:
        bs, steps, topk, ndraft = (int(x) for x in str(config).split(","))
    except ValueError:
        raise InputError(f"config {config!r}: expected four integers batch,steps,topk,num_draft_tokens") from None
    if bs < 1 or min(steps, topk, ndraft) < 0 or (steps > 0) != (topk > 0 and ndraft > 0):
        raise InputError(f"config {config!r}: batch >= 1, and steps, topk, num_draft_tokens all 0 or all >= 1")
    return bs, steps, topk, ndraft


def command_for_config(settings: dict, model: str, config: str, python: str = "python") -> list[str]:
    """The launch command for one benchmark config from a params profile's `sglang` section."""
    bs, steps, topk, ndraft = parse_config(config)
    spec = (
        dict(
            draft=settings["draft_path"],
            algorithm=settings["algorithm"],
            steps=steps,
            topk=topk,
            num_draft_tokens=ndraft,
        )
        if steps
        else {}
    )
    return launch_command(
        model,
        port=settings["port"],
        host=settings["host"],
        tp=settings["tp"],
        context_length=settings["context_length"],
        mem_fraction=settings["mem_fraction"],
        cuda_graph_max_bs=max(bs, settings["cuda_graph_max_bs"] or 0) or None,
        python=python,
        extra=settings.get("extra") or (),
        **spec,
    )


# ---- the server process ------------------------------------------------------------------------------------------


# ---- the benchmark -----------------------------------------------------------------------------------------------


@dataclass
class _Prompt:
    id: str
    set: str
    messages: list[dict] | None = None
    text: str | None = None
    input_ids: list[int] | None = None


def _as_prompt(p, i: int, default_set: str) -> _Prompt:
    """A str (one user message), a dict (id, set, and messages / prompt / text / input_ids) or a bench.Prompt."""
    if isinstance(p, str):
        return _Prompt(str(i), default_set, messages=[{"role": "user", "content": p}])
    if not isinstance(p, dict):  # bench.Prompt: chat-templated ids for /generate, messages for the chat API
        return _Prompt(str(p.id), p.set, messages=p.messages, input_ids=list(p.ids))
    where = f"prompt {i}"
    messages = p.get("messages") or ([{"role": "user", "content": p["prompt"]}] if "prompt" in p else None)
    prompt = _Prompt(str(p.get("id", i)), p.get("set", default_set), messages, p.get("text"), p.get("input_ids"))
    if prompt.messages is None and prompt.text is None and prompt.input_ids is None:
        raise InputError(f"{where}: needs one of 'messages', 'prompt', 'text', 'input_ids'")
    return prompt


@dataclass
class _Result:
    prompt: _Prompt
    completion_tokens: int
    seconds: float
    verify_ct: int | None
    text: str
    api: str


@dataclass
class _Client:
    url: str
    max_new_tokens: int
    http: httpx.Client
    model: str | None = None
    api: str | None = None  # "generate" or "chat", fixed by the first answer
    tokenizer: object = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, prompt: _Prompt) -> _Result:
        with self._lock:
            api = self.api
        if api in (None, "generate"):
            result = self._generate(prompt, probing=api is None)
            if result is not None:
                return result
        return self._chat(prompt)

    def _generate(self, prompt: _Prompt, probing: bool) -> _Result | None:
        body = {"sampling_params": {"temperature": 0.0, "max_new_tokens": self.max_new_tokens}}
        if prompt.input_ids is not None:
            body["input_ids"] = prompt.input_ids
        elif prompt.text is not None:
            body["text"] = prompt.text
        elif self.tokenizer is not None:  # /generate takes raw text: apply the chat template here
            body["text"] = self.tokenizer.apply_chat_template(
                prompt.messages, add_generation_prompt=True, tokenize=False
            )
        elif probing:
            with self._lock:
                self.api = "chat"  # chat messages and no tokenizer: only the chat API can template them
            return None
        else:
            raise InputError(f"prompt {prompt.id}: chat messages for /generate need a tokenizer")
        t0 = time.perf_counter()
        r = self.http.post(self.url + "/generate", json=body)
        seconds = time.perf_counter() - t0
        if r.status_code in (404, 405) and probing:
            with self._lock:
                self.api = "chat"
            return None
        body = _ok_json(r, "/generate")
        meta = body.get("meta_info") if isinstance(body, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("completion_tokens"), int):
            raise ServerError(f"{self.url}/generate: no meta_info.completion_tokens in {str(body)[:200]}")
        with self._lock:
            self.api = "generate"
        verify = meta.get("spec_verify_ct")
        return _Result(
            prompt,
            meta["completion_tokens"],
            seconds,
            int(verify) if verify is not None else None,
            body.get("text", ""),
            "generate",
        )

    def _chat(self, prompt: _Prompt) -> _Result:
        if prompt.messages is None:
            raise InputError(f"prompt {prompt.id}: the chat API needs messages (this server has no /generate)")
        if self.model is None:
            models = _ok_json(self.http.get(self.url + "/v1/models"), "/v1/models").get("data") or []
            if not models:
                raise ServerError(f"{self.url}/v1/models lists no model: pass model=")
            self.model = models[0]["id"]
        body = {
            "model": self.model,
            "messages": prompt.messages,
            "max_tokens": self.max_new_tokens,
            "temperature": 0.0,
            "stream": False,
        }
        t0 = time.perf_counter()
        r = self.http.post(self.url + "/v1/chat/completions", json=body)
        seconds = time.perf_counter() - t0
        body = _ok_json(r, "/v1/chat/completions")
        usage = body.get("usage") or {}
        if not isinstance(usage.get("completion_tokens"), int):
            raise ServerError(f"{self.url}/v1/chat/completions: no usage.completion_tokens in {str(body)[:200]}")
        # SGLang may attach its meta_info to OpenAI answers; without it speculation cannot be measured here
        meta = body.get("meta_info") or (body.get("choices") or [{}])[0].get("meta_info") or {}
        verify = meta.get("spec_verify_ct") if isinstance(meta, dict) else None
        text = ((body.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
        return _Result(
            prompt, usage["completion_tokens"], seconds, int(verify) if verify is not None else None, text, "chat"
        )


def _ok_json(r: httpx.Response, path: str) -> dict:
    if r.status_code != 200:
        raise ServerError(f"{r.request.url}: HTTP {r.status_code}: {r.text[:300]}")
    try:
        body = r.json()
    except ValueError:
        raise ServerError(f"{r.request.url}: not JSON: {r.text[:300]}") from None
    if not isinstance(body, dict):
        raise ServerError(f"{r.request.url}: expected a JSON object from {path}, got {type(body).__name__}")
    return body


def _row(set_name: str, system: str, config: str, draft, results: list[_Result], wall: float) -> dict:
    tokens = sum(r.completion_tokens for r in results)
    seconds = sum(r.seconds for r in results)
    verifies = [r.verify_ct for r in results]
    # no spec_verify_ct means the server did not speculate: that is "no accept length", not 1.0
    speculative = bool(results) and all(v is not None for v in verifies)
    accept = tokens / sum(verifies) if speculative and sum(verifies) else None
    return {
        "set": set_name,
        "system": system,
        "config": config,
        "draft": draft,
        "mode": "sglang",
        "prompts": len(results),
        "completion_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,  # per request, as bench.py's batch-1 rows
        "throughput_tok_s": tokens / wall if wall > 0 else 0.0,  # all concurrent requests together
        "accept_length": accept,
        "sglang_accept_length": accept,
        "verify_count": sum(verifies) if speculative else None,
        "speedup_vs_baseline": None,
        "speedup_vs_hf_generate": None,
        "identical_rate": None,
        "divergences": [],
        "position_acceptance": [],
        "time_split": None,
        "api": results[0].api if results else None,
    }


def bench_server(
    url: str,
    prompts,
    max_new_tokens: int,
    concurrency: int = 1,
    *,
    system: str = "sglang",
    config: str | None = None,
    draft: str | None = None,
    model: str | None = None,
    tokenizer=None,
    default_set: str = "prompts",
    timeout: float = 600.0,
    transport=None,
) -> dict:
    """Send every prompt (greedy, `max_new_tokens`) with `concurrency` requests in flight; returns
    {"meta", "rows", "per_prompt"} like `bench.run_benchmark`, one row per prompt set."""
    if max_new_tokens < 1 or concurrency < 1:
        raise InputError("max_new_tokens and concurrency must be >= 1")
    items = [_as_prompt(p, i, default_set) for i, p in enumerate(prompts)]
    if not items:
        raise InputError("no prompts to send")
    url = url.rstrip("/")
    config = config or f"{concurrency},0,0,0"
    with httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0), transport=transport) as http:
        client = _Client(url, max_new_tokens, http, model=model, tokenizer=tokenizer)
        results, walls = [], collections.defaultdict(float)
        by_set = collections.defaultdict(list)
        for p in items:
            by_set[p.set].append(p)
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for set_name, group in by_set.items():
                t0 = time.perf_counter()
                # the very first request goes alone: it settles which API the server speaks
                first = [client.run(group[0])] if client.api is None else []
                results += first + list(pool.map(client.run, group[len(first) :]))
                walls[set_name] = time.perf_counter() - t0
    rows = [_row(s, system, config, draft, [r for r in results if r.prompt.set == s], walls[s]) for s in by_set]
    meta = {
        "url": url,
        "api": client.api,
        "model": client.model,
        "max_new_tokens": max_new_tokens,
        "concurrency": concurrency,
        "prompts": len(items),
        "sets": list(by_set),
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    per_prompt = [
        {
            "set": r.prompt.set,
            "id": r.prompt.id,
            "system": system,
            "config": config,
            "completion_tokens": r.completion_tokens,
            "seconds": r.seconds,
            "tokens_per_s": r.completion_tokens / r.seconds if r.seconds > 0 else 0.0,
            "spec_verify_ct": r.verify_ct,
            "accept_length": r.completion_tokens / r.verify_ct if r.verify_ct else None,
            "text": r.text,
        }
        for r in results
    ]
    return {"meta": meta, "rows": rows, "per_prompt": per_prompt}


def add_speedups(rows: list[dict]) -> list[dict]:
    """Fill speedup_vs_baseline from the no-draft row (steps 0) of the same set and batch size (in place)."""

    def key(r):
        bs, steps, *_ = parse_config(r["config"])
        return r["set"], bs, steps == 0

    base = {key(r)[:2]: r["tokens_per_s"] for r in rows if key(r)[2]}
    for r in rows:
        b = base.get(key(r)[:2])
        r["speedup_vs_baseline"] = r["tokens_per_s"] / b if b else None
    return rows


def format_rows(rows: list[dict]) -> str:
    def num(v, fmt):
        return format(v, fmt) if v is not None else "-"

    header = f"{'set':<10} {'system':<16} {'config':<9} {'accept':>6} {'tok/s':>7} {'thru':>8} {'x base':>6}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['set']:<10} {r['system'][:16]:<16} {r['config']:<9} {num(r['accept_length'], '6.2f'):>6} "
            f"{r['tokens_per_s']:>7.1f} {r['throughput_tok_s']:>8.1f} {num(r['speedup_vs_baseline'], '6.2f'):>6}"
        )
    return "\n".join(lines)


# ---- CLI: reads the GPU params profile ---------------------------------------------------------------------------

SETTINGS_KEYS = (
    "host",
    "port",
    "tp",
    "mem_fraction",
    "context_length",
    "cuda_graph_max_bs",
    "algorithm",
    "draft_path",
    "steps",
    "topk",
    "num_draft_tokens",
    "startup_timeout",
    "log_dir",
    "extra",
)


def load_profile(path: str | os.PathLike) -> tuple[str, dict, dict]:
    """(target, sglang settings, benchmark section) from a params file with an `sglang:` section."""
    from eagle3lab.pipeline.stages import StageError, load_params

    try:
        params = load_params(Path(path))
    except StageError as e:
        raise InputError(str(e)) from None
    settings = params.get("sglang")
    if not isinstance(settings, dict):
        raise InputError(f"{path}: no section 'sglang' (server settings); see params/gpu-llama3-8b.yaml")
    missing = [k for k in SETTINGS_KEYS if k not in settings]
    unknown = [k for k in settings if k not in SETTINGS_KEYS]
    if missing or unknown:
        raise InputError(f"{path}: section 'sglang': missing key(s) {missing}, unknown key(s) {unknown}")
    target = (params.get("common") or {}).get("target")
    if not target:
        raise InputError(f"{path}: section 'common' has no 'target'")
    return target, settings, params.get("benchmark") or {}


def _default_config(settings: dict) -> str:
    return f"1,{settings['steps']},{settings['topk']},{settings['num_draft_tokens']}"


def _doctor_ok(cmd: list[str]) -> bool:
    from eagle3lab.doctor.core import diagnose

    report = diagnose(launch=cmd)
    print(report.render())
    return report.exit_code == 0


def _bench_prompts(target: str, bench_params: dict, limit: int | None):
    from transformers import AutoTokenizer

    from eagle3lab.benchmark.run import load_prompts

    tokenizer = AutoTokenizer.from_pretrained(target)
    return load_prompts(
        tokenizer,
        bench_params.get("sets") or ["mtbench"],
        None,
        limit if limit is not None else bench_params.get("limit"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.serving.sglang", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lc = sub.add_parser("launch-command", help="print the SGLang launch command of a params profile")
    lc.add_argument("--params", type=Path, required=True, help="params file with an `sglang:` section")
    lc.add_argument(
        "--config", help="batch,steps,topk,ndraft (default: the profile's steps/topk/ndraft; 1,0,0,0 = no draft)"
    )
    b = sub.add_parser("bench", help="benchmark an SGLang server (or one launched per config) on the eval sets")
    b.add_argument("--params", type=Path, required=True)
    where = b.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:30000 (benchmarked as --config)")
    where.add_argument("--launch", action="store_true", help="start one server per benchmark config, doctor first")
    b.add_argument("--config", help="the running server's config label (default: the profile's)")
    b.add_argument("--configs", nargs="+", help="with --launch: configs (default: the profile's benchmark.configs)")
    b.add_argument("--limit", type=int, help="prompts per set (default: benchmark.limit)")
    b.add_argument("--skip-doctor", action="store_true", help="launch even when the doctor finds errors")
    b.add_argument("--output", type=Path, help="write the JSON result here")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        target, settings, bench_params = load_profile(args.params)
        if args.command == "launch-command":
            print(shlex.join(command_for_config(settings, target, args.config or _default_config(settings))))
            return 0
        prompts = _bench_prompts(target, bench_params, args.limit)
        max_new = bench_params.get("max_new_tokens", 256)
        url = f"http://{settings['host']}:{settings['port']}"
        result = {"meta": {"target": target, "params": str(args.params)}, "rows": [], "per_prompt": [], "servers": []}
        if args.url:
            config = args.config or _default_config(settings)
            runs = [(config, None)]
            url = args.url
        else:
            runs = [
                (c, command_for_config(settings, target, c, python=sys.executable))
                for c in (args.configs or bench_params.get("configs") or [BASELINE_CONFIG, _default_config(settings)])
            ]
        for config, cmd in runs:
            bs, steps, *_ = parse_config(config)
            draft = settings["draft_path"] if steps else None
            system = "sglang-eagle3" if steps else "sglang-baseline"
            if cmd is None:
                part = bench_server(url, prompts, max_new, bs, system=system, config=config, draft=draft, model=target)
            else:
                if steps and not args.skip_doctor and not _doctor_ok(cmd):
                    print(
                        f"doctor found errors in the launch line for config {config}; fix them or --skip-doctor",
                        file=sys.stderr,
                    )
                    return 1
                log = Path(settings["log_dir"]) / f"sglang-{config.replace(',', '_')}.log"
                print(f"starting: {shlex.join(cmd)} (log {log})", flush=True)
                with start_server(cmd, url, settings["startup_timeout"], log_path=log) as server:
                    part = bench_server(
                        url, prompts, max_new, bs, system=system, config=config, draft=draft, model=target
                    )
                    result["servers"].append(
                        {"config": config, "command": cmd, "startup_s": server.started_s, "server_info": server.info}
                    )
            result["rows"] += part["rows"]
            result["per_prompt"] += part["per_prompt"]
            result["meta"].setdefault("runs", []).append(part["meta"])
        add_speedups(result["rows"])
    except (InputError, ServerError, httpx.HTTPError) as e:
        print(f"eagle3lab.serving.sglang: {e}", file=sys.stderr)
        return 2 if isinstance(e, InputError) else 1
    print(format_rows(result["rows"]))
    if args.output:
        write_json(args.output, result)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
