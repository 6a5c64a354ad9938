"""SGLang launch commands with SGLang's own flag names (server_args.py), from arguments or from a params profile's
`sglang` section and a SpecForge benchmark config `batch,steps,topk,ndraft`."""

from __future__ import annotations

import os

from eagle3lab.decoding.config import SpecConfig
from eagle3lab.io import InputError

BASELINE_CONFIG = "1,0,0,0"


# long: a flag per keyword argument (the signature alone is 17 lines), each checked before it is written
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
    """SpecForge's benchmark config `batch,steps,topk,num_draft_tokens`: the batch is the requests in flight (any
    >= 1); steps/topk/ndraft obey eagle3lab.decoding.config, the engine's and SGLang's rule (steps 0 = no draft)."""
    try:
        bs, steps, topk, ndraft = (int(x) for x in str(config).split(","))
    except ValueError:
        raise InputError(f"config {config!r}: expected four integers batch,steps,topk,num_draft_tokens") from None
    try:
        SpecConfig(bs, steps, topk, ndraft).validate_shape()
    except ValueError as e:
        raise InputError(str(e)) from None
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
