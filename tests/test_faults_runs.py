"""Faults of whole runs: a second writer, signals (SIGTERM, Ctrl-C), resumes whose data or config moved on, a cut-off
metrics line, run directories that cannot be written. Each gives the exact result of an uninterrupted run or one
clear line."""

from __future__ import annotations

import json
import multiprocessing
import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_faults import _one_line_error, run, tiny, weights

from visionpe.engine import CheckpointError, find_checkpoint
from visionpe.engine.interrupt import TrainingInterrupted
from visionpe.engine.runlock import RunLock, RunLockedError

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------- run directory lock


def _hold_lock(run_dir: str, ready) -> None:
    RunLock(run_dir).acquire()
    ready.set()
    signal.pause()


def test_a_second_run_into_a_locked_directory_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path):
    args = tiny(tmp_path, "train.run_name=r", "train.epochs=1")
    (tmp_path / "r").mkdir()
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(tmp_path / "r"), ready))
    holder.start()
    assert ready.wait(30)
    with pytest.raises(RunLockedError, match=f"process {holder.pid} on host {socket.gethostname()}"):
        run(args)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()  # refused before writing anything
    os.kill(holder.pid, signal.SIGKILL)  # killed: the lock file stays, its flock is gone
    holder.join(30)
    assert (tmp_path / "r" / ".lock").read_text().strip()
    assert find_checkpoint(run(args)).info["finished"]  # the stale lock is taken over


# --------------------------------------------------------------------------------------------------------- signals

SIGNAL_AT = textwrap.dedent(
    """
    import os, signal, sys
    from visionpe import engine
    from visionpe.engine.cli import train_main

    step, (signum, at) = engine.Trainer.step, map(int, os.environ["SIGNAL_AT"].split(","))

    def step_then_signal(self, net, batch):
        out = step(self, net, batch)
        if self.global_step + 1 == at and self.ctx.rank == int(os.environ.get("SIGNAL_RANK", "0")):
            os.kill(os.getpid(), signum)  # arrives in the middle of step `at`
        return out

    engine.Trainer.step = step_then_signal
    sys.exit(train_main(sys.argv[1:]))
    """
)


TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _train_process(tmp_path: Path, args: list[str], signal_at: str | None, ranks: int = 1, cmd: list | None = None):
    """SIGNAL_AT's script run alone or by torchrun on `ranks` processes (rank 1 gets the signal), or `cmd`."""
    script = tmp_path / "signal_at.py"
    script.write_text(SIGNAL_AT)
    env = {**os.environ, "VISIONPE_ATTN": "sdpa", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env["SIGNAL_AT"] = signal_at or "0,0"
    if cmd is None:
        cmd = [sys.executable, str(script)]
        if ranks > 1:
            cmd = [*TORCHRUN, "--standalone", "--nproc_per_node", str(ranks), str(script)]
    if ranks > 1:
        env["SIGNAL_RANK"] = "1"
    return subprocess.run(cmd + args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, list[str], dict]:
    out = tmp_path_factory.mktemp("sig")
    common = tiny(out, "model.kwargs.drop_path_rate=0.1", "aug.mixup=0.4", "train.log_every=3")  # windows 3 + 1
    return out, common, weights(run([*common, "train.run_name=reference"]))


def _train_rows(run_dir: Path) -> list[tuple[int, int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["epoch"], r["global_step"], r["loss"]) for r in rows if r["kind"] == "train"]


def _epoch_lines(rows: list[tuple[int, int, float]]) -> dict[int, str]:
    """The epoch log line's loss from the metrics windows: their means weighted by their steps."""
    sums, steps, last = {}, {}, 0
    for epoch, step, loss in rows:
        sums[epoch], steps[epoch], last = (
            sums.get(epoch, 0.0) + loss * (step - last),
            steps.get(epoch, 0) + step - last,
            step,
        )
    return {e: f"train loss {sums[e] / steps[e]:.4f}" for e in sums}


@pytest.mark.parametrize(("signum", "at"), [(signal.SIGTERM, 3), (signal.SIGINT, 6), (signal.SIGTERM, 4)])
def test_a_signal_checkpoints_at_the_step_says_how_to_resume_and_the_resume_is_bit_identical(
    tmp_path, uninterrupted, signum, at
):
    out, common, want = uninterrupted
    args = [*common, f"train.output_dir={tmp_path}", "train.run_name=sig"]
    proc = _train_process(tmp_path, args, f"{int(signum)},{at}")
    assert proc.returncode == 128 + signum, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("stopped by")]
    assert f"stopped by {signum.name} at epoch {(at - 1) // 4 + 1}, step {at}" in line
    assert line.endswith(f"continue with: visionpe-train --resume {tmp_path / 'sig'}")
    assert find_checkpoint(tmp_path / "sig").info["global_step"] == at  # at the step the signal arrived in
    resumed = _train_process(tmp_path, ["--resume", str(tmp_path / "sig")], None)
    assert resumed.returncode == 0
    got = weights(tmp_path / "sig")
    assert all(torch.equal(got[k], v) for k, v in want.items())  # the data, RNG and arithmetic of one run
    # the loss windows and the epoch's mean are those of the run that never stopped (a checkpoint keeps the open
    # window and the epoch's sums), also for the epoch the signal cut
    assert _train_rows(tmp_path / "sig") == _train_rows(out / "reference")
    for epoch, text in _epoch_lines(_train_rows(out / "reference")).items():
        if epoch > (at - 1) // 4:  # the epochs the resumed process logs
            assert f"epoch {epoch}/2: {text}," in resumed.stdout, resumed.stdout


