"""Share: this rank's contiguous part of an ordered split, and the loaders it builds."""

from __future__ import annotations

import pytest
import torch

from visionpe.data.share import Share


@pytest.mark.parametrize("n", [0, 1, 7, 10, 12])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_ranks_cover_every_item_once_in_order(n, world):
    parts = [Share(rank=r, world_size=world).shard(n) for r in range(world)]
    assert [i for part in parts for i in part] == list(range(n))  # contiguous, in rank order, none twice
    assert all(len(p) == -(-n // world) for p in parts if p.stop < n)  # every rank but the last holds ceil(n / W)


def test_shards_of_ten_over_three_ranks():
    assert [list(Share(rank=r, world_size=3).shard(10)) for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_loader_of_keys_and_one_of_whole_batches():
    data = torch.arange(6.0)
    keyed = Share().loader(data, batch_sampler=[[0, 1], [4]])
    assert [b.tolist() for b in keyed] == [[0.0, 1.0], [4.0]]
    whole = Share().loader([torch.ones(3), torch.zeros(2)])  # the dataset makes its own batches
    assert [b.tolist() for b in whole] == [[1.0, 1.0, 1.0], [0.0, 0.0]]
    assert keyed.generator is not whole.generator  # each loader has its own generator, not the global RNG
