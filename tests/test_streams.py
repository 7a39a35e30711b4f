"""Streaming datasets (timm's wds/ and tfds/ readers): training and evaluation end to end on generated WebDataset
shards, how processes and workers split a stream, mid-epoch resume, and bad input."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import IterableImageDataset
from tiny_runs import tiny_run
from torch.utils.data import IterableDataset

import visionpe.data.datasets.timm_readers as timm_readers
from visionpe.attention.backends import attn_backend
from visionpe.data import build_dataset, build_eval_loader, build_train_loader
from visionpe.data.multires import resolution_schedule
from visionpe.data.streams import StreamBatches
from visionpe.engine import evaluate_checkpoint, train
from visionpe.engine import trainer as engine
from visionpe.engine.trainer import StreamResumeWarning

needs_wds = pytest.mark.skipif(
    importlib.util.find_spec("webdataset") is None,
    reason="webdataset is not installed (pip install visionpe[streaming])",
)
REPO = Path(__file__).resolve().parents[1]
NUM_TRAIN, NUM_VAL, CLASSES = 20, 7, 3


def _png(ident: int) -> bytes:
    """A 12 x 16 image whose top-left red value is its identity (the rest random): readable after the stream."""
    pixels = np.random.default_rng(ident).integers(0, 256, (12, 16, 3), dtype=np.uint8)
    pixels[0, 0, 0] = ident
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def _shard(path: Path, idents: range) -> None:
    with tarfile.open(path, "w") as tar:
        for i in idents:
            for ext, data in (("png", _png(i)), ("cls", str(i % CLASSES).encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Two training shards of 10 images (sizes in _info.json) and one validation shard of 7 (no size given)."""
    root = tmp_path_factory.mktemp("wds")
    _shard(root / "train-0.tar", range(0, 10))
    _shard(root / "train-1.tar", range(10, 20))
    _shard(root / "val-0.tar", range(100, 100 + NUM_VAL))
    split = {"name": "train", "num_samples": NUM_TRAIN, "filenames": ["train-0.tar", "train-1.tar"]}
    info = {"name": "toy", "splits": {"train": {**split, "shard_lengths": [10, 10]}}}
    (root / "_info.json").write_text(json.dumps(info))
    return root


def _ident(img: Image.Image) -> int:
    return img.getpixel((0, 0))[0]


def _overrides(root: Path, out: Path, *extra: str) -> list[str]:
    data = [
        "data.name=wds/toy",
        f"data.root={root}",
        "data.val_split=val-0.tar",
        f"data.options.num_classes={CLASSES}",
        "data.batch_size=4",
    ]
    return tiny_run(out, data, "train.run_name=run", *extra)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------------ end to end


@needs_wds
def test_wds_trains_and_evaluates_end_to_end(shards, tmp_path):
    with attn_backend("sdpa"):
        run = train(None, _overrides(shards, tmp_path, "data.train_resolutions=16,24", "eval.resolutions=16,20"))
    pointer = json.loads((run / "checkpoint.json").read_text())
    assert pointer["finished"] and pointer["global_step"] == 2 * NUM_TRAIN // 4  # epoch length from _info.json
    rows = _metrics(run)
    assert {r["resolution"] for r in rows if r["kind"] == "train"} <= {16, 24}
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(evals) == 2 * 2 and all(r["images"] == NUM_VAL for r in evals)  # the partial last batch counts
    final = {r["resolution"]: r for r in json.loads((run / "results.json").read_text())}
    again = evaluate_checkpoint(run, [16, 20], overrides=["data.eval_batch_size=3"])
    for r in again:  # other batches, same images and weights: approx's rel 1e-6 (~8 fp32 eps) covers the loss's
        # summation order over 7 images; top-1 is a count of 7 and must match exactly
        assert r["images"] == NUM_VAL and r["top1"] == final[r["resolution"]]["top1"]
        assert r["loss"] == pytest.approx(final[r["resolution"]]["loss"], rel=1e-6)


