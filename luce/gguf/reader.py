"""Memory-mapped GGUF model reader: header, metadata, tensor table, validation.

The header is parsed here (fast: string arrays such as 150k-token vocabularies take a
fraction of a second, where gguf.GGUFReader takes ~11 s) straight from one read-only
np.memmap of the file; the gguf package supplies the format constants. Tensor data is never
read at open: `raw()` hands out zero-copy views of the map. Every problem surfaces as a
`GGUFError` subclass naming the file, key or tensor, expected vs found, and the fix.

    with GGUFModel("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf") as model:
        c = model.config                     # c.n_layer == 28, c.hidden == 1536
        w = model.dequantize("token_embd.weight", expect_shape=(c.vocab, c.hidden))  # f32
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from luce.gguf.config import ModelConfig
from luce.gguf.errors import (GGUFError, MissingKeyError, MissingTensorError, NotGGUFError,
                              TensorShapeError, TruncatedGGUFError, UnsupportedQuantError)
from luce.gguf.metadata import check_tensors as check_model_tensors
from luce.gguf.metadata import parse_config, same_shape, supported_qtypes

__all__ = ["GGUFModel", "TensorInfo", "read_config", "MISSING"]

MISSING = object()  # sentinel: GGUFModel.get(key) without a default raises MissingKeyError

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SCALAR_DTYPES = {
    GGUFValueType.UINT8: np.dtype("<u1"), GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"), GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"), GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.UINT64: np.dtype("<u8"), GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT32: np.dtype("<f4"), GGUFValueType.FLOAT64: np.dtype("<f8"),
    GGUFValueType.BOOL: np.dtype("u1"),
}
_MAX_DIMS = 4  # GGML_MAX_DIMS


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file. shape is in NUMPY order (reverse of ggml `ne`), e.g.
    token_embd.weight [vocab, hidden]; offset is the absolute file offset of its data."""
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    nbytes: int
    offset: int


class _HeaderParser:
    """Reads the GGUF header from a uint8 buffer with a bounds check on every read."""

    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.size, self.path, self.pos = buf, len(buf), path, 0

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise TruncatedGGUFError(
                f"the file ends inside {what}", file=self.path, key=f"offset {self.pos}",
                expected=f"{n} more bytes", found=f"a file of {self.size} bytes")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        start, self.pos = self.pos, self.pos + n
        return self._decode(start, self.pos, what)

    def _decode(self, start: int, end: int, what: str) -> str:
        try:
            return str(self.buf[start:end], "utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError("a string is not valid UTF-8", file=self.path, key=what,
                            expected="UTF-8 text", found=f"{e.reason} at offset {start + e.start}")

    def value(self, vtype: int, key: str) -> object:
        dtype = _SCALAR_DTYPES.get(vtype)
        if dtype is not None:
            self.need(dtype.itemsize, f"the value of {key}")
            v = np.frombuffer(self.buf, dtype, 1, self.pos)[0]
            self.pos += dtype.itemsize
            return bool(v) if vtype == GGUFValueType.BOOL else v.item()
        if vtype == GGUFValueType.STRING:
            return self.string(f"the value of {key}")
        if vtype == GGUFValueType.ARRAY:
            return self.array(key)
        raise GGUFError("unknown metadata value type", file=self.path, key=key,
                        expected="a GGUFValueType id (0..12)", found=vtype)

    def array(self, key: str) -> list:
        itype = self.u32(f"the array type of {key}")
        count = self.u64(f"the array length of {key}")
        if count > self.size - self.pos:  # every element takes at least one byte
            raise TruncatedGGUFError(
                "an array is longer than the rest of the file", file=self.path, key=key,
                expected=f"at most {self.size - self.pos} elements", found=count)
        dtype = _SCALAR_DTYPES.get(itype)
        if dtype is not None:
            self.need(count * dtype.itemsize, f"the array {key}")
            arr = np.frombuffer(self.buf, dtype, count, self.pos)
            self.pos += count * dtype.itemsize
            return arr.astype(bool).tolist() if itype == GGUFValueType.BOOL else arr.tolist()
        if itype == GGUFValueType.STRING:
            return self._string_array(count, key)
        return [self.value(itype, key) for _ in range(count)]

    def _string_array(self, count: int, key: str) -> list[str]:
        # hot loop for vocabularies and merges (hundreds of thousands of entries)
        buf, size, pos, unpack = self.buf, self.size, self.pos, _U64.unpack_from
        out: list[str] = []
        append = out.append
        try:
            for _ in range(count):
                (n,) = unpack(buf, pos)
                end = pos + 8 + n
                if end > size:
                    break
                append(str(buf[pos + 8:end], "utf-8"))
                pos = end
        except (struct.error, UnicodeDecodeError):
            pass
        self.pos = pos
        if len(out) < count:  # re-read the failing element through the checked path
            self.string(f"element {len(out)} of {key}")
        return out


