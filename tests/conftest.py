import pytest
import torch

from tiny import save_tiny_chat_model


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded target (SmolLM2-135M-Instruct), float32, loaded once per session."""
    from eagle3lab.models.target import load_target

    return load_target("smollm2-135m-instruct", dtype=torch.float32)


# The tiny random Llama of the logic tests (tiny_llama) and of project_draft's target.
TINY_LLAMA = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


@pytest.fixture(scope="session")
def tiny_llama():
    """A tiny random Llama (6 layers) for logic tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**TINY_LLAMA)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one torch thread avoids OpenMP barrier stalls when the 2 cores are shared (restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    """A tiny random (untied, so it does not just echo its input) Llama with the SmolLM2 chat tokenizer, saved as a
    model folder that load_target, subprocesses and `transformers serve` can all open."""
    path = save_tiny_chat_model(
        tmp_path_factory.mktemp("tiny") / "model",
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=320,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    return str(path)


@pytest.fixture(scope="session")
def project_draft(tmp_path_factory):
    """A tiny random draft in the project's export format, with its target's config beside it."""
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
    """vLLM as the tests run it: eager (no inductor compile at start-up) and float32 (greedy output then matches
    vLLM's own baseline token for token). A missing environment fails with the command that builds it."""
    from eagle3lab.serving.vllm import VLLM, python_path

    python_path()
    return VLLM(compile=False, dtype="float32", startup_timeout=300)


@pytest.fixture(scope="session")
def smollm2_dir():
    """The embedded SmolLM2 as the HF folder servers load (converted once into the user cache)."""
    from eagle3lab.models.target import resolve

    return resolve("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def vllm_eagle3(vllm, smollm2_dir, tmp_path_factory):
    """One real vLLM server for the session: SmolLM2 with the committed trained draft at k=2, on loopback."""
    from eagle3lab.paths import ROOT
    from eagle3lab.serving.processes import free_port

    cmd = vllm.launch_command(smollm2_dir, port=free_port(), draft=ROOT / TRAINED_DRAFT, k=2)
    with vllm.serve(cmd, log_path=tmp_path_factory.mktemp("vllm") / "eagle3.log") as server:
        yield server


@pytest.fixture(scope="session")
def vllm_baseline(vllm, smollm2_dir, tmp_path_factory):
    """The same target alone in vLLM (no draft): the engine's own baseline."""
    from eagle3lab.serving.processes import free_port

    cmd = vllm.launch_command(smollm2_dir, port=free_port())
    with vllm.serve(cmd, log_path=tmp_path_factory.mktemp("vllm") / "baseline.log") as server:
        yield server


# ---- real llama.cpp servers (make test builds llama-server first: `make llamacpp`) --------------------------------


@pytest.fixture(scope="session")
def llamacpp():
    """llama.cpp as the tests run it (the wheel's Q4_1 SmolLM2 GGUF, 2 threads, one slot). A missing build fails
    with the command that makes it."""
    from eagle3lab.serving.llamacpp import LlamaCpp, server_path

    server_path()
    return LlamaCpp()


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
