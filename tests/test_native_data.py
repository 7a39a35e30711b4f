"""Native-aspect data: the packer, resize to a token budget, the NaFlex collate and the batch sampler."""

from __future__ import annotations

import random

import pytest
import torch
from timm.data.naflex_dataset import NaFlexCollator
from timm.data.naflex_transforms import Patchify
from torch.utils.data import DistributedSampler

from visionpe.data.native.collate import collate_native
from visionpe.data.native.items import NativeDataset
from visionpe.data.native.pack import OnlinePacker, pack
from visionpe.data.native.plan import NativePlan
from visionpe.data.native.resize import budget_size, patchify
from visionpe.data.native.sampler import NativeKey


def _stream(n: int, seed: int, lo: int = 1, hi: int = 40) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(i, rng.randint(lo, hi)) for i in range(n)]


def test_packer_places_every_image_once_within_capacity():
    items = _stream(500, 0)
    batches = list(pack(items, capacity=64, rows=8, buffer=48))
    placed = [k for b in batches for row in b for k in row]
    assert sorted(placed) == [k for k, _ in items]
    tokens = dict(items)
    for b in batches:
        assert len(b) == 8
        assert all(sum(tokens[k] for k in row) <= 64 for row in b)


def test_packer_fills_rows_and_holds_at_most_its_buffer():
    items = _stream(2000, 1, 1, 24)
    tokens = dict(items)
    for buffer, most in ((64, 0.05), (128, 0.002)):  # a buffer of one batch's images, then of two
        packer = OnlinePacker(capacity=96, rows=8, buffer=buffer)
        full = [b for key, t in items for b in packer.push(key, t)]
        used = sum(tokens[k] for b in full for row in b for k in row)
        padding = 1 - used / (len(full) * 8 * 96)
        assert packer.peak == buffer and padding < most, (buffer, padding)
        assert len(full) >= int(sum(tokens.values()) / (8 * 96)) - 1


def test_packer_is_deterministic_and_rejects_an_image_larger_than_a_row():
    items = _stream(300, 2)
    assert list(pack(items, 64, 4, 32)) == list(pack(items, 64, 4, 32))
    with pytest.raises(ValueError, match="needs 65 tokens but a row holds 64"):
        list(pack([(0, 3), (1, 65)], 64, 4, 32))


@pytest.mark.parametrize("patch", [4, 16])
def test_budget_size_fits_the_budget_and_keeps_the_aspect_within_one_patch(patch):
    rng = random.Random(patch)
    for _ in range(300):
        h, w, budget = rng.randint(1, 900), rng.randint(1, 900), rng.randint(1, 400)
        H, W = budget_size((h, w), patch, budget)
        gh, gw = H // patch, W // patch
        assert H % patch == 0 and W % patch == 0 and gh * gw <= budget
        # some scale r maps (h, w) to within one patch below (H, W) in both dimensions (timm rounds up)
        lo = max((gh - 1) * patch / h, (gw - 1) * patch / w)
        hi = min(gh * patch / h, gw * patch / w)
        assert lo <= hi + 1e-9 or min(gh, gw) == 1, (h, w, budget, H, W)
        # and the budget is used: one patch more in the shorter dimension's scale would not fit
        if gh > 1 and gw > 1:
            assert (gh + 1) * (gw + 1) > budget


def test_patchify_matches_timm_patchify_and_collate_matches_naflex_collator():
    torch.manual_seed(0)
    images = [torch.randn(3, 8 * gh, 8 * gw) for gh, gw in ((2, 5), (4, 4), (1, 7), (3, 2))]
    ours = [patchify(x, 8) for x in images]
    theirs = [Patchify(8)(x) for x in images]
    for a, b in zip(ours, theirs):
        assert all(torch.equal(a[k], b[k]) for k in b)
    seq = 16
    keys = [NativeKey(i, tuple(x.shape[-2:]), None, i, seq, len(images), False) for i, x in enumerate(images)]
    batch = collate_native([(p, i, k) for i, (p, k) in enumerate(zip(ours, keys))])
    ref, targets = NaFlexCollator(seq)([(p, i) for i, p in enumerate(theirs)])
    assert set(batch.inputs) == {"patches", "patch_coord", "patch_valid"}
    for k in batch.inputs:
        assert batch.inputs[k].dtype == ref[k].dtype and torch.equal(batch.inputs[k], ref[k])
    assert torch.equal(batch.targets, targets)
    assert batch.tokens == 10 + 16 + 7 + 6 and batch.slots == 4 * 16 and batch.images == 4


