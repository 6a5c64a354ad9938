"""A GGUF file's header as the doctor reads it: every metadata field and tensor entry, with the tokenizer's arrays
counted but not decoded. gguf's GGUFReader decodes every entry of them (about 100,000 strings in the embedded target:
4 s, and it grows with the vocabulary); walking past them takes milliseconds. Little-endian GGUF v2 and v3, the
layout llama.cpp writes (its gguf.h)."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

MAGIC = b"GGUF"
SKIPPED_ARRAYS = "tokenizer.ggml."  # the vocabulary, its scores, types and merges: only their lengths are kept
DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# ggml types whose tensor data numpy reads as is (the quantized ones are never read here); numpy is imported by
# tensor_values alone: reading a header (all the doctor's --help and most checks need) does without it
_TENSOR_DTYPES = {0: "float32", 1: "float16", 24: "int8", 25: "int16", 26: "int32", 27: "int64", 28: "float64"}


class GGUFFormatError(ValueError):
    pass


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # as the file stores it: ne[0] (the row length) first
    ggml_type: int
    offset: int  # from the start of the data section


@dataclass
class GGUFHeader:
    path: Path
    fields: dict[str, object]  # scalars, strings and lists; SKIPPED_ARRAYS keys are in `lengths` instead
    lengths: dict[str, int]
    tensors: dict[str, Tensor]
    data_start: int
    _buffer: bytes | mmap.mmap = field(repr=False)

    def tensor_values(self, name: str) -> np.ndarray:
        """A copy of an unquantized tensor's values, flat."""
        import numpy as np

        t = self.tensors[name]
        if t.ggml_type not in _TENSOR_DTYPES:
            raise GGUFFormatError(f"{self.path}: tensor {name} has ggml type {t.ggml_type}, not a plain number type")
        count = int(np.prod(t.shape))
        dtype = _TENSOR_DTYPES[t.ggml_type]
        return np.frombuffer(self._buffer, dtype, count, self.data_start + t.offset).copy()


class _Cursor:
    def __init__(self, buffer, path: Path):
        self.buffer, self.at, self.path = buffer, 0, path

    def unpack(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.buffer, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        n = self.unpack("Q")
        raw = bytes(self.buffer[self.at : self.at + n])
        if len(raw) != n:
            raise GGUFFormatError(f"{self.path}: truncated at byte {self.at}")
        self.at += n
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int, keep: bool = True):
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GGUFFormatError(f"{self.path}: unknown value type {kind} at byte {self.at}")
        item, count = self.unpack("I"), self.unpack("Q")
        if item in _SCALARS:
            size = struct.calcsize("<" + _SCALARS[item])
            start, self.at = self.at, self.at + size * count
            if self.at > len(self.buffer):
                raise GGUFFormatError(f"{self.path}: truncated array at byte {start}")
            return list(struct.unpack_from(f"<{count}{_SCALARS[item]}", self.buffer, start)) if keep else count
        if not keep and item == _STRING:  # walk past the strings: their lengths only
            for _ in range(count):
                self.at += 8 + struct.unpack_from("<Q", self.buffer, self.at)[0]
            return count
        values = [self.value(item) for _ in range(count)]
        return values if keep else count


def read_header(path: str | Path) -> GGUFHeader:
    """The header of the GGUF at `path` (its file is mapped, not read: tensor data is touched only when asked for)."""
    path = Path(path)
    with open(path, "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cursor = _Cursor(buffer, path)
    try:
        if buffer[:4] != MAGIC:
            raise GGUFFormatError(f"{path}: no GGUF magic (starts with {bytes(buffer[:4])!r})")
        cursor.at = 4
        version, n_tensors, n_fields = cursor.unpack("IQQ")
        if version not in (2, 3):
            raise GGUFFormatError(f"{path}: GGUF version {version} (big-endian or unknown; v2 and v3 are read)")
        fields, lengths = {}, {}
        for _ in range(n_fields):
            key, kind = cursor.string(), cursor.unpack("I")
            skipped = key.startswith(SKIPPED_ARRAYS) and kind == _ARRAY
            (lengths if skipped else fields)[key] = cursor.value(kind, keep=not skipped)
        tensors = {}
        for _ in range(n_tensors):
            name, n_dims = cursor.string(), cursor.unpack("I")
            shape = tuple(cursor.unpack("Q") for _ in range(n_dims))
            ggml_type, offset = cursor.unpack("IQ")
            tensors[name] = Tensor(name, shape, ggml_type, offset)
    except struct.error:
        raise GGUFFormatError(f"{path}: truncated header (at byte {cursor.at})") from None
    alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cursor.at // alignment) * alignment
    return GGUFHeader(path, fields, lengths, tensors, data_start, buffer)