def test_a_signal_to_one_ddp_rank_stops_every_rank_at_the_same_step_and_resumes_exactly(tmp_path):
    args = tiny(tmp_path, "data.batch_size=8", "model.kwargs.drop_path_rate=0.1", "train.threads=1")
    ref = _train_process(tmp_path, [*args, "train.run_name=ref"], None, ranks=2)
    assert ref.returncode == 0, ref.stderr
    proc = _train_process(tmp_path, [*args, "train.run_name=sig"], f"{int(signal.SIGTERM)},3", ranks=2)
    assert proc.returncode != 0 and "stopped by SIGTERM at epoch 1, step 3" in proc.stderr, proc.stderr
    assert find_checkpoint(tmp_path / "sig").info["global_step"] == 3
    # the hint repeats the launcher: one process would halve the global batch, so it is refused by name
    hint = next(ln for ln in proc.stderr.splitlines() if ln.startswith("stopped by")).split("continue with: ")[1]
    assert hint == f"torchrun --standalone --nproc_per_node=2 {tmp_path / 'signal_at.py'} --resume {tmp_path / 'sig'}"
    with pytest.raises(CheckpointError, match="by 2 processes, this run has 1: resume with torchrun .* totalling 2"):
        run([], resume=tmp_path / "sig")
    assert _train_process(tmp_path, [], None, ranks=2, cmd=[*TORCHRUN, *shlex.split(hint)[1:]]).returncode == 0
    want, got = weights(tmp_path / "ref"), weights(tmp_path / "sig")
    assert all(torch.equal(got[k], v) for k, v in want.items())  # each rank resumed its own RNG streams


def test_a_killed_ddp_rank_leaves_one_line_naming_the_intact_checkpoint(tmp_path):
    args = tiny(tmp_path, "data.batch_size=8", "train.ckpt_every_steps=2", "train.run_name=k")
    proc = _train_process(tmp_path, args, f"{int(signal.SIGKILL)},3", ranks=2)  # rank 1 dies after step 3
    assert proc.returncode != 0
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: rank 0: another process of the run died or lost its connection"), line
    assert f"the last checkpoint (step 2, {tmp_path / 'k' / 'checkpoint.json'}) is intact" in line
    assert "continue with: torchrun --standalone --nproc_per_node=2" in line
    assert "trainer.py" not in proc.stderr  # no traceback from rank 0 (torchrun reports the dead rank its own way)


# ----------------------------------------------------------------------------------------------------- resume traps


