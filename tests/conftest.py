import gc
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

# torch, transformers and the project are imported where a worker needs them: the process that hands tests to the
# workers loads this file before it starts them, and importing them here held both workers back 5.9 s
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    # One core for each of make test's two workers: more threads oversubscribe both, and beside the other worker two
    # threads wait on each other at every OpenMP barrier (the smoke pipeline took 534 s so, 160 s alone). The
    # variables reach every process a test starts: stage kernels, CLI runs, servers, llama-server.
    torch.set_num_threads(1)
    os.environ.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", EAGLE3LAB_LLAMACPP_THREADS="1")

# the fixtures whose tests share session servers: the engines', and `transformers serve` (about 9 CPU-s a start)
SERVER_GROUPS = ("vllm", "llamacpp", "tiny_served")
LONGEST_TEST = "test_every_stage_runs_on_tiny_params"  # the smoke pipeline
KILLS = "kills_session_server"


def pytest_configure(config):
    """xdist hands out the biggest groups first unless told not to (--no-loadscope-reorder): that started the smoke
    pipeline 3 minutes into an 8-minute run while the other worker idled for the last 73 s. Off, the workers take the
    order pytest_collection_modifyitems sets, however pytest is started."""
    config.option.loadscopereorder = False


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, the project) lives as long as the process: frozen, the garbage
    collector stops walking it, and full collections come a tenth as often. The in-process tests of four files spent
    10.5 CPU-s of about 100 in collections, 2.9 so."""
    gc.freeze()
    gc.set_threshold(700, 10, 100)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the markers
def pytest_collection_modifyitems(items):
    """`make test` runs two pytest-xdist workers (--dist loadgroup). Every test that needs a session server joins
    that server's group, so one worker runs them in file order and the session's servers start once; the rest, the
    smoke pipeline among them, runs on the other worker meanwhile."""
    for item in items:
        group = next((name for name in SERVER_GROUPS if name in item.fixturenames), None)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    # the longest single test first, so one worker runs it from the start while the other takes the server groups
    # (in file order it started 21 minutes into a 41-minute run on a 2-core AVX2 EPYC, and ran 26 of them); a test
    # that kills a session server last, after every test that uses that server
    items.sort(key=lambda item: (item.originalname != LONGEST_TEST, bool(item.get_closest_marker(KILLS))))


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded target (SmolLM2-135M-Instruct), float32, loaded once per session."""
    import torch

    from eagle3lab.models.target import load_target

    return load_target("smollm2-135m-instruct", dtype=torch.float32)


# The width of every tiny random model the tests build (hidden 64, 4 heads over 2 KV heads); each sets the rest.
TINY_WIDTH = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
# The tiny random Llama of the logic tests (tiny_llama) and of project_draft's target.
TINY_LLAMA = dict(**TINY_WIDTH, vocab_size=320, num_hidden_layers=6, max_position_embeddings=256)


