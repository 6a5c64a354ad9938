"""The llamacpp backend: the run starts llama-server itself (engines.llamacpp.server) on a GGUF of the target
(engines.llamacpp.gguf.target_gguf: by default the weights and chat template the pipeline trains against, at bf16
or, where the CPU has no bf16 arithmetic, f32), with `concurrency`
parallel slots of `max_context` tokens each, continuous batching and `threads` threads, and regenerates through the
openai backend against it: the same chat requests, resume, accounting, multi-turn handling, monitor and error files.
Sampled (temperature > 0) it draws from the whole distribution, as the local backend does (WHOLE_DISTRIBUTION), with
each request's own seed (regen.openai.sampling_fields).
The server is stopped when the run ends; one that dies mid-run ends the run with an error, the records written stay."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from eagle3lab.io import InputError
from eagle3lab.regen.errors import NoServerError, RegenError
from eagle3lab.regen.settings import RegenSettings
from eagle3lab.serving.client import ServerError
from eagle3lab.serving.processes import Server, free_port, log_tail

# llama-server truncates the distribution by default (top-k 40, top-p 0.95, min-p 0.05) and takes a GGUF's
# generation_config values over those: off on the launch line, which outranks both, so temperature T samples
# softmax(logits / T) over the whole vocabulary. Greedy (T = 0) answers are the same either way.
WHOLE_DISTRIBUTION = ("--top-k", "0", "--top-p", "1.0", "--min-p", "0.0")


def regen_engine(s: RegenSettings, context: int):
    """llama-server as the backend runs it: `s.concurrency` slots of `context` tokens, sampling WHOLE_DISTRIBUTION."""
    from eagle3lab.engines.llamacpp.server import LlamaCpp

    threads = {"threads": s.threads} if s.threads else {}
    return LlamaCpp(
        target_spec=s.target, slots=s.concurrency, context=context, extra_args=WHOLE_DISTRIBUTION, **threads
    )


def start_server(
    s: RegenSettings, context: int, stack: contextlib.ExitStack, log_path: Path
) -> tuple[Server, RegenSettings]:
    """Start llama-server for `s` with `context` tokens a slot (stopped when `stack` closes); return it and the openai
    backend's settings against it. One slot per request in flight (`s.concurrency`): none waits in the server."""
    from eagle3lab.engines.llamacpp.gguf import target_gguf

    engine = regen_engine(s, context)
    try:
        command = engine.launch_command(target_gguf(s.target, s.weights), port=free_port())
        server = stack.enter_context(engine.serve(command, log_path=log_path))
    except (ServerError, InputError) as e:  # InputError: no build (EngineMissing), a failed GGUF export
        raise RegenError(f"the llamacpp backend cannot start llama-server: {e}") from None
    served = dataclasses.replace(s, backend="openai", server_addresses=[server.url], max_context=context, model=None)
    return server, served


def check_alive(server: Server, out: Path) -> None:
    """Raise NoServerError, saying what to do, when the run's llama-server has exited (killed, out of memory)."""
    code = server.process.poll()
    if code is None:
        return
    raise NoServerError(
        f"llama-server (pid {server.process.pid}) exited with code {code} during the run; the records already "
        f"written stay in {out}. Rerun with --resume: it starts a fresh llama-server and redoes only the missing and "
        f"failed records. Last lines of its log {server.log_path}:\n{log_tail(server.log_path, 10)}"
    )
