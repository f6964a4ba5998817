"""Embedding rows of a quantized table (cuda/embedding.cu) against luce/ref/embedding.py:
bitwise equal to the host decode for every GGUF type, repeated ids, the last row, odd widths
(float types), many tokens, a strided output and batch invariance."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.gguf import quants
from luce.ref.embedding import embedding_rows

TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS]


def _table(qtype, n_rows: int, cols: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + int(qtype))
    return quants.quantize((rng.standard_normal((n_rows, cols)) * 2).astype(np.float32), qtype)


def test_reference_is_the_host_decode_of_the_rows():
    raw = _table(Q.Q4_K, 5, 512)
    full = quants.dequantize(raw, Q.Q4_K, (5, 512))
    got = embedding_rows(raw, Q.Q4_K, 512, np.array([4, 0, 4]))
    assert np.array_equal(got, full[[4, 0, 4]])
    with pytest.raises(IndexError):
        embedding_rows(raw, Q.Q4_K, 512, np.array([5]))


def _run(raw, qtype, cols, ids, out_stride=None):
    from luce import _cuda_embedding as ke
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    k = load_kernels()
    stride = cols if out_stride is None else out_stride
    table = DeviceBuffer.from_numpy(raw)
    dids = DeviceBuffer.from_numpy(np.asarray(ids, np.int32))
    out = GuardedOutput((len(ids), stride), fill=0.0)
    ke.embedding(table.ptr, dids.ptr, out.ptr, raw.shape[0], cols, raw.shape[1], len(ids), int(qtype),
                 out_stride=stride)
    k.synchronize()
    got = out.result()
    assert not got[:, cols:].any(), "wrote between output rows"
    return got[:, :cols]


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_ids", [1, 2, 63, 64, 65, 129])
def test_kernel_bitwise_equals_host_decode(qtype, n_ids):
    n_rows, cols = 37, 512
    raw = _table(qtype, n_rows, cols, n_ids)
    ids = np.random.default_rng(n_ids).integers(0, n_rows, n_ids)
    ids[0] = n_rows - 1                       # the last row
    got = _run(raw, qtype, cols, ids)
    assert np.array_equal(got.view(np.uint32), embedding_rows(raw, qtype, cols, ids).view(np.uint32))


@pytest.mark.gpu
@pytest.mark.parametrize("qtype,cols", [(Q.F32, 7), (Q.F16, 33), (Q.BF16, 1), (Q.Q8_0, 96), (Q.Q5_0, 160),
                                        (Q.Q6_K, 768)])
def test_odd_widths_and_strided_output(qtype, cols):
    raw = _table(qtype, 9, cols)
    ids = np.array([8, 8, 0, 3])
    got = _run(raw, qtype, cols, ids, out_stride=cols + 5)
    assert np.array_equal(got, embedding_rows(raw, qtype, cols, ids))


@pytest.mark.gpu
def test_special_values_decode_as_on_the_host():
    raw = np.frombuffer(np.array([np.inf, -0.0, 1e-40, 3.5, -2.0, 65504.0], np.float16).tobytes() * 2,
                        np.uint8).reshape(2, 12)
    got = _run(raw, Q.F16, 6, np.array([1, 0]))
    assert np.array_equal(got, embedding_rows(raw, Q.F16, 6, np.array([1, 0])), equal_nan=True)


@pytest.mark.gpu
def test_row_is_batch_invariant():
    raw = _table(Q.IQ4_XS, 50, 256)
    alone = _run(raw, Q.IQ4_XS, 256, np.array([17]))
    many = _run(raw, Q.IQ4_XS, 256, np.r_[np.arange(40), 17, np.arange(23)])
    assert np.array_equal(alone[0], many[40])
