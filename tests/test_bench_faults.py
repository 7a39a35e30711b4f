"""The benchmark's writers and runner under bad input and stop signals: nothing committed is replaced by an empty
file, a mistyped results folder fails before any work, and SIGTERM / SIGINT stop a benchmark in one line with the
signal's exit status, the trainings checkpointed, so that a rerun resumes them and skips what is finished."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import visionpe  # noqa: F401
import visionpe.engine.trainer as trainer
from visionpe.bench.__main__ import main as bench_main
from visionpe.bench.extrapolate import load_bench, make_plan, write_record
from visionpe.bench.report import write_report
from visionpe.bench.settings import BenchConfigError
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


# ------------------------------------------------------------------------------- pretrained weights, sizes, devices


def _pretrained(source: Path) -> list[str]:
    return ["bench.pretrained=true", f"bench.checkpoints.vit_n_ape={source}"]


def test_a_run_directory_of_another_model_is_refused_by_name(tmp_path):
    run = tmp_path / "rope-run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {name: vit_n_rope2d}\n")
    with pytest.raises(BenchConfigError, match=r"bench.checkpoints.vit_n_ape: .*rope-run is a run of model "
                                               r"'vit_n_rope2d', not 'vit_n_ape'"):  # fmt: skip
        load_bench(_bench_file(tmp_path), _pretrained(run))


def test_other_weights_for_the_same_model_are_a_new_record_not_already_done(tmp_path):
    weights = tmp_path / "ape.safetensors"
    weights.write_bytes(b"first weights")
    job = make_plan(*load_bench(_bench_file(tmp_path), _pretrained(weights))).jobs[0]
    record = job.record()
    record["rows"] = [dict(protocol="upsample", mode="extrapolate", height=16, width=16, frames=0, top1=50.0)]
    write_record(job.record_path, record)
    assert job.record()["rows"]  # the same weights: the record is reused
    weights.write_bytes(b"other weights, same model")
    assert job.record()["rows"] == [] and job.record()["eval"]["weights"] != record["eval"]["weights"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("bench.resolutions=100000", r"bench.resolutions\[0\] must be >= 1 and <= 8192, got 100000"),
        ("bench.shapes=28x100000", r"bench.shapes\[0\]: each side must be >= 1 and <= 8192 px"),
        ("bench.seeds=-1", r"bench.seeds\[0\] must be >= 0 and <= 2147483647, got -1"),
    ],
)
def test_sizes_and_seeds_out_of_range_are_refused_by_the_dry_run(tmp_path, capsys, override, message):
    assert bench_main(["extrapolate", "-c", str(_bench_file(tmp_path)), "--dry-run", override]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err.splitlines()[0]) and "Traceback" not in err


def test_speed_checks_its_device_and_sizes_before_measuring(capsys, monkeypatch):
    from visionpe.bench.perf import speed

    monkeypatch.setattr(speed, "measure", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setattr(speed.torch.cuda, "is_available", lambda: False)
    assert bench_main(["speed", "--models", "vit_n_ape", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.startswith("error: --device cuda: CUDA is not available on this machine; use "
                                              "--device cpu")  # fmt: skip
    assert bench_main(["speed", "--models", "vit_n_ape", "--resolutions", "100000"]) == 2
    assert capsys.readouterr().err.startswith("error: --resolutions must be >= 1 and <= 8192 px, got 100000")
