"""The paired sampler and unit shuffling: pairs and groups stay whole, order depends on (seed, epoch)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cipr.train.grpo import shuffle_units
from cipr.train.sampler import PairedRepeatSampler


def test_hand_laid_order_for_pairs():
    sampler = PairedRepeatSampler(range(4), unit_size=2, num_generations=2, units_per_batch=2, repeat_count=2,
                                  shuffle=False)
    # units (0,1) and (2,3); each row twice; the batch of two units twice (TRL reuses a generation)
    assert list(sampler) == [0, 0, 1, 1, 2, 2, 3, 3] * 2
    assert len(sampler) == 16


@settings(max_examples=40, deadline=None)
@given(units=st.integers(1, 12), unit_size=st.sampled_from([1, 2]), g=st.integers(1, 4),
       per_batch=st.integers(1, 4), repeat=st.integers(1, 3), seed=st.integers(0, 5))
def test_every_batch_holds_whole_units(units, unit_size, g, per_batch, repeat, seed):
    sampler = PairedRepeatSampler(range(units * unit_size), unit_size=unit_size, num_generations=g,
                                  units_per_batch=per_batch, repeat_count=repeat, seed=seed)
    rows = list(sampler)
    block = unit_size * g
    assert len(rows) == len(sampler) == (units // per_batch) * per_batch * block * repeat
    for start in range(0, len(rows), block):
        chunk = rows[start:start + block]
        unit = chunk[0] // unit_size
        expected = [unit * unit_size + k for k in range(unit_size) for _ in range(g)]
        assert chunk == expected
    batch = per_batch * block
    for start in range(0, len(rows), batch * repeat):  # a generation batch is repeated verbatim
        first = rows[start:start + batch]
        for r in range(1, repeat):
            assert rows[start + r * batch:start + (r + 1) * batch] == first


def test_order_depends_on_seed_and_epoch_only():
    def order(seed, epoch):
        s = PairedRepeatSampler(range(40), unit_size=2, num_generations=1, units_per_batch=4, seed=seed)
        s.set_epoch(epoch)
        return list(s)

    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0)
    assert sorted(order(3, 2)) == list(range(40))


def test_odd_row_count_is_refused():
    import pytest

    with pytest.raises(ValueError, match="not a multiple of the unit size 2"):
        PairedRepeatSampler(range(5), unit_size=2, num_generations=2, units_per_batch=1)


@settings(max_examples=30, deadline=None)
@given(units=st.integers(1, 8), unit_rows=st.integers(1, 6), seed=st.integers(0, 100))
def test_shuffle_units_moves_blocks_not_rows(units, unit_rows, seed):
    n = units * unit_rows
    batch = {"ids": torch.arange(n), "rows": list(range(n)), "scalar": torch.tensor(3.0), "none": None}
    out = shuffle_units(batch, unit_rows, torch.Generator().manual_seed(seed))
    assert out["ids"].tolist() == out["rows"]
    assert out["scalar"].item() == 3.0 and out["none"] is None
    blocks = [out["rows"][i:i + unit_rows] for i in range(0, n, unit_rows)]
    for b in blocks:
        assert b == list(range(b[0], b[0] + unit_rows)) and b[0] % unit_rows == 0
    assert sorted(out["rows"]) == list(range(n))