@needs_wds
def test_epoch_length_must_be_known_for_training(shards, tmp_path):
    with pytest.raises(ValueError, match=r"set data.options.train_num_samples=") as e:
        build_dataset("wds/toy", "train-{0..1}.tar", 16, root=str(shards), options={"num_classes": 3}, training=True)
    assert "\n" not in str(e.value)
    ds = build_dataset(
        "wds/toy",
        "train-{0..1}.tar",
        16,
        root=str(shards),
        options={"num_classes": 3, "train_num_samples": 12},
        training=True,
    )
    assert len(ds) == 12  # what the option says (the shards hold 20): timm's epoch is that many images


# ------------------------------------------------------------------------------- splitting over ranks and workers


def _stream(root: Path, split: str, training: bool, batch: int = 4, **options):
    return build_dataset(
        "wds/toy",
        split,
        16,
        root=str(root),
        options={"num_classes": CLASSES, **options},
        training=training,
        stream_seed=0,
        stream_batch_size=batch,
    )


@needs_wds
def test_training_ranks_read_their_own_shards_in_whole_batches(shards):
    seen = []
    for rank in (0, 1):
        ds = _stream(shards, "train", True)
        ds.configure_stream(training=True, rank=rank, world_size=2, workers=0)
        ds.set_epoch(0)
        idents = [_ident(img) for img, _ in ds]
        # timm's reader: ceil(20 images / 2 ranks) = 10, rounded up to whole batches of 4 = 12 per rank per epoch
        assert len(ds) == len(idents) == 12
        seen.append(set(idents))
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(NUM_TRAIN))  # one shard each, then repeats


@needs_wds
@pytest.mark.parametrize("workers", [0, 2])
def test_evaluation_reads_every_image_once_over_ranks_and_workers(shards, workers):
    idents, counts = [], []
    for rank in (0, 1):
        ds = _stream(shards, "val-0.tar", False)
        ds.configure_stream(training=False, rank=rank, world_size=2, workers=workers)
        if workers == 0:
            idents.append([_ident(img) for img, _ in ds])
        sizes = [len(b.targets) for b in build_eval_loader(ds, 16, 3, workers=workers, rank=rank, world_size=2)]
        assert all(n == 3 for n in sizes[:-1]) and 0 < sizes[-1] <= 3  # full batches, then the rest
        counts.append(sum(sizes))
    assert sum(counts) == NUM_VAL  # exact: no padding, no repeats
    if workers == 0:
        assert not set(idents[0]) & set(idents[1]) and sorted(idents[0] + idents[1]) == list(range(100, 100 + NUM_VAL))


@needs_wds
def test_training_loader_batches_follow_the_resolution_schedule(shards):
    ds = _stream(shards, "train", True)
    loader = build_train_loader(ds, 4, [16, 24], seed=3, workers=2)
    batches = loader.dataset
    batches.set_epoch(1)
    got = [b.inputs.shape[-1] for b in loader]
    assert got == resolution_schedule([16, 24], 3, 1, batches.num_batches())  # worker w's k-th batch is k * 2 + w
    assert batches.num_batches() == 6  # 2 workers x ceil(ceil(20 / 2) / 4) batches


# ---------------------------------------------------------------------------------------------------------- resume


