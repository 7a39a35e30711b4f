"""Native-aspect batches from an ImageNet-style image folder (data.native on data.name=imagefolder): sizes from the
file headers, crops of the drawn size's aspect, every image's patches at its budget size, evaluation order over
ranks, train.py / eval.py end to end, exact resume after a kill, one-line errors for broken files."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_native_data_train import NATIVE, _lines, check_kill_and_resume
from tiny_runs import tiny_run

from visionpe.data import build_dataset
from visionpe.data.native.folder_items import crop_box
from visionpe.data.native.loader import build_native_eval_loader, build_native_train_loader, native_plan
from visionpe.data.native.resize import budget_size
from visionpe.data.seeding import seeded_rngs
from visionpe.data.share import Share
from visionpe.engine import train
from visionpe.engine.config import NativeConfig

REPO = Path(__file__).resolve().parents[1]
MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)
PATCH = 4


def _sizes(n: int, seed: int) -> list[tuple[int, int]]:
    """(h, w) of aspect ratio 1:3 to 3:1 and 16 to 48 px of side."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a, side = math.exp(rng.uniform(-math.log(3), math.log(3))), rng.uniform(16, 48)
        out.append((max(4, round(side / math.sqrt(a))), max(4, round(side * math.sqrt(a)))))
    return out


def make_folder(root: Path, per_class: int = 12, solid: bool = False, seed: int = 0) -> Path:
    """root/{train,val}/{a,b}/*.png of varied sizes: noise, or (solid) one flat colour per image (its index)."""
    rng = np.random.default_rng(seed + 1)
    for s, split in enumerate(("train", "val")):
        sizes = _sizes(2 * per_class, seed + s)
        for i, (h, w) in enumerate(sizes):
            folder = root / split / "ab"[i // per_class]
            folder.mkdir(parents=True, exist_ok=True)
            if solid:
                pixels = np.broadcast_to(np.array([5 * i, 255 - 5 * i, (37 * i) % 256], np.uint8), (h, w, 3))
            else:
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            Image.fromarray(np.ascontiguousarray(pixels)).save(folder / f"{i:03d}.png")
    return root


def _dataset(root: Path, split: str = "train", training: bool = False, **aug):
    aug = {"hflip": 0.0, "color_jitter": 0.0, **aug}
    return build_dataset("imagefolder", split, 16, root=str(root), training=training, aug=aug, mean=MEAN, std=STD)


def _plan(mode: str = "packed"):
    settings = NativeConfig(mode=mode, seq_lens=[8, 16], row_tokens=48, tokens_per_batch=192)
    return native_plan(settings, PATCH)


def _images(batch):
    """(grid (gh, gw), patches [n, P*P*C]) of each image of a NativeBatch, in output order."""
    inputs, out = batch.inputs, []
    ids = inputs.get("image_ids", torch.where(inputs["patch_valid"], 0, -1))
    for r in range(ids.shape[0]):
        for j in range(int(ids[r].max()) + 1):
            sel = ids[r] == j
            coord = inputs["patch_coord"][r][sel]
            out.append(((int(coord[:, 0].max()) + 1, int(coord[:, 1].max()) + 1), inputs["patches"][r][sel]))
    return out


def test_header_sizes_equal_the_decoded_sizes_and_are_read_once(tmp_path, monkeypatch):
    root = make_folder(tmp_path / "data", per_class=6)
    # a JPEG whose EXIF turns it by 90 degrees: the header's 30 x 12 is 12 x 30 upright
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.zeros((12, 30, 3), np.uint8)).save(root / "train" / "a" / "rotated.jpg", exif=exif)
    Image.fromarray(np.zeros((20, 7), np.uint16)).save(root / "train" / "b" / "grey16.png")  # 16-bit grey
    ds = _dataset(root)
    reads = []
    import visionpe.data.datasets.folders as folders

    monkeypatch.setattr(folders, "header_size", lambda p, real=folders.header_size: reads.append(p) or real(p))
    sizes = [ds.native_size(i) for i in range(len(ds))] + [ds.native_size(i) for i in range(len(ds))]
    decoded = [(img.height, img.width) for img in (ds._open(i)[0] for i in range(len(ds)))]
    assert sizes[: len(ds)] == decoded == sizes[len(ds) :]
    assert len({s for s in decoded}) > 8 and (30, 12) in decoded and (20, 7) in decoded
    assert len(reads) == len(ds)  # the second pass reads no header


