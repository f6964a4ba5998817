"""Synthetic GGUF models: random weights at real shapes and quant mixes, written fast.

For benchmarks that need a model's shapes, types and bytes but not its knowledge (decode
speed, memory, graph replay) when the real file is not at hand:

    config = preset_config("qwen36-27b")                       # or tiny=True, n_layer=...
    plan = plan_synthetic(config, "iq4_xs")                    # types, offsets, file size
    write_synthetic("/tmp/q36.gguf", plan, seed=0, workers=16)

Quantized tensors are made block by block as random bits with sane f16 scales
(luce.testing.synthetic_blocks: values of std ~0.02), never by quantizing floats, and are
written chunk by chunk (`CHUNK_BYTES`) by a pool of processes with positioned writes, so
memory stays at a few chunks per worker whatever the model size. A chunk's bytes depend
only on (seed, tensor name, chunk index): same inputs give the same file for any number of
workers. Small F32 tensors (norms, biases, ssm_a, dt bias, conv1d) get the tiny models'
initialisation. Tensor types follow luce.gguf.writer.plan_tensor_types (llama.cpp's
recipes, no imatrix); names and shapes follow luce.testing.tensor_layout, so
luce.models.load_model loads the file. The tokenizer is the tiny test tokenizer padded
with `[PAD<i>]` tokens (type UNUSED) to the vocabulary size: benchmarks feed token ids.
"""
from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import tempfile
import time
import zlib
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

from luce.gguf.config import ModelConfig
from luce.gguf.quants import row_nbytes
# write_gguf has no way to take raw bytes, so its typing rules for metadata are reused as is
from luce.gguf.writer import _add_metadata, config_metadata, mix_file_type, plan_tensor_types
from luce.testing.synthetic_blocks import SYNTHESIZED_TYPES, random_tensor_bytes
from luce.testing.tensor_layout import tensor_shapes
from luce.testing.tiny_tokenizer import tiny_tokenizer_metadata

CHUNK_BYTES = 32 << 20
ALIGNMENT = 32                       # GGUF default data alignment (GGUFWriter's)
TOKEN_TYPE_UNUSED = 5
_RMS_EPS = float(np.float32(1e-6))   # stored as FLOAT32: keeps configs equal after a round trip


def _qwen35(n_layer=64, hidden=5120, ffn=17408, n_head=24, n_head_kv=4, head_dim=256, rope_dim=64,
            sections=(11, 11, 10, 0), n_k=16, n_v=48, state=128, vocab=248320) -> ModelConfig:
    return ModelConfig(
        arch="qwen35", n_layer=n_layer, hidden=hidden, ffn=ffn, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, vocab=vocab, rms_eps=_RMS_EPS, rope_theta=1e7, rope_dim=rope_dim,
        context_length=262144, rope_sections=sections, qk_norm=True,
        recurrent_layers=tuple((il + 1) % 4 != 0 for il in range(n_layer)), ssm_conv_kernel=4,
        ssm_state_size=state, ssm_n_k_heads=n_k, ssm_n_v_heads=n_v, ssm_inner=n_v * state)