def test_packed_collate_numbers_images_within_rows_and_orders_targets():
    shapes = [(1, 3), (2, 2), (2, 3), (1, 1)]
    rows = [0, 0, 1, 1]
    items = []
    for i, ((gh, gw), r) in enumerate(zip(shapes, rows)):
        key = NativeKey(i, (4 * gh, 4 * gw), None, r, 10, 3, True)
        items.append((patchify(torch.full((1, 4 * gh, 4 * gw), float(i)), 4), 10 + i, key))
    batch = collate_native([items[2], items[0], items[3], items[1]])  # rows in any order, images in row order
    ids, valid = batch.inputs["image_ids"], batch.inputs["patch_valid"]
    assert ids.shape == (3, 10) and torch.equal(ids >= 0, valid)
    assert ids[0].tolist() == [0, 0, 0, 1, 1, 1, 1, -1, -1, -1]
    assert ids[1].tolist() == [0] * 6 + [1] + [-1] * 3
    assert not valid[2].any()  # an empty row
    per_image = {int(v) for v in batch.inputs["patches"][valid][:, 0]}
    assert per_image == {0, 1, 2, 3}
    assert batch.targets.tolist() == [10, 11, 12, 13] and batch.tokens == 3 + 4 + 6 + 1


class _Sized(torch.utils.data.Dataset):
    """Images of varied aspect whose pixels name their index (render_size draws any size)."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.hw = torch.randint(8, 80, (n, 2), generator=g).tolist()

    def __len__(self):
        return len(self.hw)

    def native_size(self, i):
        return tuple(self.hw[i])

    def render_size(self, i, size):
        return torch.full((1, *size), float(i)) + 0.01 * torch.rand(1, *size), i % 3


def _plan(mode="packed", budgets=(16, 32), tpb=512, row=64):
    return NativePlan(4, mode, budgets, tpb, row, 64)


def _indices(batches):
    return [k.index for b in batches for k in b]


@pytest.mark.parametrize("mode", ["packed", "padded"])
def test_sampler_shards_ranks_repeats_an_epoch_and_restarts_at_a_batch(mode):
    ds = _Sized(300)
    samplers = [
        _plan(mode).sampler(DistributedSampler(ds, 2, r, shuffle=True, seed=3), ds.native_size, _plan(mode), 3)
        for r in range(2)
    ]
    for s in samplers:
        s.set_epoch(1)
    epochs = [list(s) for s in samplers]
    assert len(epochs[0]) == len(epochs[1]) == samplers[0].num_batches() > 3
    first = [set(_indices(e)) for e in epochs]
    assert not first[0] & first[1]  # each rank its own images
    assert all(k.size[0] * k.size[1] <= 16 * max(_plan().budgets) for b in epochs[0] for k in b)
    again = list(_plan(mode).sampler(DistributedSampler(ds, 2, 0, seed=3), ds.native_size, _plan(mode), 3).__iter__())
    assert again != epochs[0]  # epoch 0 differs from epoch 1
    s = samplers[0]
    s.start_at(3)
    assert list(s) == epochs[0][3:] and len(s) == len(epochs[0]) - 3


def test_native_dataset_items_are_seeded_and_leave_the_global_rng_alone():
    ds = NativeDataset(_Sized(10), 4)
    key = NativeKey(4, (8, 12), 123, 0, 16, 1, False)
    state = torch.get_rng_state()
    a, b = ds.__getitems__([key]), ds.__getitems__([key])
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a[0][0]["patches"], b[0][0]["patches"]) and a[0][0]["patches"].shape == (6, 16)


def test_speed_arms_share_the_token_slots_and_packing_pads_least():
    from visionpe.bench.perf.native_speed import arm_batches, image_sizes

    sizes = image_sizes(200, 4, [16, 36, 64], 3.0, seed=0)
    assert all(h / 4 * w / 4 <= 64 for h, w in sizes)
    arms = {arm: arm_batches(arm, sizes, 4, 8, 64, chans=1, steps=3) for arm in ("square", "padded", "packed")}
    slots = {
        arm: [x["patches"].shape[:2].numel() if isinstance(x, dict) else 8 * 64 for x, _, _ in b]
        for arm, b in arms.items()
    }
    assert all(s == 8 * 64 for v in slots.values() for s in v)
    pad = {arm: sum(p for _, _, p in b) / len(b) for arm, b in arms.items()}
    assert pad["square"] == 0 and pad["packed"] < 0.1 < pad["padded"]
    assert sum(n for _, n, _ in arms["packed"]) > sum(n for _, n, _ in arms["padded"])