class _Numbers(IterableDataset):
    """A stream of the numbers 0..n-1 (as [1, 2, 2] images), the same on every pass."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            yield torch.full((1, 2, 2), float(i)), i


def test_start_at_restarts_the_stream_for_the_epochs_remaining_batches():
    batches = StreamBatches(_Numbers(10), 3, [8, 12, 16], seed=5)  # 3 batches of 3 per epoch; the 10th is dropped
    batches.set_epoch(2)
    schedule = resolution_schedule([8, 12, 16], 5, 2, 3)
    full = list(batches)
    assert [b.targets.tolist() for b in full] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert [b.resolution for b in full] == schedule
    batches.start_at(1)
    resumed = list(batches)
    assert len(batches) == len(resumed) == 2
    assert [b.targets.tolist() for b in resumed] == [[0, 1, 2], [3, 4, 5]]  # read again from the stream's start
    assert [b.resolution for b in resumed] == schedule[1:]  # positions 1 and 2 of the epoch


class _Stop(Exception):
    pass


@needs_wds
def test_resume_mid_epoch_warns_and_keeps_the_step_count(shards, tmp_path, monkeypatch):
    overrides = _overrides(shards, tmp_path, "train.ckpt_every_steps=2", "eval.resolutions=16")
    step = engine.Trainer.step

    def stop_at_step_8(self, net, batch):
        if self.global_step == 7:  # epoch 2 (5 steps each), after the checkpoint of step 6
            raise _Stop
        return step(self, net, batch)

    monkeypatch.setattr(engine.Trainer, "step", stop_at_step_8)
    with attn_backend("sdpa"), pytest.raises(_Stop):
        train(None, overrides)
    monkeypatch.setattr(engine.Trainer, "step", step)
    assert json.loads((tmp_path / "run" / "checkpoint.json").read_text())["global_step"] == 6
    with attn_backend("sdpa"), pytest.warns(StreamResumeWarning, match="remaining 4 of 5 steps"):
        run = train(None, overrides, resume=True)
    pointer = json.loads((run / "checkpoint.json").read_text())
    assert pointer["finished"] and pointer["global_step"] == 10  # the epoch kept its 5 steps
    steps = [r["global_step"] for r in _metrics(run) if r["kind"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == 10
    assert [r["images"] for r in _metrics(run) if r["kind"] == "eval"] == [NUM_VAL, NUM_VAL]


# ------------------------------------------------------------------------------------------------------- bad input


@needs_wds
def test_bad_wds_input_is_one_clear_line(shards, tmp_path):
    cases = [
        (tmp_path / "nowhere", "train", {}, r"data.root=.*nowhere.* is not a directory"),
        (shards, "train-{0..3}.tar|40", {}, r"2 of 4 shard file\(s\) not found, e.g. .*train-2.tar"),
        (shards, "test", {}, r"cannot open 'wds/toy' split 'test'.*data.train_split"),
        (None, "train", {}, r"needs data.root="),
        (shards, "train", {"train_num_sample": 5}, r"data.options for 'wds/toy'.*'train_num_sample'"),
    ]
    for root, split, options, pattern in cases:
        with pytest.raises(ValueError, match=pattern) as e:
            root = str(root) if root else None
            build_dataset("wds/toy", split, 16, root=root, options={"num_classes": 3, **options}, training=True)
        assert "\n" not in str(e.value)


@needs_wds
def test_empty_or_unreadable_shards_are_one_clear_line(shards, tmp_path):
    # timm's wds reader skips an unreadable shard with a logged message and reads nothing from an empty one; a split
    # of only such shards must stop the run with one line, not train on nothing or report 0 images as results
    bad = tmp_path / "bad"
    bad.mkdir()
    _shard(bad / "empty-0.tar", range(0))
    (bad / "corrupt-0.tar").write_bytes(np.random.default_rng(0).bytes(5000))
    for split in ("empty-0.tar|8", "{empty,corrupt}-0.tar|8"):
        stream = build_dataset("wds/toy", split, 16, root=str(bad), options={"num_classes": 3}, training=True)
        with pytest.raises(ValueError, match="gave no images in epoch 1: its shards are empty or unreadable") as e:
            next(iter(build_train_loader(stream, 4, [16])))
        assert "\n" not in str(e.value)
    mixed = tmp_path / "mixed"  # good training shards, a validation split of bad ones
    shutil.copytree(shards, mixed)
    for f in bad.iterdir():
        shutil.copy(f, mixed / f.name)
    with (
        pytest.raises(ValueError, match=r"\({empty,corrupt}-0.tar\) holds no readable image") as e,
        attn_backend("sdpa"),
    ):
        train(None, _overrides(mixed, tmp_path, "train.epochs=1", "data.val_split={empty,corrupt}-0.tar"))
    assert "\n" not in str(e.value)


@needs_wds
def test_a_stream_without_classes_needs_num_classes(shards):
    with pytest.raises(ValueError, match="data.options.num_classes"):
        build_dataset("wds/toy", "val-0.tar", 16, root=str(shards))


def test_missing_webdataset_names_the_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "webdataset" else real(name, *a))
    with pytest.raises(ImportError, match="pip install webdataset"):
        build_dataset("wds/toy", "train", 16, root=".")


def test_a_plain_stream_is_refused_under_several_processes():
    with pytest.raises(ValueError, match="no configure_stream"):
        build_train_loader(_Numbers(8), 2, [8], rank=0, world_size=2)


# ---------------------------------------------------------------------------------------------- tfds/ (routing only)


class _FakeTfdsReader:
    """What timm's tfds reader offers the stream path (tensorflow-datasets is not installed here): class names, a
    size it knows, the process split it reads from attributes, per-worker whole batches in training."""

    def __init__(self, batch_size: int, is_training: bool, **kwargs):
        self.class_to_idx = {"a": 0, "b": 1}
        self.batch_size, self.is_training, self.num_samples = batch_size, is_training, 9
        self.dist_rank, self.dist_num_replicas, self.num_workers, self.epoch = 0, 1, 1, None

    def set_loader_cfg(self, num_workers=None):
        self.num_workers = max(1, num_workers or 0)

    def set_epoch(self, count):
        self.epoch = count

    def _share(self) -> int:
        share = -(-self.num_samples // (self.dist_num_replicas * self.num_workers))
        return -(-share // self.batch_size) * self.batch_size if self.is_training else share

    def __len__(self) -> int:
        return self._share() * self.num_workers

    def __iter__(self):
        idents = range(self.num_samples)[self.dist_rank :: self.dist_num_replicas]
        for k in range(self._share() if self.is_training else len(idents)):
            i = idents[k % len(idents)]
            yield Image.fromarray(np.full((6, 6, 3), i, dtype=np.uint8)), i % 2


def test_tfds_names_take_the_stream_path(monkeypatch):
    calls = []

    def fake_create_dataset(name, **kwargs):
        calls.append((name, kwargs))
        reader = _FakeTfdsReader(kwargs.get("batch_size", 1), kwargs["is_training"])
        return IterableImageDataset(None, reader=reader)

    monkeypatch.setattr(timm_readers, "create_dataset", fake_create_dataset)
    opts = {"train_num_samples": 9}
    train_set = build_dataset("tfds/toy", "train", 8, options=opts, training=True, stream_seed=7, stream_batch_size=2)
    name, kwargs = calls[0]
    assert name == "tfds/toy" and kwargs["split"] == "train" and kwargs["is_training"] is True
    assert kwargs["num_samples"] == 9 and kwargs["seed"] == 7 and kwargs["batch_size"] == 2
    loader = build_train_loader(train_set, 2, [8], rank=1, world_size=2)
    assert train_set.base.reader.dist_rank == 1 and train_set.base.reader.dist_num_replicas == 2
    loader.dataset.set_epoch(3)
    assert train_set.base.reader.epoch == 3
    batches = list(loader)  # rank 1 of 2: ceil(9 / 2) = 5 images, rounded up to whole batches of 2 = 6: 3 batches
    assert len(batches) == 3 and all(b.inputs.shape == (2, 3, 8, 8) for b in batches)
    val = build_dataset("tfds/toy", "validation", 8, options=opts, training=False)
    assert "num_samples" not in calls[-1][1] and calls[-1][1]["is_training"] is False  # read to its end
    counts = [sum(len(b.targets) for b in build_eval_loader(val, 8, 4, rank=r, world_size=2)) for r in (0, 1)]
    assert val.base.reader.dist_num_replicas == 1 and counts == [5, 4]  # the whole split read once, split by us


# ------------------------------------------------------------------------------------------------------------- DDP


@needs_wds
@pytest.mark.slow  # two processes (~20 s on 2 busy cores); the split itself is covered by the in-process tests above
def test_wds_under_torchrun_two_processes(shards, tmp_path):
    env = {**os.environ, "VISIONPE_ATTN": "sdpa", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(REPO / "train.py"), *_overrides(shards, tmp_path, "eval.resolutions=16")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    assert json.loads((run / "checkpoint.json").read_text())["global_step"] == 2 * 3  # 12 images per rank: 3 steps
    assert [r["images"] for r in _metrics(run) if r["kind"] == "eval"] == [NUM_VAL, NUM_VAL]
