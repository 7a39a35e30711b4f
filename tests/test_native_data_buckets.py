"""Aspect-ratio buckets (data.native.mode=buckets): one size per batch for Swin / CvT, varied sizes across batches."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tiny_runs import TINY_MODEL, tiny_run
from torch.utils.data import DistributedSampler

from visionpe.data.native.buckets import DEFAULT_ASPECTS, AspectBucketSampler, bucket_sizes, nearest_bucket
from visionpe.engine import train


def test_bucket_sizes_fit_the_budget_and_keep_their_aspect_within_one_patch():
    for budget in (16, 49, 64, 200):
        for (H, W), a in zip(bucket_sizes(DEFAULT_ASPECTS, budget, 4), DEFAULT_ASPECTS):
            gh, gw = H // 4, W // 4
            assert H % 4 == 0 and W % 4 == 0 and gh * gw <= budget
            assert abs(gw - gh * a) <= 1, (budget, a, gh, gw)
            assert gh * gw >= budget / 2  # not far below the budget


def test_nearest_bucket_is_the_nearest_in_log_ratio():
    assert nearest_bucket((30, 90), DEFAULT_ASPECTS) == DEFAULT_ASPECTS.index(3.0)
    assert nearest_bucket((50, 49), DEFAULT_ASPECTS) == DEFAULT_ASPECTS.index(1.0)
    assert nearest_bucket((90, 40), DEFAULT_ASPECTS) == DEFAULT_ASPECTS.index(1 / 2)
    for h, w in ((13, 70), (70, 13), (20, 25)):
        i = nearest_bucket((h, w), DEFAULT_ASPECTS)
        d = abs(math.log(DEFAULT_ASPECTS[i] * h / w))
        assert all(d <= abs(math.log(a * h / w)) + 1e-12 for a in DEFAULT_ASPECTS)


class _Sizes(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.hw = torch.randint(10, 90, (n, 2), generator=g).tolist()

    def __len__(self):
        return len(self.hw)


def test_bucket_batches_hold_one_size_each_and_ranks_get_equal_counts_of_their_own_images():
    ds = _Sizes(400)
    size = lambda i: tuple(ds.hw[i])  # noqa: E731
    samplers = [
        AspectBucketSampler(DistributedSampler(ds, 2, r, seed=5), size, DEFAULT_ASPECTS, 32, 4, 256, seed=5)
        for r in range(2)
    ]
    epochs = [list(s) for s in samplers]
    assert len(epochs[0]) == len(epochs[1]) == samplers[0].num_batches() > 5
    shapes = bucket_sizes(DEFAULT_ASPECTS, 32, 4)
    for batches in epochs:
        for b in batches:
            assert len({k.size for k in b}) == 1 and b[0].size in shapes
            assert all(shapes[nearest_bucket(size(k.index), DEFAULT_ASPECTS)] == k.size for k in b)
            assert len(b) * b[0].size[0] * b[0].size[1] <= 256 * 16
    assert len({b[0].size for b in epochs[0]}) > 3  # varied sizes across batches
    assert not {k.index for b in epochs[0] for k in b} & {k.index for b in epochs[1] for k in b}
    samplers[0].start_at(2)
    assert list(samplers[0]) == epochs[0][2:]


def test_too_few_images_for_every_bucket_is_a_one_line_error():
    ds = _Sizes(20)  # up to 32 images a batch (256 tokens, 8-token buckets) over 7 buckets: no batch is sure
    size = lambda i: tuple(ds.hw[i])  # noqa: E731
    with pytest.raises(ValueError, match="cannot be sure to fill one batch") as e:
        AspectBucketSampler(DistributedSampler(ds, 1, 0), size, DEFAULT_ASPECTS, 16, 4, 256)
    assert "\n" not in str(e.value)
    enough = AspectBucketSampler(DistributedSampler(_Sizes(400), 1, 0), size, DEFAULT_ASPECTS, 16, 4, 256)
    assert enough.num_batches() == 400 // 32 - 7  # 32 images a batch in the smallest (8-token) bucket


def test_swin_trains_on_aspect_buckets(tmp_path, fashion_root):
    data = [
        "data.name=fashion-mnist-native",
        f"data.root={fashion_root}",
        "data.options.num_train=240",
        "data.options.num_val=32",
        "data.options.side=32",
        "data.options.item=16",
        "data.native.mode=buckets",
        "data.native.max_tokens=16",
        "data.native.tokens_per_batch=64",
    ]
    swin = ["model.name=swin_t_rpb", "model.kwargs.depths=[1,1]", "model.kwargs.num_heads=[2,2]"]
    swin += ["model.kwargs.embed_dim=16", "model.kwargs.window_size=2"]
    vit = {o.split("=")[0] for o in TINY_MODEL}
    common = [o for o in tiny_run(tmp_path, data, "train.log_every=1", "train.epochs=1") if o.split("=")[0] not in vit]
    run = train(None, [*common, *swin])
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert len({tuple(r["resolution"]) for r in train_rows}) > 2 and all(r["padding"] == 0 for r in train_rows)
    assert {r["resolution"] for r in rows if r["kind"] == "eval"} == {16, "16tok"}
