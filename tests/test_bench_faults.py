"""The benchmark's writers and runner under bad input and stop signals: nothing committed is replaced by an empty
file, a mistyped results folder fails before any work, and SIGTERM / SIGINT stop a benchmark in one line with the
signal's exit status, the trainings checkpointed, so that a rerun resumes them and skips what is finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import visionpe  # noqa: F401
import visionpe.engine.trainer as trainer
from visionpe.bench.__main__ import main as bench_main
from visionpe.bench.extrapolate import load_bench, make_plan
from visionpe.bench.report import write_report
from visionpe.engine.checkpoint import find_checkpoint
from visionpe.engine.interrupt import StopOnSignal

TINY = "{embed_dim: 32, depth: 1, num_heads: 2}"


def _bench_file(tmp_path, epochs: int = 1, processes: int = 1) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(f"""
bench:
  models: [vit_n_ape, vit_n_rope2d]
  resolutions: [24]
  processes: {processes}
  output_dir: {tmp_path / "out"}
  runs_dir: {tmp_path / "runs"}
model: {{kwargs: {TINY}}}
data: {{name: synthetic-shapes, resolution: 16, batch_size: 16, options: {{num_train: 64, num_val: 16}}}}
train: {{epochs: {epochs}, amp: none, progress: false}}
""")
    return path


@pytest.mark.parametrize("mistake", ["missing", "empty"])
def test_cards_from_a_mistyped_results_folder_fail_before_writing(tmp_path, capsys, mistake):
    results = tmp_path / "resluts"
    if mistake == "empty":
        (results / "speed").mkdir(parents=True)  # a folder, but nothing the cards are made from
    out = tmp_path / "model_cards"
    out.mkdir()
    committed = out / "vit.md"
    committed.write_text("the committed card\n")
    assert bench_main(["cards", "--results", str(results), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(results) in err and "Traceback" not in err
    assert committed.read_text() == "the committed card\n" and sorted(out.iterdir()) == [committed]


def test_the_report_never_replaces_committed_tables_with_empty_ones(tmp_path):
    bench, cfg = load_bench(_bench_file(tmp_path))
    plan = make_plan(bench, cfg)
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.md").write_text("committed\n")
    stale = dict(
        model="vit_n_ape",
        seed=0,
        rows=[dict(protocol="upsample", mode="extrapolate", height=99, width=99, frames=0, top1=50.0)],
    )
    assert write_report([], plan, out, 0.0) == []
    assert write_report([stale], plan, out, 0.0) == []  # rows of points this plan no longer evaluates
    assert (out / "results.md").read_text() == "committed\n" and not (out / "results.csv").exists()


class _StopAtFirstStep(StopOnSignal):
    """The trainer's signal guard, with SIGTERM arriving as soon as it is installed (before the first step ends)."""

    sent = 0

    def __enter__(self):
        super().__enter__()
        if not _StopAtFirstStep.sent:
            _StopAtFirstStep.sent = 1
            os.kill(os.getpid(), signal.SIGTERM)
        return self


def test_sigterm_stops_the_benchmark_in_one_line_and_a_rerun_resumes(tmp_path, monkeypatch, capsys):
    path = _bench_file(tmp_path, epochs=2)
    monkeypatch.setattr(trainer, "StopOnSignal", _StopAtFirstStep)
    assert bench_main(["extrapolate", "-c", str(path)]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stopped by SIGTERM at epoch 1, step 1") and "rerun" in err[0], err
    run = tmp_path / "runs" / "vit_n_ape-s0"
    assert not find_checkpoint(run).info.get("finished")  # checkpointed at the step the signal arrived
    assert not (tmp_path / "runs" / "vit_n_rope2d-s0").exists()  # the next run never started

    monkeypatch.setattr(trainer, "StopOnSignal", StopOnSignal)
    assert bench_main(["extrapolate", "-c", str(path)]) == 0
    first = json.loads((tmp_path / "out" / "evals" / "vit_n_ape-s0.json").read_text())
    assert first["resumed"] is True and find_checkpoint(run).info["finished"]
    second = tmp_path / "out" / "evals" / "vit_n_rope2d-s0.json"
    assert json.loads(second.read_text())["resumed"] is False
    before = second.read_text()
    assert bench_main(["extrapolate", "-c", str(path)]) == 0  # everything finished: nothing is trained or evaluated
    assert second.read_text() == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals to worker processes")
def test_sigterm_to_a_parallel_benchmark_checkpoints_its_workers(tmp_path):
    path = _bench_file(tmp_path, epochs=200, processes=2)  # long enough to be stopped while training
    cmd = [sys.executable, "-m", "visionpe.bench", "extrapolate", "-c", str(path)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    metrics = [tmp_path / "runs" / f"{m}-s0" / "metrics.jsonl" for m in ("vit_n_ape", "vit_n_rope2d")]
    deadline = time.monotonic() + 240
    while not all(m.is_file() for m in metrics) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()  # (already gone unless the test fails)
    assert proc.returncode == 128 + signal.SIGTERM, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and sum(ln.startswith("stopped by SIGTERM") for ln in lines) == 1, err
    for m in metrics:  # every worker wrote a checkpoint at the step the signal reached it, and is resumable
        ref = find_checkpoint(m.parent)
        assert ref is not None and not ref.info.get("finished")
