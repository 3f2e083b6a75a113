"""The GRPO sampler that keeps each canonical prompt and its perturbed copy in one generation batch.

TRL's `RepeatSampler` shuffles rows, which would split pairs. Here the unit of shuffling is a *unit* of
`unit_size` consecutive rows (2 for a canonical/perturbed pair, else 1); units are permuted, each
row of a unit is repeated `num_generations` times, and a generation batch of `units_per_batch`
units is yielded `repeat_count` times (TRL reuses one generation for `steps_per_generation *
num_iterations` micro-steps). A batch therefore reads, for pairs and G = 2:

    c0 c0 p0 p0 c1 c1 p1 p1 | c0 c0 p0 p0 c1 c1 p1 p1 | ...   (c = canonical, p = perturbed row)

The order of an epoch depends only on (seed, epoch): `set_epoch` (called by the Trainer at every
epoch, also after a resume) reseeds the permutation, so a resumed run reads the same data in the
same order without replaying earlier epochs. Incomplete final batches are dropped, as in TRL.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler


class PairedRepeatSampler(Sampler[int]):
    """Yield dataset row indices unit by unit (see module docstring)."""

    def __init__(self, data_source: Sized, *, unit_size: int, num_generations: int, units_per_batch: int,
                 repeat_count: int = 1, shuffle: bool = True, seed: int = 0) -> None:
        if unit_size < 1 or num_generations < 1 or units_per_batch < 1 or repeat_count < 1:
            raise ValueError("unit_size, num_generations, units_per_batch and repeat_count must be >= 1")
        if len(data_source) % unit_size:
            raise ValueError(f"the dataset has {len(data_source)} rows, not a multiple of the unit size "
                             f"{unit_size} (each canonical row must be followed by its perturbed copy)")
        self.num_rows = len(data_source)
        self.unit_size = unit_size
        self.num_generations = num_generations
        self.units_per_batch = units_per_batch
        self.repeat_count = repeat_count
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    @property
    def num_units(self) -> int:
        return self.num_rows // self.unit_size

    @property
    def num_batches(self) -> int:
        return self.num_units // self.units_per_batch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def unit_order(self) -> list[int]:
        """The units of the current epoch, in order (only full batches)."""
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.num_units, generator=generator).tolist()
        else:
            order = list(range(self.num_units))
        return order[:self.num_batches * self.units_per_batch]

    def __iter__(self) -> Iterator[int]:
        order = self.unit_order()
        for start in range(0, len(order), self.units_per_batch):
            batch = order[start:start + self.units_per_batch]
            for _ in range(self.repeat_count):
                for unit in batch:
                    for row in range(unit * self.unit_size, (unit + 1) * self.unit_size):
                        for _ in range(self.num_generations):
                            yield row

    def __len__(self) -> int:
        return (self.num_batches * self.units_per_batch * self.unit_size * self.num_generations
                * self.repeat_count)

    def state_dict(self) -> dict[str, int]:
        """The data-order state (saved beside each checkpoint)."""
        return {"seed": self.seed, "epoch": self.epoch, "unit_size": self.unit_size,
                "units_per_batch": self.units_per_batch, "num_rows": self.num_rows}