def test_crop_box_fits_the_image_with_the_area_and_aspect_asked_for():
    random.seed(0)
    for _ in range(500):
        h, w = random.randint(8, 80), random.randint(8, 80)
        aspect = math.exp(random.uniform(-1, 1))
        top, left, ch, cw = crop_box((h, w), aspect, (0.3, 0.9), (0.8, 1.25))
        assert 0 <= top <= h - ch and 0 <= left <= w - cw and ch >= 1 and cw >= 1
        if (top, left) == ((h - ch) // 2, (w - cw) // 2) and (ch == h or cw == w):
            continue  # the centred fallback (checked below)
        # rounding moves each side by at most half a pixel
        assert 0.3 * h * w * (1 - 0.5 / ch - 0.5 / cw) ** 2 <= ch * cw <= 0.9 * h * w * (1 + 0.5 / ch + 0.5 / cw) ** 2
        slack = (1 + 0.5 / cw) / (1 - 0.5 / ch), (1 - 0.5 / cw) / (1 + 0.5 / ch)
        assert 0.8 * aspect * slack[1] <= cw / ch <= 1.25 * aspect * slack[0]
    # a 3:1 crop of the whole area of a square cannot fit: the widest 3:1 crop, centred
    assert crop_box((30, 30), 3.0, (1.0, 1.0), (1.0, 1.0)) == (10, 0, 10, 30)
    assert crop_box((30, 60), 0.5, (1.0, 1.0), (1.0, 1.0)) == (0, 22, 30, 15)


def test_training_items_are_seeded_flip_exactly_and_take_the_colour_options(tmp_path):
    root = make_folder(tmp_path / "data", per_class=3)
    plain, flipped = _dataset(root, training=True), _dataset(root, training=True, hflip=1.0)
    jitter = _dataset(root, training=True, color_jitter=0.4)
    draws = {}
    for name, ds in (("plain", plain), ("again", plain), ("flipped", flipped), ("jitter", jitter)):
        with seeded_rngs(7):
            draws[name] = ds.render_size(2, (12, 28))[0]
    assert draws["plain"].shape == (3, 12, 28)
    assert torch.equal(draws["plain"], draws["again"])
    assert torch.equal(draws["flipped"], draws["plain"].flip(-1))
    assert float((draws["jitter"] - draws["plain"]).abs().max()) > 0.05
    with seeded_rngs(8):
        assert not torch.equal(plain.render_size(2, (12, 28))[0], draws["plain"])  # another key, another crop


def test_folder_batches_are_the_same_with_loader_workers(tmp_path):
    ds = _dataset(make_folder(tmp_path / "data", per_class=8), training=True, hflip=0.5, color_jitter=0.3)
    a, b = (list(build_native_train_loader(ds, _plan(), 16, seed=1, share=Share(workers=w))) for w in (0, 1))
    assert len(a) == len(b) >= 1
    for x, y in zip(a, b):
        assert all(torch.equal(x.inputs[k], y.inputs[k]) for k in x.inputs) and torch.equal(x.targets, y.targets)


def test_evaluation_items_are_the_whole_image_resized_and_normalised(tmp_path):
    ds = _dataset(make_folder(tmp_path / "data", per_class=4), "val")
    loader = build_native_eval_loader(ds, _plan(), 16, 3, 16)
    images = [im for batch in loader for im in _images(batch)]
    assert len(images) == len(ds)
    for i, (grid, patches) in enumerate(images):
        img = ds._open(i)[0]
        H, W = budget_size((img.height, img.width), PATCH, 16)
        assert grid == (H // PATCH, W // PATCH)
        ref = (np.asarray(img.resize((W, H), Image.Resampling.BICUBIC), np.float32) / 255 - MEAN) / STD
        ref = torch.from_numpy(ref.astype(np.float32)).reshape(H // PATCH, PATCH, W // PATCH, PATCH, 3)
        ref = ref.permute(0, 2, 1, 3, 4).reshape(-1, PATCH * PATCH * 3)  # (ph, pw, c) patches in row-major order
        assert torch.allclose(patches, ref, atol=1e-5)


def test_packed_training_batches_hold_each_image_at_its_budget_size(tmp_path):
    """Each image a flat colour of its own: every patch tells which file it came from, whatever the crop."""
    ds = _dataset(make_folder(tmp_path / "data", per_class=12, solid=True), training=True, hflip=0.5)
    colours = torch.tensor([[5 * i, 255 - 5 * i, (37 * i) % 256] for i in range(24)], dtype=torch.float32) / 255
    colours = (colours - torch.tensor(MEAN)) / torch.tensor(STD)
    plan, seen = _plan(), set()
    loader = build_native_train_loader(ds, plan, 16, seed=3)
    batches = []
    for epoch in range(4):
        loader.batch_sampler.set_epoch(epoch)
        batches += list(loader)
    for batch in batches:
        assert "image_ids" in batch.inputs and batch.images > batch.inputs["patches"].shape[0]  # packed rows
        targets = batch.targets.tolist()
        for (grid, patches), target in zip(_images(batch), targets):
            pixels = patches.reshape(-1, 3)
            i = int((pixels[0] - colours).abs().sum(-1).argmin())
            assert float((pixels - colours[i]).abs().max()) < 0.5 / 255 / min(STD)  # all of one file
            assert target == i // 12  # its class
            h, w = ds.native_size(i)
            assert grid in [tuple(s // PATCH for s in budget_size((h, w), PATCH, b)) for b in plan.budgets]
            # aspect kept: one scale t puts the image's sides within one patch of the grid's (t * h, t * w)
            assert max((grid[0] - 1) / h, (grid[1] - 1) / w) <= min((grid[0] + 1) / h, (grid[1] + 1) / w)
            seen.add(i)
    assert len(seen) >= 20  # most files, at both budgets


def test_evaluation_over_two_ranks_covers_every_image_once_in_order(tmp_path):
    ds = _dataset(make_folder(tmp_path / "data", per_class=5), "val")  # 10 images: 5 per rank
    plan = _plan()
    single = [im for b in build_native_eval_loader(ds, plan, 32, 4, 16) for im in _images(b)]
    ranks = [
        [im for b in build_native_eval_loader(ds, plan, 32, 4, 16, Share(rank=r, world_size=2)) for im in _images(b)]
        for r in range(2)
    ]
    assert [len(r) for r in ranks] == [5, 5]
    assert len(single) == len(ds) == 10
    assert all(a[0] == b[0] and torch.equal(a[1], b[1]) for a, b in zip(ranks[0] + ranks[1], single))


DATA = ["data.name=imagefolder", "data.options={}", *NATIVE]


def _run(tmp_path, *extra):
    root = tmp_path / "data"
    if not root.exists():
        make_folder(root, per_class=12)
    return tiny_run(tmp_path, [*DATA, f"data.root={root}"], "train.log_every=2", *extra)


def test_train_py_and_eval_py_on_a_folder_with_packed_batches(tmp_path):
    run = train(None, _run(tmp_path, "aug.color_jitter=0.3", "train.run_name=packed"))
    rows = _lines(run, "train")
    assert rows and all(0 <= r["padding"] < 0.5 and r["images_per_batch"] > 4 for r in rows)  # > 4 rows: packed
    results = json.loads((run / "results.json").read_text())
    assert {r["resolution"] for r in results} == {16, "16tok", "32tok"} and all(r["images"] == 24 for r in results)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = tmp_path / "eval.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "eval.py"), "--checkpoint", str(run), "--json", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = json.loads(out.read_text())
    assert [(r["resolution"], r["images"]) for r in again] == [(r["resolution"], r["images"]) for r in results]
    assert all(abs(r["loss"] - q["loss"]) < 1e-5 for r, q in zip(again, results))


def test_train_py_under_ddp_on_a_folder_trains_packed_and_counts_each_eval_image_once(tmp_path):
    env = {**os.environ, "VISIONPE_ATTN": "sdpa", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd.append(str(REPO / "train.py"))
    cmd += _run(tmp_path, "train.epochs=1", "data.native.tokens_per_batch=96", "train.run_name=ddp")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _lines(tmp_path / "ddp", "train")
    assert rows and all(r["padding"] < 0.5 and r["images_per_batch"] > 2 for r in rows)  # 2 rows a batch: packed
    evals = _lines(tmp_path / "ddp", "eval")
    assert {r["resolution"] for r in evals} == {16, "16tok", "32tok"} and all(r["images"] == 24 for r in evals)


@pytest.mark.parametrize("mode", ["padded", "buckets", "timm"])
def test_padded_bucket_and_timm_batches_train_on_a_folder(tmp_path, mode):
    extra = {"buckets": ["data.native.tokens_per_batch=16"], "timm": ["data.native.loader=timm"]}.get(mode, [])
    native = "padded" if mode == "timm" else mode  # timm's loader pads (1-2 images a batch for buckets)
    run = train(None, _run(tmp_path, f"data.native.mode={native}", "train.epochs=1", f"train.run_name={mode}", *extra))
    rows = _lines(run, "train")
    assert rows and all(r["images_per_batch"] >= 1 for r in rows)
    if mode == "buckets":
        assert all(r["padding"] == 0 for r in rows)
    tok = [r for r in json.loads((run / "results.json").read_text()) if r["resolution"] in ("16tok", "32tok")]
    assert len(tok) == 2 and all(r["images"] == 24 for r in tok)


def test_folder_training_resumes_bit_identically_after_a_kill(tmp_path):
    # rows of 48 tokens, two a batch: about 3 steps an epoch; killed in the middle of epoch 2
    common = _run(tmp_path, "train.epochs=2", "train.ckpt_every_steps=2", "aug.color_jitter=0.3")
    common.append("data.native.tokens_per_batch=96")
    check_kill_and_resume(tmp_path, common)


def test_timm_loader_crops_each_folder_image_at_its_own_aspect(tmp_path):
    """data.native.loader=timm: timm's NaFlex crop sees each image whole at its own size (the folder's square-route
    items would make every grid square). The whole image (scale 1, ratio 1): the grid keeps the file's aspect."""
    ds = _dataset(make_folder(tmp_path / "data", per_class=12, solid=True), training=True)
    colours = torch.tensor([[5 * i, 255 - 5 * i, (37 * i) % 256] for i in range(24)], dtype=torch.float32) / 255
    colours = (colours - torch.tensor(MEAN)) / torch.tensor(STD)
    plan = native_plan(NativeConfig(mode="padded", loader="timm", seq_lens=[16, 32], tokens_per_batch=8 * 32), PATCH)
    aug = dict(scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0)
    grids = {}
    for batch in build_native_train_loader(ds, plan, 16, seed=0, aug=aug):
        for grid, patches in _images(batch):
            i = int((patches.reshape(-1, 3)[0] - colours).abs().sum(-1).argmin())
            h, w = ds.native_size(i)
            # one scale t puts the image's sides within one patch of the grid's (t * h, t * w)
            assert max((grid[0] - 1) / h, (grid[1] - 1) / w) <= min((grid[0] + 1) / h, (grid[1] + 1) / w), (grid, h, w)
            grids[i] = grid
    assert len(grids) >= 20 and len({g[0] > g[1] for g in grids.values()}) == 2  # tall and wide grids


def test_timm_loader_jitters_folder_pixels_before_the_folders_normalisation(tmp_path):
    """timm's NaFlex route gets a folder's images as decoded PIL images, so colour jitter works on pixels in [0, 1]
    and the folder's mean / std normalise after it. Jitter on already normalised tensors clipped every value to
    [0, 1]: the dark channels' -1.9 became 0. A dataset of normalised tensors refuses colour options instead."""
    ds = _dataset(make_folder(tmp_path / "data", per_class=12, solid=True), training=True)
    plan = native_plan(NativeConfig(mode="padded", loader="timm", seq_lens=[16, 32], tokens_per_batch=8 * 32), PATCH)
    aug = dict(scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0, color_jitter=0.4)
    pixels = torch.cat([p.reshape(-1, 3) for b in build_native_train_loader(ds, plan, 16, 0, aug=aug)
                        for _, p in _images(b)])  # fmt: skip
    lo, hi = (0 - torch.tensor(MEAN)) / torch.tensor(STD), (1 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert (pixels >= lo - 1e-5).all() and (pixels <= hi + 1e-5).all()  # normalised once, after the jitter
    assert pixels[:, 0].min() < -1.0  # the first channel's dark images (5 i / 255 <= 0.45) stay below zero
    shapes = build_dataset("synthetic-shapes", "train", 16, training=True, num_train=8)
    for option in ({"color_jitter": 0.4}, {"auto_augment": "rand-m9-mstd0.5"}):
        with pytest.raises(ValueError, match=f"aug.{next(iter(option))}=.* normalised tensors.*loader=visionpe"):
            build_native_train_loader(shapes, plan, 16, 0, aug=option)


def test_an_unreadable_image_is_a_one_line_error_naming_the_file(tmp_path):
    root = make_folder(tmp_path / "data", per_class=3)
    garbage = root / "train" / "a" / "000.png"
    garbage.write_bytes(b"not an image at all")
    with pytest.raises(ValueError, match="cannot read image .*000.png") as e:
        _dataset(root, training=True).native_size(0)
    assert "\n" not in str(e.value)
    Image.fromarray(np.zeros((9, 21, 3), np.uint8)).save(garbage)  # readable again
    truncated = root / "train" / "b" / "003.png"  # a readable header, pixels cut short
    truncated.write_bytes(truncated.read_bytes()[:80])
    ds = _dataset(root, training=True)
    index = [Path(p).name for p, _ in ds.base.reader.samples].index("003.png")
    assert ds.native_size(index) > (0, 0)
    with pytest.raises(ValueError, match="cannot decode image .*003.png") as e:
        ds.render_size(index, (8, 8))
    assert "\n" not in str(e.value)
    loader = build_native_train_loader(ds, _plan(), 16, seed=0, share=Share(workers=1))
    with pytest.raises(ValueError, match="cannot decode image .*003.png.*in a data loader worker") as e:
        list(loader)  # raised in the worker, re-raised here: still one line
    assert "\n" not in str(e.value)