def _parse_header(buf: memoryview, path: Path):
    """-> (version, metadata dict, alignment, list[TensorInfo]) with data bounds checked."""
    p = _HeaderParser(buf, path)
    if p.size < 4 or bytes(buf[:4]) != _U32.pack(GGUF_MAGIC):
        raise NotGGUFError("not a GGUF file (bad magic)", file=path, key="magic",
                           expected="b'GGUF'", found=repr(bytes(buf[:4])))
    p.pos = 4
    version = p.u32("the header (version)")
    if version & 0xFFFF == 0 and version:
        raise GGUFError("big-endian GGUF files are not supported", file=path, key="version",
                        expected="a little-endian file", found=f"byte-swapped version {version:#x}")
    if version not in (2, 3):
        raise NotGGUFError("unsupported GGUF version", file=path, key="version",
                           expected="2 or 3", found=version)
    n_tensors = p.u64("the header (tensor count)")
    n_kv = p.u64("the header (metadata count)")
    metadata: dict[str, object] = {}
    for i in range(n_kv):
        key = p.string(f"metadata entry {i} (key)")
        vtype = p.u32(f"metadata entry {key!r} (type)")
        if key in metadata:
            raise GGUFError("duplicate metadata key", file=path, key=key,
                            expected="each key once", found="it twice")
        metadata[key] = p.value(vtype, key)
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError("invalid alignment", file=path, key="general.alignment",
                        expected="a power of two", found=alignment)
    table = [_read_tensor_entry(p, i) for i in range(n_tensors)]
    data_start = -(-p.pos // alignment) * alignment
    return version, metadata, alignment, _place_tensors(table, data_start, alignment, p.size, path)


def _read_tensor_entry(p: _HeaderParser, i: int) -> tuple[str, tuple[int, ...], int, int]:
    name = p.string(f"tensor entry {i} (name)")
    n_dims = p.u32(f"tensor entry {name!r} (dims)")
    if not 1 <= n_dims <= _MAX_DIMS:
        raise GGUFError("bad tensor dimension count", file=p.path, key=name,
                        expected=f"1..{_MAX_DIMS}", found=n_dims)
    ne = tuple(p.u64(f"tensor entry {name!r} (shape)") for _ in range(n_dims))
    type_id = p.u32(f"tensor entry {name!r} (type)")
    offset = p.u64(f"tensor entry {name!r} (offset)")
    return name, ne, type_id, offset


def _place_tensors(table, data_start: int, alignment: int, size: int, path: Path):
    tensors: dict[str, TensorInfo] = {}
    for name, ne, type_id, rel in table:
        try:
            qtype = GGMLQuantizationType(type_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise UnsupportedQuantError(
                "unknown ggml tensor type id", file=path, key=name,
                expected=f"one of {', '.join(t.name for t in supported_qtypes())}",
                found=f"type id {type_id}") from None
        if ne[0] % block:
            raise TensorShapeError(f"row length is not a multiple of the {qtype.name} block",
                                   file=path, key=name, expected=f"a multiple of {block}",
                                   found=ne[0])
        nbytes = ne[0] // block * type_size * math.prod(ne[1:])
        if name in tensors:
            raise GGUFError("duplicate tensor name", file=path, key=name,
                            expected="each tensor once", found="it twice")
        if rel % alignment:
            raise GGUFError("misaligned tensor data offset", file=path, key=name,
                            expected=f"a multiple of {alignment}", found=rel)
        offset = data_start + rel
        if offset + nbytes > size:
            raise TruncatedGGUFError(
                "tensor data runs past the end of the file", file=path, key=name,
                subject="tensor", expected=f"a file of at least {offset + nbytes} bytes",
                found=f"{size} bytes")
        tensors[name] = TensorInfo(name, qtype, tuple(reversed(ne)), nbytes, offset)
    return tensors


def _map_file(path: Path) -> np.memmap:
    if not path.exists():
        raise NotGGUFError("no such file", file=path, expected="an existing .gguf file",
                           found="nothing at this path",
                           fix="check the path (or set $LUCE_MODELS / run `make models`)")
    if not path.is_file():
        raise NotGGUFError("not a regular file", file=path, expected="a .gguf file",
                           found="a directory" if path.is_dir() else "a special file")
    size = path.stat().st_size
    if size == 0:
        raise NotGGUFError("the file is empty", file=path, expected="a GGUF header",
                           found="0 bytes", fix="download or convert the model again")
    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except OSError as e:
        raise NotGGUFError("cannot open the file", file=path, found=str(e),
                           fix="check the file's permissions") from e


class GGUFModel:
    """An open, validated GGUF model. Attributes: path (Path), metadata (key -> int | float
    | str | bool | list), config (ModelConfig), tensors (name -> TensorInfo), version,
    alignment. check_tensors=False skips the per-architecture tensor checks (e.g. for the
    vocab-only GGUF files llama.cpp ships)."""

    def __init__(self, path: str | os.PathLike, *, check_tensors: bool = True):
        self.path = Path(path)
        self._map: np.memmap | None = _map_file(self.path)
        try:
            with memoryview(self._map) as buf:
                self.version, self.metadata, self.alignment, self.tensors = \
                    _parse_header(buf, self.path)
            self.config: ModelConfig = parse_config(self.metadata, self.tensors, self.path)
            if check_tensors:
                check_model_tensors(self.config, self.tensors, self.path)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> GGUFModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFModel({str(self.path)!r}, arch={self.config.arch!r}, "
                f"tensors={len(self.tensors)})")

    def get(self, key: str, default: object = MISSING) -> object:
        """Metadata value for `key`; MissingKeyError when absent and no default is given."""
        if key in self.metadata:
            return self.metadata[key]
        if default is MISSING:
            raise MissingKeyError("metadata key not found", file=self.path, key=key,
                                  expected="the key to be present", found="no such key")
        return default

    def tensor_info(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise MissingTensorError("tensor not found", file=self.path, key=name,
                                     expected="the tensor in the file",
                                     found=f"{len(self.tensors)} other tensors")
        return info

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes: a read-only uint8 memmap view [nbytes], no copy."""
        info = self.tensor_info(name)
        if self._map is None:
            raise GGUFError("the model is closed", file=self.path, key=name,
                            fix="read tensors before GGUFModel.close()")
        return self._map[info.offset:info.offset + info.nbytes]

    def dequantize(self, name: str, expect_shape: tuple[int, ...] | None = None) -> np.ndarray:
        """f32 array [shape] (numpy order; expect_shape when given, checked against the file)."""
        info = self.tensor_info(name)
        if expect_shape is not None and not same_shape(tuple(expect_shape), info.shape):
            raise TensorShapeError("tensor shape differs from what the caller expects",
                                   file=self.path, key=name, expected=list(expect_shape),
                                   found=list(info.shape))
        supported = supported_qtypes()
        if info.qtype not in supported:
            raise UnsupportedQuantError(
                "unsupported quant type", file=self.path, key=name,
                expected=f"one of {', '.join(t.name for t in supported)}", found=info.qtype.name)
        out = _dequantize_bytes(self.raw(name), info, self.path)
        return out.reshape(tuple(expect_shape) if expect_shape is not None else info.shape)

    def tokenizer_metadata(self) -> dict:
        """The tokenizer.ggml.* and tokenizer.chat_template* entries (a new dict)."""
        return {k: v for k, v in self.metadata.items()
                if k.startswith("tokenizer.ggml.") or k == "tokenizer.chat_template"
                or k.startswith("tokenizer.chat_template.")}

    def close(self) -> None:
        """Drop this object's map. Views from raw() keep their pages mapped until freed."""
        self._map = None


def _dequantize_bytes(raw: np.ndarray, info: TensorInfo, path: Path) -> np.ndarray:
    from luce.gguf import quants

    try:
        return np.asarray(quants.dequantize(raw, info.qtype, info.shape), dtype=np.float32)
    except quants.QuantError as e:
        raise GGUFError(f"cannot dequantize: {e}", file=path, key=info.name,
                        expected=info.qtype.name, found=f"{info.nbytes} bytes") from e


def read_config(path: str | os.PathLike) -> ModelConfig:
    """Open, validate and return the ModelConfig of a GGUF file."""
    model = GGUFModel(path)
    try:
        return model.config
    finally:
        model.close()