def _qwen2(n_layer, hidden, ffn, n_head, n_head_kv, vocab=151936) -> ModelConfig:
    return ModelConfig(arch="qwen2", n_layer=n_layer, hidden=hidden, ffn=ffn, n_head=n_head,
                       n_head_kv=n_head_kv, head_dim=hidden // n_head, vocab=vocab, rms_eps=_RMS_EPS,
                       rope_theta=1e6, rope_dim=hidden // n_head, context_length=32768, qkv_bias=True)


def dflash_target_layers(target_n_layer: int, n_captured: int = 5) -> tuple[int, ...]:
    """z-lab's default captured layers 1 + i (n - 4) / (N - 1), i < N (27B: 1, 16, 31, 46, 61);
    targets too shallow for that spread i (n - 1) / (N - 1) instead (duplicates dropped)."""
    n, last = target_n_layer, max(n_captured - 1, 1)
    if n - 4 >= last:
        ids = {int(1 + i * (n - 4) / last) for i in range(n_captured)}
    else:
        ids = {int(i * (n - 1) / last) for i in range(n_captured)}
    return tuple(sorted(ids))


def dflash_config(target: ModelConfig, n_layer: int = 5, n_head: int = 32, n_head_kv: int = 8,
                  head_dim: int = 128, block_size: int = 16, target_layers=None,
                  mask_token_id: int | None = None) -> ModelConfig:
    """A DFlash draft for `target`: its hidden, FFN, vocab and rope theta; NEOX rotary on the
    whole head (degenerate M-RoPE sections when the target uses M-RoPE, as the converter)."""
    layers = tuple(target_layers) if target_layers else dflash_target_layers(target.n_layer)
    if not layers or not all(0 <= i < target.n_layer for i in layers):
        raise ValueError(f"target_layers {layers} must be layer ids of the {target.n_layer}-layer target")
    if mask_token_id is None:
        mask_token_id = tiny_tokenizer_metadata()["tokenizer.ggml.tokens"].index("<|mask|>")
    return ModelConfig(
        arch="dflash", n_layer=n_layer, hidden=target.hidden, ffn=target.ffn, n_head=n_head,
        n_head_kv=n_head_kv, head_dim=head_dim, vocab=target.vocab, rms_eps=target.rms_eps,
        rope_theta=target.rope_theta, rope_dim=head_dim, context_length=target.context_length,
        rope_sections=(head_dim // 2, 0, 0, 0) if target.rope_sections else (), qk_norm=True,
        tied_embeddings=True, target_layers=layers, block_size=block_size, mask_token_id=mask_token_id)


# Tiny sizes keep every row length a multiple of 256 (so the K and IQ types really occur)
# and the vocabulary above the tiny tokenizer's 420 tokens.
_TINY_Q35 = dict(n_layer=4, hidden=256, ffn=512, n_head=4, n_head_kv=1, head_dim=64, rope_dim=16,
                 sections=(3, 3, 2, 0), n_k=2, n_v=4, state=64, vocab=512)
_DRAFT_DIMS = {False: dict(n_layer=5, n_head=32, n_head_kv=8, head_dim=128),
               True: dict(n_layer=2, n_head=4, n_head_kv=2, head_dim=64)}
_DENSE = {  # (n_layer, hidden, ffn, n_head, n_head_kv, vocab): full size, tiny
    "qwen2.5-coder-1.5b": ((28, 1536, 8960, 12, 2, 151936), (3, 256, 512, 4, 2, 512)),
    "qwen2.5-coder-0.5b": ((24, 896, 4864, 14, 2, 151936), (2, 256, 512, 4, 1, 512)),
}
PRESETS = {"qwen36-27b": "iq4_xs", "dflash-27b": "q8_0",
           "qwen2.5-coder-1.5b": "q4_k_m", "qwen2.5-coder-0.5b": "q4_k_m"}   # name -> default mix


def preset_config(name: str, tiny: bool = False, n_layer: int | None = None,
                  target: ModelConfig | None = None, **dflash_overrides) -> ModelConfig:
    """The config of preset `name` (PRESETS), scaled down when `tiny`, with `n_layer` layers
    if given (qwen35 keeps every 4th layer full attention). For the DFlash preset, `target`
    (a target config, e.g. read from its file; default the qwen36-27b preset of the same
    scale) sets the shared sizes, and keywords go to `dflash_config` (block_size, ...)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: use one of {', '.join(PRESETS)}")
    if name == "dflash-27b":
        target = target or _qwen35(**(_TINY_Q35 if tiny else {}))
        config = dflash_config(target, **{**_DRAFT_DIMS[bool(tiny)], **dflash_overrides})
    elif dflash_overrides or target is not None:
        raise ValueError(f"target and draft options apply to dflash-27b, not {name}")
    elif name == "qwen36-27b":
        config = _qwen35(**(_TINY_Q35 if tiny else {}))
    else:
        config = _qwen2(*_DENSE[name][bool(tiny)])
    if n_layer is not None:
        if n_layer < 1:
            raise ValueError(f"n_layer must be >= 1, got {n_layer}")
        config = dataclasses.replace(config, n_layer=n_layer)
        if config.arch == "qwen35":
            config = dataclasses.replace(config, recurrent_layers=tuple((il + 1) % 4 != 0 for il in range(n_layer)))
    return config


def default_mix(name: str) -> str:
    return PRESETS[name]


def padded_tokenizer(vocab: int) -> dict[str, object]:
    """The tiny tokenizer's keys with `[PAD<i>]` tokens (UNUSED) appended up to `vocab`."""
    md = tiny_tokenizer_metadata()
    tokens, types = list(md["tokenizer.ggml.tokens"]), list(md["tokenizer.ggml.token_type"])
    if vocab < len(tokens):
        raise ValueError(f"vocab {vocab} is smaller than the tiny tokenizer ({len(tokens)} tokens)")
    n_pad = vocab - len(tokens)
    md["tokenizer.ggml.tokens"] = tokens + [f"[PAD{i}]" for i in range(n_pad)]
    md["tokenizer.ggml.token_type"] = types + [TOKEN_TYPE_UNUSED] * n_pad
    return md


# ---- plan -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]     # numpy order, rows along the last axis
    qtype: Q
    offset: int                # from the start of the data section
    nbytes: int

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])