@pytest.fixture(scope="session")
def tiny_llama():
    """A tiny random Llama (6 layers) for logic tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**TINY_LLAMA)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one torch thread avoids OpenMP barrier stalls when the 2 cores are shared (restored after)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    """A tiny random (untied, so it does not just echo its input) Llama with the SmolLM2 chat tokenizer, saved as a
    model folder that load_target, subprocesses and `transformers serve` can all open."""
    from tiny import save_tiny_chat_model

    path = save_tiny_chat_model(
        tmp_path_factory.mktemp("tiny") / "model",
        **TINY_WIDTH,
        vocab_size=49152,
        num_hidden_layers=2,
        max_position_embeddings=320,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    return str(path)


@pytest.fixture(scope="session")
def tiny_served(tiny_target, tmp_path_factory):
    """`transformers serve` on tiny_target, on a free 127.0.0.1 port, for the session: its address (host:port)."""
    from eagle3lab.regen.bench import serve_model

    with serve_model(tiny_target, log_path=tmp_path_factory.mktemp("serve") / "serve.log") as (address, _):
        yield address


@pytest.fixture(scope="session")
def project_draft(tmp_path_factory):
    """A tiny random draft in the project's export format, with its target's config beside it."""
    import torch
    from transformers import LlamaConfig

    from eagle3lab.models.draft import DraftConfig, Eagle3Draft, save_draft

    root = tmp_path_factory.mktemp("drafted")
    tcfg = LlamaConfig(**TINY_LLAMA, tie_word_embeddings=True)
    tcfg.save_pretrained(root / "target")
    torch.manual_seed(0)
    model = Eagle3Draft(DraftConfig.from_target(tcfg, draft_vocab_size=100))
    model.set_vocab(torch.arange(100) * 3)
    return root / "target", save_draft(model, root / "draft")


# ---- real vLLM servers (make test builds vLLM's environment first: `make vllm`) ----------------------------------

TRAINED_DRAFT = "drafts/smollm2-original-6960"  # the committed GPU-trained draft: real acceptance in a real engine


@pytest.fixture(scope="session")
def vllm():
    """vLLM as the tests run it: eager (no inductor compile at start-up), float32 (greedy output then matches
    vLLM's own baseline token for token) and with the model worker inside the engine core, on one torch thread (one
    vLLM import fewer per start: make test's pytest took 825 s instead of 978 on a 2-core AVX-512 EPYC, one run
    each), with 256 MiB of KV cache (5632 tokens: room for a request of the whole 2048-token context; vLLM
    zero-fills it at every start). Its servers and their engine cores are forks of one process that imported the API
    server (started with the first server): the vLLM tests took 437 CPU-seconds instead of 716 (13 starts), 268
    with the smaller cache and the silent cases' counters read over the doctor's probes, and 197 with the engine core
    and worker modules preloaded there and its heap frozen. A missing environment fails with the command that builds
    it."""
    from eagle3lab.engines.vllm.environment import python_path
    from eagle3lab.engines.vllm.server import VLLM

    python_path()
    engine = VLLM(compile=False, dtype="float32", startup_timeout=300, one_worker_process=True, kv_cache="256M")
    engine.forkserver = engine.make_forkserver()
    yield engine
    engine.forkserver.close()


@pytest.fixture(scope="session")
def smollm2_dir():
    """The embedded SmolLM2 as the HF folder servers load (converted once into the user cache)."""
    from eagle3lab.models.target import resolve

    return resolve("smollm2-135m-instruct")


def counted(engine, url, run):
    """What `run()` returns, and the engine's own speculation counters over it (the server's, not the doctor's)."""
    from eagle3lab.serving.client import ServerClient

    with ServerClient(url, timeout=300) as client:
        before = engine.counters(client)
        result = run()
        return result, engine.counters(client) - before


def wanted_by(request, names) -> list[str]:
    """The fixtures of `names` that some test of this run (after -k and deselection) asks for, in the order the tests
    first ask for them."""
    asked = (name for item in request.session.items for name in item.fixturenames if name in names)
    return list(dict.fromkeys(asked))


def start_together(launches: list) -> list:
    """Start every (engine, command, log_path) at once and wait for each to answer /health; returns (context,
    Server) pairs, each context exited to stop its server. A vLLM start is mostly single-threaded Python imports
    (API server, engine core, worker, one after the other), so starts side by side overlap on 2 cores (measured:
    three vLLM starts 82 s together, about 120 s one after another). If any start fails, the others are stopped and
    the first error raised."""

    def enter(launch):
        engine, command, log_path = launch
        context = engine.serve(command, log_path=log_path)
        return context, context.__enter__()

    with ThreadPoolExecutor(max_workers=len(launches)) as pool:
        futures = [pool.submit(enter, launch) for launch in launches]
    started = [f.result() for f in futures if f.exception() is None]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        for context, _ in started:
            context.__exit__(None, None, None)
        raise errors[0]
    return started


class ServerPool:
    """Named real servers, started on first use: the first one asked for starts together with the next `together` - 1
    that the tests of this run will ask for (`wanted`, in the order they ask), each stopped at close(). (Five vLLM
    servers at once, beside the other worker, would crowd 24 GiB.)"""

    def __init__(self, launches: dict, wanted: list[str], together: int = 3):
        self.launches, self.wanted, self.running, self.together = launches, wanted, {}, together

    def get(self, name: str):
        if name not in self.running:
            others = [n for n in self.wanted if n != name and n not in self.running]
            names = [name, *others[: self.together - 1]]
            self.running.update(zip(names, start_together([self.launches[n] for n in names])))
        return self.running[name][1]

    def stop(self, name: str) -> None:
        """Stop one server for good: no later get() starts it with the others."""
        if name in self.wanted:
            self.wanted.remove(name)
        if name in self.running:
            self.running.pop(name)[0].__exit__(None, None, None)

    def close(self) -> None:
        while self.running:
            self.running.popitem()[1][0].__exit__(None, None, None)


SESSION_VLLM = ("vllm_eagle3", "vllm_baseline")


