"""Datasets and batching: built-in sets, IDX files, image folders, multi-resolution batches, deterministic loading."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DistributedSampler

from visionpe.data import build_dataset, build_train_loader, collate_to_resolution, get_dataset_info, resize_to
from visionpe.data.datasets.fashion_mnist import DEFAULT_ROOT, FashionMNIST, read_idx
from visionpe.data.datasets.folders import ImageFolderDataset
from visionpe.data.datasets.synthetic_shapes import MEAN, STD, SyntheticShapes
from visionpe.data.loader import KeyedDataset, build_eval_loader
from visionpe.data.multires import ResolutionBatchSampler

# ------------------------------------------------------------------------------------------------- synthetic-shapes


def test_synthetic_shapes_is_deterministic_by_seed():
    a = SyntheticShapes("train", 24, num_samples=8, seed=3)
    b = SyntheticShapes("train", 24, num_samples=8, seed=3)
    c = SyntheticShapes("train", 24, num_samples=8, seed=4)
    for i in range(8):
        assert torch.equal(a[i][0], b[i][0]) and a[i][1] == b[i][1]
    assert any(not torch.equal(a[i][0], c[i][0]) for i in range(8))
    val = SyntheticShapes("val", 24, num_samples=8, seed=3)
    assert any(not torch.equal(a[i][0], val[i][0]) for i in range(8))  # splits differ


def test_synthetic_shapes_class_is_where_the_shape_is():
    ds = SyntheticShapes("train", 64, num_samples=64, noise=0.0)
    labels = []
    for i in range(len(ds)):
        img, target = ds[i]
        img = img * STD + MEAN
        bg = torch.tensor(ds.scene(i)["bg"]).view(3, 1, 1)
        fg_mask = (img - bg).abs().sum(0) > 0.3  # (64, 64) pixels of the shape
        ys, xs = fg_mask.nonzero(as_tuple=True)
        assert len(ys) > 10
        quadrant = int(xs.float().mean() >= 32) + 2 * int(ys.float().mean() >= 32)
        assert quadrant == target % 4, f"item {i}: shape at quadrant {quadrant}, class {target}"
        assert xs.min() // 32 == xs.max() // 32 and ys.min() // 32 == ys.max() // 32  # wholly inside its quadrant
        labels.append(target)
    assert len(set(labels)) >= 12  # 16 classes, roughly uniform


def test_synthetic_shapes_same_scene_at_every_resolution():
    ds = SyntheticShapes("val", 16, num_samples=4, noise=0.0)
    for i in range(4):
        big = ds.render(i, 64)[0]
        small = ds.render(i, 16)[0]
        down = torch.nn.functional.avg_pool2d(big[None], 4)[0]  # box-filter 64 -> 16
        assert (down - small).abs().mean() < 0.15 * small.abs().mean()


def test_synthetic_shapes_rejects_a_root():
    with pytest.raises(ValueError, match="drop data.root"):
        build_dataset("synthetic-shapes", "train", 32, root="/data")


# ----------------------------------------------------------------------------------------------------- Fashion-MNIST


def _write_idx(path: Path, array: np.ndarray, gz: bool) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_round_trip(tmp_path, gz):
    arr = np.random.default_rng(0).integers(0, 256, size=(5, 28, 28))
    p = tmp_path / ("x.idx.gz" if gz else "x.idx")
    _write_idx(p, arr, gz)
    assert torch.equal(read_idx(p), torch.from_numpy(arr.astype(np.uint8)))


def test_read_idx_rejects_bad_files(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01\x00\x00\x00\x01\x00")
    with pytest.raises(ValueError, match="magic"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + b"\x00" * 3)
    with pytest.raises(ValueError, match="header says"):
        read_idx(tmp_path / "short")


def _fake_fashion(root: Path, n: int = 12) -> None:
    rng = np.random.default_rng(0)
    for prefix in ("train", "t10k"):
        _write_idx(root / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)), True)
        _write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10, True)


def test_fashion_mnist_from_a_folder_at_any_resolution(tmp_path):
    _fake_fashion(tmp_path)
    ds = build_dataset("fashion-mnist", "val", 42, root=str(tmp_path))
    x, y = ds[3]
    assert x.shape == (1, 42, 42) and y == 3
    assert ds.render(3, 28)[0].shape == (1, 28, 28)
    raw = read_idx(tmp_path / "t10k-images-idx3-ubyte.gz")[3].float() / 255
    # 28 px: no resampling, no aug; the same two fp32 ops on the same bytes, so equal (allclose's rtol for safety)
    assert torch.allclose(ds.render(3, 28)[0], (raw[None] - 0.2860) / 0.3530)


def test_fashion_mnist_split_resized_once_equals_item_by_item(tmp_path, monkeypatch):
    """Without per-item augmentation a split is resized in one call and kept; the items must be the ones the
    per-item path computes (same bilinear/antialias kernel), bit for bit, at sizes below, at and above 28 px."""
    import visionpe.data.datasets.fashion_mnist as fm

    _fake_fashion(tmp_path, n=40)
    fixed = fm.fashion_mnist("train", 20, str(tmp_path), training=True, shift=0, aug={"hflip": 0.0})
    for res in (20, 28, 36):
        cached = [fixed.render(i, res)[0] for i in range(40)]
        assert fixed._cache is not None and fixed._cache[0] == res
        monkeypatch.setattr(fm, "RESIZED_CACHE_BYTES", 0)  # the per-item path
        fixed._cache = None
        for i in (0, 17, 39):
            assert torch.equal(fixed.render(i, res)[0], cached[i]), (res, i)
        assert fixed._cache is None
        monkeypatch.setattr(fm, "RESIZED_CACHE_BYTES", 128 * 2**20)
    cached[5].add_(1.0)  # callers get copies: the kept split is not changed through them
    assert not torch.equal(fixed.render(5, 36)[0], cached[5])
    flipping = fm.fashion_mnist("train", 20, str(tmp_path), training=True, shift=0, aug={"hflip": 0.5})
    flipping.render(0, 20)
    assert flipping._cache is None  # random per-item augmentation: resized one by one


def test_fashion_mnist_missing_directory_names_the_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        build_dataset("fashion-mnist", "train", 28, root=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        build_dataset("fashion-mnist", "train", 28, root=str(tmp_path))


@pytest.mark.skipif(not Path(DEFAULT_ROOT).is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_debian_package():
    train, val = FashionMNIST(DEFAULT_ROOT, "train"), FashionMNIST(DEFAULT_ROOT, "test")
    assert len(train) == 60000 and len(val) == 10000
    assert torch.bincount(val.labels).tolist() == [1000] * 10
    assert get_dataset_info("fashion-mnist").in_chans == 1


# ------------------------------------------------------------------------------------------------------ image folders


def _image_folder(root: Path, split: str = "train", classes=("cat", "dog"), per_class: int = 3) -> None:
    rng = np.random.default_rng(0)
    for c in classes:
        (root / split / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")


def test_image_folder_split_synonyms_and_classes(tmp_path):
    _image_folder(tmp_path, "train")
    _image_folder(tmp_path, "validation")
    ds = build_dataset("imagefolder", "val", 16, root=str(tmp_path))  # finds validation/
    assert ds.split_dir.name == "validation" and ds.classes == ["cat", "dog"] and len(ds) == 6
    x, y = ds.render(4, 24)
    assert x.shape == (3, 24, 24) and y == 1


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_dataset("imagefolder", "train", 16, root=str(tmp_path / "missing"))
    _image_folder(tmp_path, "train")
    with pytest.raises(FileNotFoundError, match="no 'val' folder.*found folders \\['train'\\]"):
        build_dataset("imagefolder", "val", 16, root=str(tmp_path))
    (tmp_path / "val").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no images"):
        build_dataset("imagefolder", "val", 16, root=str(tmp_path))
    Image.new("RGB", (8, 8)).save(tmp_path / "val" / "loose.png")
    with pytest.raises(ValueError, match="outside class folders"):
        build_dataset("imagefolder", "val", 16, root=str(tmp_path))
    with pytest.raises(ValueError, match="need data.root"):
        build_dataset("imagefolder", "train", 16)


def test_corrupt_image_is_replaced_in_training_and_left_out_in_evaluation(tmp_path):
    _image_folder(tmp_path, "train", per_class=2)
    (tmp_path / "train" / "cat" / "1.png").write_bytes(b"not a png at all")
    ds = ImageFolderDataset(tmp_path, "train", 16, training=True)
    x, y = ds[1]  # cat/1.png is broken: the next file (dog/0.png) stands in
    assert x.shape == (3, 16, 16) and y == 1
    skipped = ds.pop_skipped()
    assert len(skipped) == 1 and skipped[0].endswith("1.png") and ds.pop_skipped() == []
    ev = ImageFolderDataset(tmp_path, "train", 16)  # evaluation: no stand-in, the item is marked unreadable
    x, y = ev[1]
    assert x is None and y == 0 and ev.pop_skipped()[0].endswith("1.png")
    batch = collate_to_resolution([KeyedDataset(ev)[(i, 16, None)] for i in range(4)])
    assert batch.targets.tolist() == [0, 1, 1] and batch.inputs.shape[0] == 3 and len(batch.skipped) == 1


# --------------------------------------------------------------------------------------------------- batching, loaders


def test_build_dataset_names_valid_options():
    with pytest.raises(ValueError, match="num_train"):
        build_dataset("synthetic-shapes", "train", 32, options={"num_samples": 10})


def test_resolution_batch_sampler_schedule_and_resume():
    sampler = DistributedSampler(range(40), num_replicas=1, rank=0, shuffle=True, seed=1)
    bs = ResolutionBatchSampler(sampler, 4, [16, 24, 32], seed=1)
    bs.set_epoch(2)
    full = list(bs)
    assert len(full) == 10 and {b[0][1] for b in full} == {16, 24, 32}
    assert all(len({k[1] for k in b}) == 1 for b in full)  # one resolution per batch
    assert full == list(bs)  # same epoch, same batches, seeds and resolutions
    bs.start_at(6)
    assert list(bs) == full[6:] and len(bs) == 4
    bs.start_at(0)
    bs.set_epoch(3)
    assert list(bs) != full


def test_ranks_split_the_single_process_batch():
    one = ResolutionBatchSampler(DistributedSampler(range(32), 1, 0, seed=5), 8, [16, 32], seed=5)
    two = [ResolutionBatchSampler(DistributedSampler(range(32), 2, r, seed=5), 4, [16, 32], seed=5) for r in (0, 1)]
    for s in (one, *two):
        s.set_epoch(1)
    for big, a, b in zip(one, *two):
        assert sorted(big) == sorted(a + b)  # same items, same resolution, same per-item seeds


def test_collate_resizes_to_the_batch_resolution():
    items = [(torch.rand(3, 20, 20), 1, 12, ()), (torch.rand(3, 12, 12), 0, 12, ("x.png",))]
    batch = collate_to_resolution(items)
    assert batch.inputs.shape == (2, 3, 12, 12) and batch.targets.tolist() == [1, 0] and batch.skipped == ("x.png",)
    assert torch.equal(batch.inputs[1], items[1][0])
    clip = resize_to(torch.rand(3, 4, 10, 10), 6)
    assert clip.shape == (3, 4, 6, 6)


def test_multires_loader_renders_natively():
    ds = SyntheticShapes("train", 16, num_samples=24)
    loader = build_train_loader(ds, 4, [16, 32], seed=0)
    loader.batch_sampler.set_epoch(0)
    seen = set()
    for keys, batch in zip(loader.batch_sampler, loader):
        seen.add(batch.resolution)
        assert batch.inputs.shape[-1] == batch.resolution
        assert torch.equal(batch.inputs[0], ds.render(keys[0][0], batch.resolution)[0])
    assert seen == {16, 32}


def test_augmentation_does_not_depend_on_workers(tmp_path):
    _fake_fashion(tmp_path, n=16)
    ds = build_dataset("fashion-mnist", "train", 28, root=str(tmp_path), training=True)
    runs = []
    for workers in (0, 2):
        loader = build_train_loader(ds, 4, [28], seed=7, workers=workers)
        loader.batch_sampler.set_epoch(1)
        runs.append(torch.cat([b.inputs for b in loader]))
    assert torch.equal(runs[0], runs[1])
    loader.batch_sampler.set_epoch(2)
    assert not torch.equal(torch.cat([b.inputs for b in loader]), runs[0])  # a new epoch, new augmentation
    state = torch.get_rng_state()
    KeyedDataset(ds)[(0, 28, 123)]
    assert torch.equal(torch.get_rng_state(), state)  # loading in the main process leaves the global RNG alone


def test_batched_fetch_gives_the_items_one_by_one_fetches_give(tmp_path):
    """The loader fetches a batch through __getitems__ (RNG states saved once per batch); each item must still be a
    function of its own seed alone, and the global RNGs (torch, Python, NumPy) must be left as they were."""
    import random

    _fake_fashion(tmp_path, n=16)
    keyed = KeyedDataset(build_dataset("fashion-mnist", "train", 28, root=str(tmp_path), training=True))
    keys = [(i, 28, 1000 + i) for i in range(8)]
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    batch = keyed.__getitems__(keys)
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])
    one_by_one = [keyed[k] for k in reversed(keys)][::-1]  # another order: the same items
    for a, b in zip(batch, one_by_one):
        assert torch.equal(a[0], b[0]) and a[1:] == b[1:]
    same_image = keyed.__getitems__([(3, 28, seed) for seed in range(6)])  # each item's seed draws its own shift
    assert len({tuple(x.flatten().tolist()) for x, *_ in same_image}) > 1


def test_eval_loader_shards_cover_every_item_once():
    ds = SyntheticShapes("val", 16, num_samples=11)
    seen = []
    for rank in range(3):
        for batch in build_eval_loader(ds, 16, 2, rank=rank, world_size=3):
            seen += batch.targets.tolist()
    assert seen == [ds[i][1] for i in range(11)]


# ------------------------------------------------------------------------------------------- pixels as they look


def _pixels(path: Path) -> np.ndarray:
    from visionpe.data.pixels import to_rgb

    with Image.open(path) as img:
        return np.asarray(to_rgb(img)).astype(int)


def test_high_bit_depth_images_are_scaled_not_clipped(tmp_path):
    Image.fromarray(np.full((4, 4), 30000, np.uint16)).save(tmp_path / "g16.png")  # I;16: 30000/65535 = 45.8% grey
    Image.fromarray(np.full((4, 4), 30000, np.uint16)).save(tmp_path / "g16.tiff")
    Image.fromarray(np.full((4, 4), 0.25, np.float32)).save(tmp_path / "f.tiff")  # float in [0, 1]
    for name, want in (("g16.png", 117), ("g16.tiff", 117), ("f.tiff", 64)):  # round(30000*255/65535), round(63.75)
        assert (_pixels(tmp_path / name) == want).all(), name  # exact: integer rounding of one value
    Image.fromarray(np.full((4, 4), 300.0, np.float32)).save(tmp_path / "odd.tiff")
    with pytest.raises(ValueError, match="float image with values in \\[300.0"):
        _pixels(tmp_path / "odd.tiff")


def test_palette_la_cmyk_and_exif_rotation_load_as_they_look(tmp_path):
    pal = Image.new("P", (4, 4))
    pal.putpalette([200, 10, 10] + [0] * 765)
    pal.save(tmp_path / "p.png")
    Image.fromarray(np.stack([np.full((4, 4), 100, np.uint8), np.full((4, 4), 255, np.uint8)], -1), "LA").save(
        tmp_path / "la.png"
    )
    Image.new("CMYK", (4, 4), (0, 255, 255, 0)).save(tmp_path / "cmyk.tiff")  # lossless: exact red
    assert (_pixels(tmp_path / "p.png") == [200, 10, 10]).all()
    assert (_pixels(tmp_path / "la.png") == 100).all()
    assert (_pixels(tmp_path / "cmyk.tiff") == [255, 0, 0]).all()
    im = Image.new("L", (8, 4), 0)
    im.paste(255, (0, 0, 4, 4))  # left half white as stored; orientation 6: shown rotated 90 degrees clockwise
    exif = im.getexif()
    exif[0x0112] = 6
    im.save(tmp_path / "rot.png", exif=exif)
    a = _pixels(tmp_path / "rot.png")
    assert a.shape == (8, 4, 3) and (a[:4] == 255).all() and (a[4:] == 0).all()  # the top half is white


def test_evaluation_class_missing_from_training_is_an_error_or_dropped_and_counted(tmp_path):
    _image_folder(tmp_path, "train", classes=("cat", "dog"))
    _image_folder(tmp_path, "val", classes=("cat", "emu"))
    cmap = {"cat": 0, "dog": 1}
    with pytest.raises(ValueError, match="class folder.*'emu' \\(3 images\\).*drop_unknown_classes=true"):
        build_dataset("imagefolder", "val", 16, root=str(tmp_path), class_map=cmap)
    with pytest.warns(UserWarning, match="left out 3 image"):
        ds = build_dataset(
            "imagefolder", "val", 16, root=str(tmp_path), class_map=cmap, options={"drop_unknown_classes": True}
        )
    assert len(ds) == 3 and ds.dropped_unknown == 3 and ds.num_classes == 2


def test_benchmark_views_leave_out_and_count_unreadable_evaluation_images(tmp_path):
    from visionpe.bench.protocols import SizedView

    _image_folder(tmp_path, "train", per_class=2)
    (tmp_path / "train" / "cat" / "1.png").write_bytes(b"not a png at all")
    ev = ImageFolderDataset(tmp_path, "train", 16)
    (batch,) = list(SizedView(ev, (16, 24)).loader(batch_size=4))  # a non-square size, as the benchmark evaluates
    assert batch.targets.tolist() == [0, 1, 1] and tuple(batch.inputs.shape) == (3, 3, 16, 24)
    assert len(batch.skipped) == 1 and batch.skipped[0].endswith("1.png")