@dataclass(frozen=True)
class SyntheticPlan:
    config: ModelConfig
    mix: str
    metadata: dict
    tensors: tuple[TensorPlan, ...]

    @property
    def data_bytes(self) -> int:
        """Bytes of the data section (every tensor padded to ALIGNMENT)."""
        return sum(_pad(t.nbytes) for t in self.tensors)

    def type_counts(self) -> dict[str, tuple[int, int]]:
        """type name -> (tensors, bytes)."""
        out: dict[str, tuple[int, int]] = {}
        for t in self.tensors:
            n, b = out.get(t.qtype.name, (0, 0))
            out[t.qtype.name] = (n + 1, b + t.nbytes)
        return out


def _pad(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def plan_synthetic(config: ModelConfig, mix: str, name: str = "") -> SyntheticPlan:
    """Metadata, tensor types (plan_tensor_types under `mix`) and data offsets of a file."""
    shapes = tensor_shapes(config)
    types = plan_tensor_types(config, shapes, mix)
    bad = sorted({t.name for t in types.values() if t not in SYNTHESIZED_TYPES})
    if bad:
        raise ValueError(f"mix {mix!r} gives types {bad} that cannot be synthesized")
    metadata = config_metadata(config)
    metadata["general.file_type"] = np.uint32(mix_file_type(mix))
    if any(t not in (Q.F32, Q.F16, Q.BF16) for t in types.values()):
        metadata["general.quantization_version"] = np.uint32(2)
    metadata.update(padded_tokenizer(config.vocab))
    metadata["general.name"] = f"luce-synthetic-{name or config.arch}-{mix}"
    tensors, offset = [], 0
    for tname, shape in shapes.items():
        nbytes = math.prod(shape[:-1]) * row_nbytes(types[tname], shape[-1])
        tensors.append(TensorPlan(tname, tuple(shape), types[tname], offset, nbytes))
        offset += _pad(nbytes)
    return SyntheticPlan(config, mix, metadata, tuple(tensors))


def write_header(path: str | os.PathLike, plan: SyntheticPlan) -> int:
    """Write the GGUF header, metadata and tensor infos of `plan` to `path` (truncating it);
    returns the data section's offset (the header end padded to ALIGNMENT)."""
    writer = GGUFWriter(os.fspath(path), plan.config.arch)
    for key, value in plan.metadata.items():
        _add_metadata(writer, key, value)
    for t in plan.tensors:
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    end = writer.fout[0].tell()
    writer.close()
    return _pad(end)


def predicted_file_size(plan: SyntheticPlan) -> int:
    """Exact size of the file `write_synthetic` writes for `plan` (header measured in a temp file)."""
    with tempfile.TemporaryDirectory() as tmp:
        return write_header(os.path.join(tmp, "header.gguf"), plan) + plan.data_bytes


# ---- tensor data ------------------------------------------------------------------------------

def _small_tensor(name: str, count: int, rng: np.random.Generator) -> np.ndarray:
    """f32 [count] for the F32 tensors of a model (tiny_models' initialisation)."""
    if name.endswith("_norm.weight"):
        return 1.0 + 0.1 * rng.standard_normal(count)
    if name.endswith(".ssm_a"):
        return -rng.uniform(1.0, 16.0, count)
    if name.endswith("ssm_dt.bias"):
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), count))
        return dt + np.log(-np.expm1(-dt))        # softplus^-1(dt)
    if name.endswith(".bias"):
        return 0.1 * rng.standard_normal(count)
    if "ssm_conv1d" in name:
        return 0.5 * rng.standard_normal(count)   # 1 / sqrt(conv kernel 4)
    return None