@pytest.fixture(scope="session")
def vllm_servers(request, vllm, smollm2_dir, tmp_path_factory):
    """The session's real vLLM servers on loopback, started together on first use: SmolLM2 with the committed
    trained draft at k=2 (vllm_eagle3), and the same target alone, the engine's own baseline (vllm_baseline)."""
    from eagle3lab.paths import ROOT
    from eagle3lab.serving.processes import free_port

    logs = tmp_path_factory.mktemp("vllm")
    launches = {
        "vllm_eagle3": (
            vllm,
            vllm.launch_command(smollm2_dir, port=free_port(), draft=ROOT / TRAINED_DRAFT, k=2),
            logs / "eagle3.log",
        ),
        "vllm_baseline": (vllm, vllm.launch_command(smollm2_dir, port=free_port()), logs / "baseline.log"),
    }
    pool = ServerPool(launches, wanted_by(request, SESSION_VLLM))
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def vllm_eagle3(vllm_servers):
    """One real vLLM server for the session: SmolLM2 with the committed trained draft at k=2, on loopback."""
    return vllm_servers.get("vllm_eagle3")


@pytest.fixture(scope="session")
def vllm_baseline(vllm_servers):
    """The same target alone in vLLM (no draft): the engine's own baseline. test_regen_vllm kills it with SIGKILL,
    after every other test (marked kills_session_server)."""
    return vllm_servers.get("vllm_baseline")


# ---- real llama.cpp servers (make test builds llama-server first: `make llamacpp`) --------------------------------


@pytest.fixture(scope="session")
def llamacpp():
    """llama.cpp as the tests run it (the wheel's Q4_1 SmolLM2 GGUF, one slot, one thread: beside make test's other
    worker, two llama.cpp threads spin against it, and a 6 s test took 48 s). A missing build fails with the command
    that makes it."""
    from eagle3lab.engines.llamacpp.build import server_path
    from eagle3lab.engines.llamacpp.server import LlamaCpp

    server_path()
    return LlamaCpp(threads=1)


@pytest.fixture(scope="session")
def converter(llamacpp):
    """llama.cpp's converter as forks of one process that imported it (a conversion took 5.4 CPU-s fresh); through
    `llamacpp`, its tests join the llama.cpp group, where the fork server starts once."""
    from eagle3lab.engines.llamacpp.gguf import converter_forkserver

    forks = converter_forkserver()
    yield forks
    forks.close()


@pytest.fixture(scope="session")
def llamacpp_target(llamacpp):
    return llamacpp.model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def llamacpp_eagle3(llamacpp, llamacpp_target, tmp_path_factory):
    """One real llama-server for the session: the committed trained draft (exported to GGUF) at n-max 2."""
    from eagle3lab.paths import ROOT
    from eagle3lab.serving.processes import free_port

    cmd = llamacpp.launch_command(llamacpp_target, port=free_port(), draft=ROOT / TRAINED_DRAFT, k=2)
    with llamacpp.serve(cmd, log_path=tmp_path_factory.mktemp("llamacpp") / "eagle3.log") as server:
        yield server


@pytest.fixture(scope="session")
def llamacpp_baseline(llamacpp, llamacpp_target, tmp_path_factory):
    """The same target alone in llama.cpp: the engine's own baseline."""
    from eagle3lab.serving.processes import free_port

    cmd = llamacpp.launch_command(llamacpp_target, port=free_port())
    with llamacpp.serve(cmd, log_path=tmp_path_factory.mktemp("llamacpp") / "baseline.log") as server:
        yield server


# ---- shared by the real-engine tests ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def three_prompts(smollm2_dir):
    """Three MT-bench prompts as the target's token ids (what every engine is sent)."""
    from transformers import AutoTokenizer

    from eagle3lab.benchmark.prompts import load_prompts

    return load_prompts(AutoTokenizer.from_pretrained(smollm2_dir), ["mtbench"], None, 3)


def speculative_row(engine, speculating, baseline, prompts, max_new_tokens):
    """The benchmark row of the trained draft on a speculating server (config 1,2,1,3), its output compared with the
    engine's own baseline server's, and the baseline's records."""
    from eagle3lab.benchmark.served import _row, measure_server
    from eagle3lab.serving.client import ServerClient

    with ServerClient(speculating.url) as spec, ServerClient(baseline.url) as plain:
        drafted = measure_server(engine, spec, prompts, max_new_tokens, repeats=1)
        plain_records = measure_server(engine, plain, prompts, max_new_tokens, repeats=1)
    base = {r["prompt"].id: r["done"].token_ids for r in plain_records}
    return _row("mtbench", "trained", "1,2,1,3", TRAINED_DRAFT, engine.name, drafted, base), plain_records


@pytest.fixture
def locked_root(tmp_path):
    """A root with the checkout's dvc.lock and params.yaml and none of the cached outputs: a fresh machine's."""
    import shutil

    from eagle3lab import paths

    for name in ("dvc.lock", "params.yaml"):
        shutil.copy(paths.ROOT / name, tmp_path / name)
    return tmp_path
