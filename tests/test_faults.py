"""Fault injection: kills during checkpoint writes, a full disk, bad images, bad data files, bad configs, a hung
DDP rank. Each fault must give either the exact result of an uninterrupted run or one clear line, nothing lost."""

from __future__ import annotations

import errno
import gzip
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_runs import group_of_one, tiny_run

from visionpe.attention.backends import attn_backend
from visionpe.engine import CheckpointError, ConfigError, load_config, train
from visionpe.engine import checkpoint as ckpt
from visionpe.engine.checkpoint import KILL_AT_ENV, find_checkpoint, load_weights, write_checkpoint
from visionpe.engine.cli import train_main
from visionpe.engine.distributed import DistContext
from visionpe.engine.evaluate import write_json
from visionpe.engine.trainer import CorruptCheckpointWarning, Trainer

REPO = Path(__file__).resolve().parents[1]


def tiny(out: Path, *extra: str) -> list[str]:
    """A one-block 32-wide ViT on 64 synthetic 16 px images: 4 steps an epoch, a few seconds a run."""
    data = ["data.options.num_train=64", "data.options.num_val=16", "data.batch_size=16"]
    return tiny_run(out, data, "eval.resolutions=16", *extra)


def run(overrides: list[str], **kwargs) -> Path:
    with attn_backend("sdpa"):
        return train(None, overrides, **kwargs)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_weights(find_checkpoint(run_dir).weights)[0]


def _one_line_error(capsys, argv: list[str]) -> str:
    assert train_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[1].startswith("(set VISIONPE_DEBUG=1"), err  # the message, then the hint
    return err[0]


# --------------------------------------------------------------------------------- kill -9 during checkpoint writes

PHASES = ("weights-tmp", "weights", "state-tmp", "state", "pointer-tmp", "pointer", "pruned")


def _train_then_die(overrides: list[str], phase: str) -> None:
    os.environ[KILL_AT_ENV] = f"{phase},3"  # the 3rd write (step 6 of 8) prunes the 1st: every phase is reached
    ckpt._writes = 0
    run(overrides)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[str], dict]:
    out = tmp_path_factory.mktemp("ref")
    common = tiny(out, "train.ckpt_every_steps=2", "model.kwargs.drop_path_rate=0.1", "aug.mixup=0.4")
    return common, weights(run([*common, "train.run_name=reference"]))


@pytest.mark.parametrize("phase", PHASES)
def test_kill_at_each_checkpoint_write_phase_then_resume_is_bit_identical(tmp_path, reference, phase):
    common, want = reference
    args = [*common, f"train.output_dir={tmp_path}", "train.run_name=killed"]
    # spawn, not fork: a worker that ran autograd (or FSDP) before cannot fork safely
    child = multiprocessing.get_context("spawn").Process(target=_train_then_die, args=(args, phase))
    child.start()
    child.join(120)
    assert child.exitcode == -9  # SIGKILL: no cleanup ran
    leftovers = list((tmp_path / "killed").rglob(".*.tmp-*"))
    assert bool(leftovers) == phase.endswith("-tmp")  # a kill between write and rename leaves the temporary file
    run(args, resume=True)
    assert not list((tmp_path / "killed").rglob(".*.tmp-*"))  # the resume removed them
    got = weights(tmp_path / "killed")
    assert all(torch.equal(got[k], v) for k, v in want.items())  # bit-identical: same data, RNG and arithmetic


def test_resuming_a_ddp_run_with_another_number_of_processes_is_refused(reference):
    common, _ = reference  # as fsdp: another number would change the global batch and rebuild the schedule
    cfg = load_config(None, [*common, "train.run_name=reference"])
    with group_of_one(), pytest.raises(CheckpointError, match="by 1 processes, this run has 2: resume with one"):
        Trainer(cfg, DistContext(0, 2, 0, torch.device("cpu")), resume=True)  # refused before any collective


# ---------------------------------------------------------------------------------------------------- full disk


def test_disk_full_while_checkpointing_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, capsys, monkeypatch):
    real, calls = ckpt.save_file, []

    def fills_up(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) > 1:  # the first checkpoint fits, the second does not
            Path(path).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(ckpt, "save_file", fills_up)
    line = _one_line_error(capsys, tiny(tmp_path, "train.run_name=full"))
    assert line.startswith("error: disk full while writing checkpoint") and "e0002" in line
    assert "previous checkpoint" in line and "e0001-b000000.safetensors is intact" in line
    ref = find_checkpoint(tmp_path / "full")
    assert ref.info["epoch"] == 1 and not list((tmp_path / "full").rglob(".*.tmp-*"))


