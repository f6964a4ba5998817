"""Sampler: validation, hand-computed filters and penalties, (seed, position) determinism."""
import math

import numpy as np
import pytest

from luce.ref.sample_rng import uniform
from luce.engine.sampler import (SamplingError, SamplingParams, apply_penalties,
                                 candidate_distribution, greedy_token, sample_token)


def test_greedy_ties_break_to_lowest_id():
    assert greedy_token(np.array([0.0, 3.0, 1.0, 3.0], np.float32)) == 1


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_tokens": "8"}, "max_tokens"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 2.0}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"frequency_penalty": float("inf")}, "frequency_penalty"),
    ({"seed": True}, "seed"),
    ({"stop": 5}, "stop"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"stop": ("",)}, "stop"),
    ({"stop_token_ids": (-1,)}, "stop_token_ids"),
])
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(SamplingError) as err:
        SamplingParams(**kwargs)
    assert err.value.field == field and field in str(err.value)


def test_top_k_keeps_largest_with_id_order_on_ties():
    logits = np.array([2.0, 1.0, 1.0, 0.0], np.float32)
    ids, probs = candidate_distribution(logits, SamplingParams(temperature=1.0, top_k=2))
    assert ids.tolist() == [0, 1]
    np.testing.assert_allclose(probs, [1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))])


def test_top_p_keeps_smallest_prefix_reaching_p():
    logits = np.log(np.array([0.2, 0.5, 0.3], np.float64)).astype(np.float32)
    ids, probs = candidate_distribution(logits, SamplingParams(temperature=1.0, top_p=0.6))
    assert ids.tolist() == [1, 2]
    np.testing.assert_allclose(probs, [0.625, 0.375], rtol=1e-6)


def test_min_p_drops_tokens_below_fraction_of_best():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float64)).astype(np.float32)
    ids, probs = candidate_distribution(logits, SamplingParams(temperature=1.0, min_p=0.25))
    assert ids.tolist() == [0, 1, 2]
    np.testing.assert_allclose(probs, np.array([0.5, 0.3, 0.15]) / 0.95, rtol=1e-6)


def test_temperature_scales_logits():
    logits = np.array([1.0, 0.0], np.float32)
    _, probs = candidate_distribution(logits, SamplingParams(temperature=0.5))
    np.testing.assert_allclose(probs[0], 1 / (1 + math.exp(-2)), rtol=1e-9)


def test_penalties_hand_computed():
    logits = np.array([2.0, -2.0, 1.0, 0.5], np.float32)
    p = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, p, prompt_ids=[0], output_ids=[1, 2, 2])
    np.testing.assert_allclose(out, [1.0, -4.0 - 0.25 - 0.5, 0.5 - 0.5 - 0.5, 0.5])


def test_draw_depends_only_on_seed_and_position():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50).astype(np.float32)
    p = SamplingParams(temperature=1.0)
    a = [sample_token(logits, p, seed=7, position=n) for n in range(40)]
    b = [sample_token(logits, p, seed=7, position=n) for n in reversed(range(40))][::-1]
    c = [sample_token(logits, p, seed=8, position=n) for n in range(40)]
    assert a == b and a != c


def test_draws_follow_the_distribution():
    logits = np.log(np.array([0.6, 0.3, 0.1])).astype(np.float32)
    p = SamplingParams(temperature=1.0)
    draws = np.array([sample_token(logits, p, seed=3, position=n) for n in range(4000)])
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, [0.6, 0.3, 0.1], atol=0.03)


def test_uniform_in_unit_interval_and_spread():
    us = np.array([uniform(1, n) for n in range(2000)])
    assert us.min() >= 0.0 and us.max() < 1.0
    assert abs(us.mean() - 0.5) < 0.03
