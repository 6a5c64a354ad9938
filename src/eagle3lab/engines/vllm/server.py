"""vLLM as a serving engine: the OpenAI server's launch line with an EAGLE-3 draft, the server on loopback, and its
speculation counters from Prometheus /metrics. It runs from the environment `environment` builds."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from eagle3lab.engines.base import SpecCounters, check_draft_folder, parse_spec_counters
from eagle3lab.engines.vllm.environment import python_path
from eagle3lab.io import InputError
from eagle3lab.models.target import resolve
from eagle3lab.serving.client import Completion, ServerClient
from eagle3lab.serving.forkserver import Forkserver
from eagle3lab.serving.processes import popen_in_own_session, start_server

API_SERVER = "vllm.entrypoints.openai.api_server"
# What a CPU server and its engine core import after reading their arguments (the worker, engine core, executor,
# sampler, kernels): the fork server imports them once (measured with py-spy: most of a forked start's imports)
FORK_PRELOAD = (
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.engine.core",
    "vllm.v1.engine.async_llm",
    "vllm.v1.executor",
    "vllm.v1.sample.rejection_sampler",
    "vllm._aiter_ops",
    "vllm.kernels",
    "vllm.model_executor.layers.quantization.online.base",
)
LEGACY_KV_CACHE = "VLLM_CPU_KVCACHE_SPACE"  # set, it would override the launch line's --kv-cache-memory-bytes


@dataclass
class VLLM:
    """The vLLM engine with the settings its launch line carries. `compile` False adds --enforce-eager (vLLM's
    default compiles with inductor: about 1.5 min the first time, cached after). `one_worker_process` runs the model
    worker inside the engine core's process (--distributed-executor-backend uni, and VLLM_ENABLE_V1_MULTIPROCESSING=0,
    without which vllm-cpu 0.32 quietly turns uni back into a worker process of its own): one vLLM import fewer, so a
    start took 28-35 s instead of 42-50 on a 2-core AVX-512 EPYC, with the same answers and counters. The tests start
    their servers so; serving keeps vLLM's default layout. With a `forkserver` (the tests again), each server and its
    engine core are forks of one process that imported the API server once."""

    name: str = "vllm"
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    compile: bool = True
    method: str = "eagle3"
    # --kv-cache-memory-bytes on the CPU (vLLM's form, 2G or 256M); vLLM zero-fills all of it at every start, about
    # 2 s of CPU a GiB here. The CUDA build sizes its cache from the free GPU memory instead.
    kv_cache: str = "2G"
    startup_timeout: float = 600.0
    device: str = "cpu"
    one_worker_process: bool = False
    forkserver: Forkserver | None = None

    def model(self, spec: str) -> Path:
        return Path(resolve(spec))

    def launch_command(
        self,
        target: str | os.PathLike,
        *,
        port: int,
        draft: str | os.PathLike | None = None,
        k: int = 0,
        threshold: float = 0.0,
    ) -> list[str]:
        if threshold:
            raise InputError(f"vLLM drafts all k tokens every round: it has no draft threshold (got {threshold})")
        if k < 0 or (k and draft is None) or (draft is not None and not k):
            raise InputError(f"vLLM: a draft needs a draft length k >= 1 and k >= 1 a draft (got k={k}, draft={draft})")
        if draft is not None:
            check_draft_folder(draft, "vLLM")
        cmd = [
            str(python_path(self.device)),
            "-m",
            API_SERVER,
            "--model",
            str(target),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
        ]
        if self.device == "cpu":
            cmd += ["--kv-cache-memory-bytes", self.kv_cache]
        if not self.compile:
            cmd.append("--enforce-eager")
        if self.one_worker_process:
            cmd += ["--distributed-executor-backend", "uni"]
        if draft is not None:
            # absolute: the line must mean the same draft wherever it is run from (and the doctor reads it)
            spec = {"method": self.method, "model": str(Path(draft).resolve()), "num_speculative_tokens": k}
            cmd += ["--speculative-config", json.dumps(spec)]
        return cmd

    def make_forkserver(self) -> Forkserver:
        """A fork server of this engine's API server, in this engine's environment (it starts on first use)."""
        return Forkserver(python_path(self.device), API_SERVER, self.environment(), FORK_PRELOAD)

    def environment(self) -> dict:
        # offline: every model is a local folder, and a hub lookup on a closed network only waits
        return (
            {name: value for name, value in os.environ.items() if name != LEGACY_KV_CACHE}
            | {
                "HF_HUB_OFFLINE": "1",
                # vllm-cpu 0.32 saves its AOT-compiled model but cannot load it back ("'function' object has no
                # attribute 'finalize_loading'"), so every compiled start recompiled (about 3 min here); inductor's own
                # cache, without AOT, loads: a compiled start then takes about 50 s after the first
                "VLLM_USE_AOT_COMPILE": "0",
            }
            | (self._in_engine_core() if self.one_worker_process else {})
        )

    @staticmethod
    def _in_engine_core() -> dict:
        # vLLM's engine core process sets torch to one thread for serving (waiting OpenMP threads spin and steal the
        # step's cycles) unless OMP_NUM_THREADS is set; in one process nothing does, and make test's vLLM tests,
        # beside the other worker, took 3-5x as long with two threads
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}

    def serve(self, command: list[str], *, log_path: Path | None = None):
        port = int(command[command.index("--port") + 1])
        popen = self.forkserver.popen if self.forkserver else popen_in_own_session
        url = f"http://127.0.0.1:{port}"
        return start_server(command, url, self.startup_timeout, log_path=log_path, env=self.environment(), popen=popen)

    def complete(self, client: ServerClient, input_ids: list[int], max_tokens: int) -> Completion:
        return client.complete(input_ids, max_tokens=max_tokens)

    def counters(self, client: ServerClient) -> SpecCounters | None:
        return parse_counters(client.metrics())


def parse_counters(text: str) -> SpecCounters | None:
    return parse_spec_counters(text, "vllm:")
