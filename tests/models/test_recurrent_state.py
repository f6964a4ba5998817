"""RecurrentState.checkpoint / rollback on the host backend: a step's slots saved and put back
bitwise, other slots never copied, and the same slots again (a steady decode) reusing the
last checkpoint's buffers."""
import numpy as np
import pytest

from luce.models.recurrent_state import RecurrentState
from luce.ops import get_backend


def test_checkpoint_reuses_its_buffers_for_the_same_slots_and_rolls_back_bitwise():
    b = get_backend("numpy")
    rs = RecurrentState(b, (0, 2, 5), 4, (3, 8), (2, 4, 4))
    rng = np.random.default_rng(0)
    for a in rs._all:
        a[...] = rng.standard_normal(a.shape).astype(np.float32)
    per_slot = 4 * 3 * (3 * 8 + 2 * 4 * 4)
    rs.checkpoint((3, 1))
    buffers = rs._saved[3]
    assert rs.saved_slots == (1, 3) and rs.copied_bytes == 2 * per_slot
    for a in rs._all:
        a[:, 1] += 1.0                               # the step's forward advances slot 1 ...
    saved = [a.copy() for a in rs._all]
    rs.checkpoint((3, 1))                            # ... and commits: the next step saves again
    assert rs._saved[3] is buffers and rs.copied_bytes == 4 * per_slot
    for a in rs._all:
        a[:, [1, 3]] = 0.0
    rs.rollback()
    assert all(np.array_equal(a, s) for a, s in zip(rs._all, saved)) and rs.copied_bytes == 6 * per_slot
    rs.checkpoint([0])
    assert rs.saved_slots == (0,) and rs._saved[3] is not buffers
    with pytest.raises(IndexError, match="out of range"):
        rs.checkpoint((4,))
