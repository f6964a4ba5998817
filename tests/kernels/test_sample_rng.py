"""Seeded sampling on the device (cuda/sample_rng.cu) against luce/ref/sample_rng.py, which is
the engine's host sampler: the same token for every row, bit for bit, over random logits
with exact ties and -inf entries, every parameter (greedy rows mixed in, top-k 1..64, top-p,
min-p, seeds across 64 bits, positions), a vocab smaller than k, slices of the 8,192-wide
select pass, the full 248,320-token vocab, NaN rows, and batch invariance."""
import numpy as np
import pytest

from luce.ref.sample_rng import MASK64
from luce.engine.sampler import BACKEND_TOPK_MAX, SamplingParams, backend_can_draw, det_exp, sample_token
from luce.ref.sample_rng import sample_rng

TEMPS = (0.0, 0.3, 0.9, 1.7)
TOP_K = (1, 2, 40, 64)
TOP_P = (1.0, 0.95, 0.5)
MIN_P = (0.0, 0.05)


def _logits(rng, rows, vocab):
    """Quantized logits (many exact ties), a few -inf entries per row."""
    x = (np.round(rng.standard_normal((rows, vocab)) * 8) / 4).astype(np.float32)
    for r in range(rows):
        x[r, rng.choice(vocab, min(5, vocab), replace=False)] = -np.inf
    return x


def _params(rng, rows):
    return dict(temperature=rng.choice(TEMPS, rows), top_k=rng.choice(TOP_K, rows).astype(np.int32),
                top_p=rng.choice(TOP_P, rows), min_p=rng.choice(MIN_P, rows),
                seed=rng.integers(0, 2**63, rows, dtype=np.uint64) * 2 + rng.integers(0, 2, rows, dtype=np.uint64),
                position=rng.integers(0, 1 << 40, rows))


def test_reference_is_the_engine_sampler_row_by_row():
    rng = np.random.default_rng(0)
    logits, p = _logits(rng, 12, 300), _params(rng, 12)
    got = sample_rng(logits, **p)
    for i in range(12):
        params = SamplingParams(temperature=float(p["temperature"][i]), top_k=int(p["top_k"][i]),
                                top_p=float(p["top_p"][i]), min_p=float(p["min_p"][i]))
        assert got[i] == sample_token(logits[i], params, int(p["seed"][i]) & MASK64, int(p["position"][i]))
    logits[3, 7] = np.nan
    assert sample_rng(logits, **p)[3] == -1


def test_backend_can_draw_only_what_the_kernel_samples():
    assert backend_can_draw(SamplingParams())                            # greedy
    assert backend_can_draw(SamplingParams(temperature=0.8, top_k=BACKEND_TOPK_MAX))
    assert not backend_can_draw(SamplingParams(temperature=0.8))         # top-k off: the whole vocab
    assert not backend_can_draw(SamplingParams(temperature=0.8, top_k=BACKEND_TOPK_MAX + 1))
    assert not backend_can_draw(SamplingParams(temperature=0.8, top_k=40, repetition_penalty=1.1))


def test_det_exp_is_within_one_ulp_of_exp():
    x = -np.abs(np.random.default_rng(1).standard_normal(20000)) * np.array([1e-3, 1.0, 50.0, 300.0]).repeat(5000)
    x = np.maximum(x, -700.0)                                      # below: 0 by definition
    got, want = det_exp(x), np.exp(x)
    assert (np.abs(got - want) <= np.spacing(want)).all()
    assert det_exp(np.array([0.0, -np.inf, -701.0])).tolist() == [1.0, 0.0, 0.0]


def _device(logits, **p):
    from luce.ops import get_backend

    backend = get_backend("cuda")
    return backend.sample(backend.upload(logits), **p)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,vocab", [(1, 1000), (7, 8192), (9, 8197), (64, 20000), (3, 50), (4, 248320)])
def test_device_draws_equal_the_host_sampler(rows, vocab):
    rng = np.random.default_rng(rows * 1000 + vocab)
    logits, p = _logits(rng, rows, vocab), _params(rng, rows)
    np.testing.assert_array_equal(_device(logits, **p), sample_rng(logits, **p))


@pytest.mark.gpu
def test_many_seeds_and_positions_on_one_row():
    """The draw moves with (seed, position) only: 512 draws of one row, all equal to the host."""
    rng = np.random.default_rng(5)
    row = _logits(rng, 1, 5000)
    logits = np.repeat(row, 512, axis=0)
    p = dict(temperature=np.full(512, 1.1), top_k=np.full(512, 64, np.int32), top_p=np.full(512, 0.9),
             min_p=np.zeros(512), seed=rng.integers(0, 2**63, 512, dtype=np.uint64),
             position=rng.integers(0, 1 << 20, 512))
    got = _device(logits, **p)
    np.testing.assert_array_equal(got, sample_rng(logits, **p))
    assert len(set(got.tolist())) > 5                               # it does sample


@pytest.mark.gpu
def test_batch_invariance_and_nan_rows():
    rng = np.random.default_rng(6)
    logits, p = _logits(rng, 64, 9000), _params(rng, 64)
    together = _device(logits, **p)
    for i in (0, 31, 63):
        alone = _device(logits[i:i + 1], **{k: v[i:i + 1] for k, v in p.items()})
        assert alone[0] == together[i]
    from luce import _cuda_sample_rng as kr
    from luce.ops import get_backend

    assert kr.TOPK_MAX == BACKEND_TOPK_MAX
    logits[5, 100] = np.nan
    with pytest.raises(ValueError, match=r"NaN in logits rows \[5\]"):
        _device(logits, **p)
    backend = get_backend("cuda")
    with pytest.raises(ValueError, match="top_k"):
        backend.sample(backend.upload(logits[:1]), [0.7], [65], [1.0], [0.0], [1], [0])