def test_disk_full_on_a_real_small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        write_checkpoint(mnt, "a", {"w": torch.ones(8)}, {"model": "m"}, {"step": 1}, info={"global_step": 1})
        with pytest.raises(ckpt.DiskFullError, match="disk full.*a.safetensors is intact"):
            write_checkpoint(mnt, "b", {"w": torch.zeros(512, 1024)}, {"model": "m"}, {"step": 2})  # 2 MiB > 1 MiB
        ref = find_checkpoint(mnt)
        assert ref.info["global_step"] == 1 and torch.equal(load_weights(ref.weights)[0]["w"], torch.ones(8))
        assert not list(mnt.rglob(".*.tmp-*"))
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


# ------------------------------------------------------------------------------------------------------ bad images


def _folders(root: Path, train=("a", "b"), val=("a", "b"), n: int = 4) -> Path:
    rng = np.random.default_rng(0)
    for split, classes in (("train", train), ("val", val)):
        for c in classes:
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (18, 18, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    return root


def _folder_args(tmp_path: Path, root: Path, name: str) -> list[str]:
    args = ["data.name=imagefolder", "data.options={}", f"data.root={root}", "data.batch_size=4"]
    return tiny(tmp_path, *args, f"train.run_name={name}")


def test_validation_class_missing_from_training_is_one_line_or_dropped(tmp_path, capsys):
    root = _folders(tmp_path / "d", val=("a", "c"))
    line = _one_line_error(capsys, _folder_args(tmp_path, root, "x"))
    assert "class folder(s) the training split does not have: 'c' (4 images)" in line
    with pytest.warns(UserWarning, match="left out 4 image"):
        out = run([*_folder_args(tmp_path, root, "y"), "data.options.drop_unknown_classes=true"])
    assert json.loads((out / "results.json").read_text())[0]["images"] == 4


def test_every_validation_file_unreadable_is_one_line(tmp_path, capsys):
    root = _folders(tmp_path / "d")
    for p in (root / "val").rglob("*.png"):
        p.write_bytes(b"not an image")
    assert "every file of" in _one_line_error(capsys, _folder_args(tmp_path, root, "x"))
    for p in (root / "train").rglob("*.png"):
        p.write_bytes(b"")
    assert "unreadable images in a row" in _one_line_error(capsys, _folder_args(tmp_path, root, "y"))


def test_sixteen_bit_images_train_as_they_look(tmp_path):
    root = _folders(tmp_path / "d", n=2)
    for p in root.rglob("*.png"):  # 16-bit grey: PIL's convert("RGB") alone would make these all white
        Image.fromarray(np.full((18, 18), int(p.stem) * 20000 + 10000, np.uint16)).save(p)
    from visionpe.data import build_dataset

    ds = build_dataset("imagefolder", "val", 16, root=str(root), options={"mean": [0.0] * 3, "std": [1.0] * 3})
    for i, value in enumerate((10000, 30000)):  # a constant image stays constant through resize and crop
        assert float(ds[i][0].mean()) == pytest.approx(value / 65535, abs=0.5 / 255 + 1e-6)  # 8-bit rounding


# ------------------------------------------------------------------------------------------------ bad data files


def _idx(path: Path, arr) -> None:
    arr = np.asarray(arr, np.uint8)
    data = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape) + arr.tobytes()
    path.write_bytes(gzip.compress(data))


def _fashion(root: Path, train_labels) -> Path:
    root.mkdir()
    rng = np.random.default_rng(0)
    for stem, labels in (("train", train_labels), ("t10k", rng.integers(0, 10, 16))):
        _idx(root / f"{stem}-images-idx3-ubyte.gz", rng.integers(0, 256, (len(labels), 28, 28)))
        _idx(root / f"{stem}-labels-idx1-ubyte.gz", labels)
    return root


def test_truncated_gz_and_out_of_range_labels_are_one_line(tmp_path, capsys):
    args = ["data.name=fashion-mnist", "data.options={}", "train.run_name=f"]
    root = _fashion(tmp_path / "cut", np.arange(64) % 10)
    gz = root / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    line = _one_line_error(capsys, tiny(tmp_path, *args, f"data.root={root}"))
    assert "train-images-idx3-ubyte.gz is truncated or not gzip data" in line
    labels = np.arange(64) % 10
    labels[5] = 12
    root = _fashion(tmp_path / "labels", labels)
    line = _one_line_error(capsys, tiny(tmp_path, *args, f"data.root={root}"))
    assert "1 value(s) outside the 10 classes 0..9 (e.g. 12 at item 5)" in line


# ---------------------------------------------------------------------------------------------- resume and configs


