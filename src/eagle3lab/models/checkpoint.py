"""The draft checkpoint format on disk, read and written in one place: a folder with config.json and either one
model.safetensors, shards listed by model.safetensors.index.json (Hugging Face's layout, which SGLang reads), or a
pytorch_model*.bin (many published drafts). Reading headers never loads weights; every error names the file.

Tensor names are normalised to SGLang's spelling (no `model.` prefix, `midlayer.` for `layers.0.`/`midlayers.0.`).

Reading config.json, the headers and numpy arrays (`DraftCheckpoint.array`, what the doctor reads) imports no torch,
so the static doctor does not pay for it; torch is imported only by what hands out or takes torch tensors
(`DraftCheckpoint.tensor/tensors`, `load_state`, `write_checkpoint`) and to read a pytorch_model*.bin.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3lab.io import InputError, atomic_path

if TYPE_CHECKING:
    import numpy as np
    import torch

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
HEADER_ROOM = 8192  # bytes kept under a shard cap for the file's JSON header (about 100 bytes a tensor)


class DraftFormatError(InputError):
    """A draft folder that is not in a format we can read; the message names the file and the field or key."""


def normalise_key(key: str) -> str:
    """Map third-party spellings onto SGLang's: `model.` prefix, `layers.0.` / `midlayers.0.` for `midlayer.`."""
    key = key.removeprefix("model.")
    for alias in ("layers.0.", "midlayers.0."):
        if key.startswith(alias):
            return "midlayer." + key[len(alias) :]
    return key


def load_state(path: Path, what: str):
    """A torch file loaded safely (weights_only: plain tensors, dicts, lists, numbers and strings; no code runs); a
    foreign or corrupt file is an InputError naming it and saying what it should have been and why it is not."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # whatever torch raises for it
        raise InputError(f"{path}: not {what} this version can read ({e.__class__.__name__}: {e})") from None


def read_json(path: Path):
    """A JSON file, or DraftFormatError naming it."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DraftFormatError(f"{path} is missing") from None
    except (OSError, ValueError) as e:
        raise DraftFormatError(f"{path}: unreadable ({e})") from None


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a draft folder: the index's shards, else *.safetensors, else pytorch_model*.bin."""
    folder = Path(folder)
    index = folder / INDEX
    if index.exists():
        content = read_json(index)
        weight_map = content.get("weight_map") if isinstance(content, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise DraftFormatError(f"{index}: field 'weight_map' is missing or empty")
        files = [folder / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.exists()]
        if absent:
            raise DraftFormatError(f"{index}: 'weight_map' names shards that are not there: {absent}")
        return files
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise DraftFormatError(f"{folder}: no weights (*.safetensors or pytorch_model*.bin)")
    return files


def _read_file(path: Path, names: set[str] | None) -> dict[str, torch.Tensor]:
    """Tensors of one weight file whose normalised name is in `names` (all when None); raw names as keys."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as st:
                keys = st.keys()  # safe_open is not iterable
                return {k: st.get_tensor(k) for k in keys if names is None or normalise_key(k) in names}
        import torch

        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)  # lazy: mmap
        return {k: v for k, v in state.items() if names is None or normalise_key(k) in names}
    except Exception as e:  # a corrupt or foreign file: say which one and why
        raise DraftFormatError(f"{path}: cannot read tensors ({e.__class__.__name__}: {e})") from None


def _read_arrays(path: Path, names: set[str]) -> dict[str, np.ndarray]:
    """_read_file's tensors as numpy arrays, without torch for a .safetensors (safetensors' numpy reader); a
    pytorch_model*.bin, or a dtype numpy lacks (bfloat16: its values as float32), goes through torch."""
    if path.suffix == ".safetensors":
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="numpy") as st:
                keys = st.keys()  # safe_open is not iterable
                keys = [k for k in keys if normalise_key(k) in names]
                if all(st.get_slice(k).get_dtype() in _NUMPY_READS for k in keys):
                    return {k: st.get_tensor(k) for k in keys}
        except Exception as e:  # a corrupt or foreign file: say which one and why
            raise DraftFormatError(f"{path}: cannot read tensors ({e.__class__.__name__}: {e})") from None
    return {k: _numpy(v) for k, v in _read_file(path, names).items()}


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A CPU torch tensor as a numpy array (a copy: a memory-mapped .bin is not kept open); a dtype numpy lacks
    (bfloat16, float8) as float32, which holds its values exactly."""
    try:
        return tensor.numpy().copy()
    except TypeError:  # numpy has no such dtype
        return tensor.float().numpy()