def chunk_tasks(plan: SyntheticPlan, data_offset: int, seed: int) -> list[tuple]:
    """(name, qtype, n, row0, row1, file offset, seed, chunk) per chunk of at most
    CHUNK_BYTES (one row at least), largest tensors first to balance the pool."""
    tasks = []
    for t in sorted(plan.tensors, key=lambda t: -t.nbytes):
        n = t.shape[-1]
        row_bytes = t.nbytes // t.rows
        step = max(1, CHUNK_BYTES // row_bytes)
        for chunk, row0 in enumerate(range(0, t.rows, step)):
            row1 = min(t.rows, row0 + step)
            tasks.append((t.name, int(t.qtype), n, row0, row1, data_offset + t.offset + row0 * row_bytes,
                          seed, chunk))
    return tasks


def chunk_bytes(task: tuple) -> np.ndarray:
    """u8 bytes of one chunk (a pure function of the task)."""
    name, qtype, n, row0, row1, _, seed, chunk = task
    rng = np.random.Generator(np.random.SFC64([seed, zlib.crc32(name.encode()), chunk]))
    if qtype == Q.F32:
        small = _small_tensor(name, (row1 - row0) * n, rng)
        if small is not None:
            return small.astype(np.float32).view(np.uint8)
    return random_tensor_bytes(qtype, row1 - row0, n, rng)


_FD = None


def _open_for_workers(path: str) -> None:
    global _FD
    _FD = os.open(path, os.O_WRONLY)


def _write_chunk(task: tuple) -> int:
    data = chunk_bytes(task)
    view, offset = memoryview(data), task[5]
    while len(view):
        written = os.pwrite(_FD, view, offset)
        view, offset = view[written:], offset + written
    return data.nbytes


@dataclass(frozen=True)
class WriteStats:
    path: str
    file_bytes: int
    seconds: float
    workers: int

    @property
    def mb_per_s(self) -> float:
        return self.file_bytes / 1e6 / max(self.seconds, 1e-9)


def write_synthetic(path: str | os.PathLike, plan: SyntheticPlan, seed: int = 0, workers: int = 1,
                    progress=None) -> WriteStats:
    """Write `plan` with random weights to `path`; `workers` processes write chunks in
    parallel (1: in this process). progress(done_bytes, total_bytes) is called per chunk."""
    path = os.fspath(path)
    start = time.perf_counter()
    data_offset = write_header(path, plan)
    total = data_offset + plan.data_bytes
    with open(path, "r+b") as f:
        f.truncate(total)                         # padding stays zero; chunks land in place
    tasks = chunk_tasks(plan, data_offset, seed)
    done = 0
    if workers <= 1:
        _open_for_workers(path)
        try:
            for task in tasks:
                done += _write_chunk(task)
                if progress:
                    progress(done, plan.data_bytes)
        finally:
            os.close(_FD)
    else:
        with multiprocessing.get_context("fork").Pool(workers, _open_for_workers, (path,)) as pool:
            for nbytes in pool.imap_unordered(_write_chunk, tasks):
                done += nbytes
                if progress:
                    progress(done, plan.data_bytes)
    size = os.path.getsize(path)
    if size != total:
        raise RuntimeError(f"{path}: wrote {size} bytes, planned {total}")
    return WriteStats(path, size, time.perf_counter() - start, max(1, workers))