def test_resume_refuses_changes_to_what_was_trained_unless_accepted(tmp_path, capsys):
    args = tiny(tmp_path, "train.run_name=r", "train.epochs=1")
    run(args)
    line = _one_line_error(capsys, [*args, "optim.lr=0.1", "optim.opt=sgd", "--resume"])
    assert "optim.lr 0.001 -> 0.1, optim.opt 'adamw' -> 'sgd'" in line and "--accept-changes" in line
    # keys that cannot change the weights are free; `--resume key=value` is an override, not a run directory
    assert train_main(["--resume", *args, "train.threads=2", "eval.resolutions=16,24", "train.log_every=1"]) == 0
    assert train_main([*args, "train.epochs=2", "optim.lr=0.1", "--resume", "--accept-changes"]) == 0
    (row,) = [json.loads(ln) for ln in (tmp_path / "r" / "config_changes.jsonl").read_text().splitlines()]
    assert row["global_step"] == 4 and row["changes"] == {"optim.lr": [0.001, 0.1], "train.epochs": [1, 2]}
    saved = (tmp_path / "r" / "config.yaml").read_text()
    assert "lr: 0.001" in saved and "epochs: 1" in saved  # config.yaml keeps the original
    assert find_checkpoint(tmp_path / "r").info["global_step"] == 8  # the second epoch ran with the change
    # repeating the original command continues the run as changed (it is finished: reported again, nothing trained)
    run(args, resume=True)
    assert find_checkpoint(tmp_path / "r").info["global_step"] == 8
    with pytest.raises(ConfigError, match="optim.lr 0.1 -> 0.2"):  # a new change is still refused
        run([*args, "optim.lr=0.2"], resume=True)


def test_resume_falls_back_from_a_corrupt_newest_checkpoint(tmp_path):
    args = tiny(tmp_path, "train.run_name=c", "train.ckpt_every_steps=2")
    out = run(args)
    want = {k: v.clone() for k, v in weights(out).items()}  # a copy: safetensors may map the file we damage
    history = json.loads((out / "checkpoint.json").read_text())["history"]
    newest = out / "checkpoints" / f"{history[-1]}.safetensors"
    newest.write_bytes(newest.read_bytes()[:64])
    with pytest.warns(CorruptCheckpointWarning, match=f"resuming from the newest valid one, {history[-2]}"):
        run(args, resume=True)  # the finished run's last 2 steps are trained again, exactly
    assert all(torch.equal(weights(out)[k], v) for k, v in want.items())
    (out / "checkpoint.json").write_text("{ half a pointer")
    with pytest.warns(UserWarning, match="checkpoint.json is corrupt.*looking for checkpoints in"):
        run(args, resume=True)  # the files on disk, newest first: the finished run, reported again
    for p in (out / "checkpoints").iterdir():
        p.write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="no readable checkpoint"):
        run(args, resume=True)


def test_a_resumed_run_whose_earlier_cost_was_not_kept_records_its_cost_as_unknown(tmp_path):
    args = tiny(tmp_path, "train.run_name=c", "train.ckpt_every_steps=2")
    out = run(args)
    assert find_checkpoint(out).info["cpu_seconds"] > 0
    history = json.loads((out / "checkpoint.json").read_text())["history"]
    older = out / "checkpoints" / f"{history[-2]}.state.pt"  # as a checkpoint written before the cost was kept
    state = torch.load(older, weights_only=True)
    torch.save({k: v for k, v in state.items() if k != "spent"}, older)
    (out / "checkpoints" / f"{history[-1]}.safetensors").write_bytes(b"junk")  # so the run resumes from the older
    with pytest.warns(CorruptCheckpointWarning):
        run(args, resume=True)
    info = find_checkpoint(out).info
    assert info["finished"] and info["seconds"] is None and info["cpu_seconds"] is None  # not this attempt's part


def test_nan_metrics_are_valid_json_with_a_flag(tmp_path):
    write_json([dict(resolution=16, top1=float("nan"), top5=1.0, loss=float("inf"), images=3)], tmp_path / "r.json")
    (row,) = json.loads((tmp_path / "r.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert row["top1"] is None and row["loss"] is None and row["nonfinite"] == {"top1": "nan", "loss": "inf"}


# ------------------------------------------------------------------------------------------------------------- DDP

HANG = textwrap.dedent(
    """
    import os, sys, time
    from visionpe import engine
    from visionpe.engine.cli import train_main

    step = engine.Trainer.step

    def step_or_hang(self, net, batch):
        if self.ctx.rank == 1 and self.global_step == 1:
            time.sleep(60)  # stops responding; rank 0 waits in the gradient all-reduce
        return step(self, net, batch)

    engine.Trainer.step = step_or_hang
    sys.exit(train_main(sys.argv[1:]))
    """
)


def test_a_ddp_rank_that_stops_responding_is_a_timeout_with_a_message(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    cmd += tiny(tmp_path, "train.dist_timeout=15", "data.batch_size=8", "train.run_name=ddp")
    env = {**os.environ, "VISIONPE_ATTN": "sdpa", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "error: rank 0: another process did not respond within train.dist_timeout=15.0 s" in proc.stderr