@dataclass
class DraftCheckpoint:
    """An opened draft folder: its config.json as a dict and its weight files; tensors are read on demand."""

    folder: Path
    config: dict
    files: list[Path]

    def shapes(self) -> dict[str, tuple[list[int], str]]:
        """Normalised name -> (shape, dtype name) of every tensor, from the headers only."""
        out = {}
        for path in self.files:
            if path.suffix != ".safetensors":  # a .bin is memory-mapped by _read_file: still no copy
                out.update(
                    {normalise_key(k): (list(t.shape), _dtype_name(t.dtype)) for k, t in _read_file(path, None).items()}
                )
                continue
            try:
                from safetensors import safe_open

                with safe_open(str(path), framework="numpy") as st:  # headers only: torch is not needed
                    keys = st.keys()  # safe_open is not iterable
                    for name in keys:
                        part = st.get_slice(name)
                        out[normalise_key(name)] = (list(part.get_shape()), _dtype_name(part.get_dtype()))
            except Exception as e:  # a corrupt or foreign file: say which one and why
                raise DraftFormatError(f"{path}: cannot read tensor headers ({e.__class__.__name__}: {e})") from None
        return out

    def tensor(self, name: str) -> torch.Tensor | None:
        """One tensor by its normalised name (e.g. d2t), or None when no file holds it."""
        for path in self.files:
            found = _read_file(path, {name})
            if found:
                return next(iter(found.values()))
        return None

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor, by normalised name."""
        state = {}
        for path in self.files:
            state.update({normalise_key(k): v for k, v in _read_file(path, None).items()})
        return state

    def array(self, name: str) -> np.ndarray | None:
        """One tensor by its normalised name as a numpy array (same values as `tensor`; bfloat16 as float32), or None
        when no file holds it. Without torch from a .safetensors, unless the dtype is one numpy lacks (bfloat16)."""
        for path in self.files:
            found = _read_arrays(path, {name})
            if found:
                return next(iter(found.values()))
        return None


_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "BOOL": "bool"}
# safetensors dtypes its numpy reader returns as they are (bfloat16 and the float8s it refuses)
_NUMPY_READS = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "F32", "F64"}


def _dtype_name(dtype) -> str:
    """One spelling for dtypes from safetensors headers ('BF16') and torch ('torch.bfloat16'): 'bfloat16'."""
    text = str(dtype)
    return _SAFETENSORS_DTYPES.get(text, text.removeprefix("torch."))


def open_checkpoint(folder) -> DraftCheckpoint:
    """Open a draft folder: config.json must be a JSON object; weights are located but not loaded."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise DraftFormatError(f"draft folder {folder} does not exist")
    cfg_path = folder / CONFIG
    if not cfg_path.exists():
        raise DraftFormatError(f"{folder}: no {CONFIG}; expected a draft folder with config.json + *.safetensors")
    config = read_json(cfg_path)
    if not isinstance(config, dict):
        raise DraftFormatError(f"{cfg_path}: expected a JSON object")
    return DraftCheckpoint(folder=folder, config=config, files=weight_files(folder))


def _shards(state: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Greedy, in name order: each shard's tensors sum to at most max_bytes (safetensors' header is extra, small)."""
    shards, size = [{}], 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if nbytes > max_bytes:
            raise ValueError(f"tensor {name} is {nbytes} bytes, over the shard cap of {max_bytes} bytes")
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = state[name]
        size += nbytes
    return shards


def write_checkpoint(folder, config: dict, state: dict[str, torch.Tensor], max_shard_bytes: int | None = None) -> Path:
    """Write config.json and the tensors atomically: one model.safetensors, or, when they exceed max_shard_bytes,
    model-0000i-of-0000n.safetensors shards plus model.safetensors.index.json."""
    from safetensors.torch import save_file

    folder = Path(folder)
    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    total = sum(v.numel() * v.element_size() for v in state.values())
    shards = _shards(state, max_shard_bytes - HEADER_ROOM) if max_shard_bytes and total > max_shard_bytes else [state]
    with atomic_path(folder) as tmp:
        tmp.mkdir(parents=True)
        if len(shards) == 1:
            save_file(shards[0], str(tmp / WEIGHTS), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards, 1):
                name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / name), metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(shard, name))
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return folder