def test_a_plain_resume_continues_a_run_extended_with_accept_changes(tmp_path, monkeypatch):
    args = tiny(tmp_path, "train.run_name=x", "train.epochs=1")
    run(args)
    from visionpe import engine

    step = engine.Trainer.step

    def step_then_term(self, net, batch):  # the extended run is stopped (SIGTERM) during its second epoch
        out = step(self, net, batch)
        if self.global_step + 1 == 6:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(engine.Trainer, "step", step_then_term)
    with pytest.raises(TrainingInterrupted):
        run([*args, "train.epochs=2"], resume=True, accept_changes=True)
    monkeypatch.setattr(engine.Trainer, "step", step)
    run(args, resume=True)  # the original command again: train.epochs=1 in it is the original, not a change back
    info = find_checkpoint(tmp_path / "x").info
    assert info["global_step"] == 8 and info["finished"] and info["epoch"] == 2


def test_a_cut_off_last_metrics_line_is_dropped_and_a_bad_line_inside_is_named(tmp_path):
    args = tiny(tmp_path, "train.run_name=m", "train.ckpt_every_steps=2", "train.log_every=1")
    out = run(args)
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines) + '\n{"kind": "train", "epoch": 2, "glo')  # a crash while appending
    run(args, resume=True)
    assert metrics.read_text().splitlines() == lines
    metrics.write_text("\n".join([lines[0], "{broken", *lines[1:]]) + "\n")
    with pytest.raises(CheckpointError, match="metrics.jsonl line 2 is not JSON"):
        run(args, resume=True)


# ------------------------------------------------------------------------------- the data changed under a resume


def _folders(root: Path, classes=("a", "b"), n: int = 4) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in classes:
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (18, 18, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    return root


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])  # a plain and a sharded checkpoint: one check
def test_resume_refuses_renamed_class_folders_and_another_number_of_images(tmp_path, capsys, strategy):
    root = _folders(tmp_path / "d")
    args = tiny(tmp_path, "data.name=imagefolder", "data.options={}", f"data.root={root}", "data.batch_size=4")
    args += ["train.run_name=f", "train.epochs=1", f"train.strategy={strategy}"]
    run(args)
    for split in ("train", "val"):  # class "a" renamed "c": its images would now be labelled 1, b's 0
        (root / split / "a").rename(root / split / "c")
    line = _one_line_error(capsys, [*args, "train.epochs=2", "--resume", "--accept-changes"])
    assert "missing now: 'a'; new: 'c'" in line and "what each label means" in line
    for split in ("train", "val"):
        (root / split / "c").rename(root / split / "a")
    Image.fromarray(np.zeros((18, 18, 3), np.uint8)).save(root / "train" / "a" / "extra.png")
    line = _one_line_error(capsys, [*args, "train.epochs=2", "--resume", "--accept-changes"])
    assert "the training split has 9 items" in line and "trained on 8" in line


# ------------------------------------------------------------------------------------- unwritable run directories


def test_an_output_dir_that_is_a_file_or_read_only_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    line = _one_line_error(capsys, tiny(tmp_path / "file", "train.run_name=r"))
    assert f"{tmp_path / 'file'} is a file, not a folder; set train.output_dir" in line
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = not subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True
    ).returncode
    if not mounted:
        ro.chmod(0o555)
        if os.access(ro, os.W_OK):
            pytest.skip("cannot make a read-only folder here (root without mount)")
    try:
        line = _one_line_error(capsys, tiny(ro, "train.run_name=r"))
        assert f"cannot write to {ro / 'r'}" in line and "set train.output_dir to a folder you can write" in line
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], check=False)


def test_a_model_that_is_not_finite_from_the_start_is_not_blamed_on_the_lr(tmp_path, capsys, monkeypatch):
    from visionpe.engine import trainer

    real = trainer.run_model
    monkeypatch.setattr(trainer, "run_model", lambda net, x: real(net, x) * float("nan"))
    line = _one_line_error(capsys, tiny(tmp_path, "train.run_name=n"))
    assert "the first batch's loss was already nan, before any update" in line
    assert "no checkpoint was written yet" in line and "optim.lr" not in line
    assert json.loads((tmp_path / "n" / ".lock").read_text() or "{}") == {}  # released
