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
