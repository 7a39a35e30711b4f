"""The extrapolation benchmark runs end to end and resumes, bad benchmark files fail before any training, and the
model cards come from results files (speed, FLOPs and gpu-check: test_bench_speed.py)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import timm
import torch

import visionpe  # noqa: F401
import visionpe.engine
from visionpe.bench.__main__ import main as bench_main
from visionpe.bench.cards import write_cards
from visionpe.bench.extrapolate import BenchConfigError, load_bench, make_plan, run_benchmark, validate
from visionpe.bench.protocols import modes_agree
from visionpe.bench.settings import parse_size
from visionpe.engine.checkpoint import find_checkpoint
from visionpe.recipes import list_recipes

TINY = "{embed_dim: 32, depth: 1, num_heads: 2}"


def _bench_file(tmp_path, models=("vit_n_ape", "vit_n_rope2d_mixed"), extra: str = "") -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(f"""
bench:
  models: [{", ".join(models)}]
  seeds: [0]
  resolutions: [16, 24]
  shapes: [16x32]
  output_dir: {tmp_path / "out"}
  runs_dir: {tmp_path / "runs"}
{extra}
model: {{kwargs: {TINY}}}
data: {{name: synthetic-shapes, resolution: 16, batch_size: 32, options: {{num_train: 64, num_val: 24}}}}
train: {{epochs: 1, amp: none, progress: false}}
""")
    return str(path)


def _no_training(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(visionpe.engine, "train", refuse)


# ---------------------------------------------------------------------------------------------------- extrapolate


def test_tiny_extrapolation_writes_tables_and_reruns_only_what_is_missing(tmp_path, monkeypatch):
    bench, cfg = load_bench(_bench_file(tmp_path))
    out = run_benchmark(bench, cfg, log=lambda *a: None)
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert len(rows) == 2 * 2 * 3  # models x modes x sizes (16 is the base)
    assert {(r["height"], r["width"]) for r in rows} == {("16", "16"), ("24", "24"), ("16", "32")}
    md = (out / "results.md").read_text()
    assert "## extrapolate" in md and "## interpolate" in md and "| vit_n_rope2d_mixed |" in md
    assert "vit_n_ape (=)" in md  # a resampled APE gives the same logits in both modes
    assert (
        "model options: embed_dim=32, depth=1, num_heads=2; augmentation: none)" in md
    )  # what the models were built with
    assert (out / "results.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    base = {r["model"]: r["mean"] for r in summary["table"] if (r["height"], r["width"]) == (16, 16)}
    # the same float64 subtraction, stored by json at full precision (both modes share the 16 x 16 mean):
    # equal up to ~1 ulp, inside approx's rel 1e-6
    assert all(r["delta"] == pytest.approx(r["mean"] - base[r["model"]]) for r in summary["table"])
    record = json.loads((out / "evals" / "vit_n_ape-s0.json").read_text())
    assert record["modes_agree"] is True and record["pe"] == "ape"
    info = find_checkpoint(record["run_dir"]).info  # the run's own count, which adds up a resumed run's attempts
    assert (record["train_seconds"], record["train_cpu_seconds"]) == (info["seconds"], info["cpu_seconds"])
    # the whole benchmark's cost is the sum of the runs' recorded CPU seconds (rounded to whole minutes)
    records = [json.loads(p.read_text()) for p in (out / "evals").glob("*.json")]
    total = sum(r["train_cpu_seconds"] + r["eval_cpu_seconds"] for r in records)
    assert f"All {len(records)} timed runs together: {total / 60:.0f} CPU-minutes" in md

    # a rerun trains nothing; a new size is evaluated from the kept checkpoint, the old rows are kept
    _no_training(monkeypatch)
    before = (out / "evals" / "vit_n_rope2d_mixed-s0.json").read_text()
    bench, cfg = load_bench(_bench_file(tmp_path), ["bench.resolutions=16,24,32"])
    run_benchmark(bench, cfg, log=lambda *a: None)
    record = json.loads((out / "evals" / "vit_n_rope2d_mixed-s0.json").read_text())
    assert len(record["rows"]) == 2 * 4
    old = {(r["mode"], r["height"], r["width"]): r["top1"] for r in json.loads(before)["rows"]}
    assert all(old[(r["mode"], r["height"], r["width"])] == r["top1"] for r in record["rows"] if r["height"] != 32)

    # results made with another recipe are neither mixed in nor overwritten
    with pytest.raises(BenchConfigError, match="train.epochs"):
        run_benchmark(*load_bench(_bench_file(tmp_path), ["train.epochs=2"]), log=lambda *a: None)


def test_records_keep_the_training_curve_and_the_report_says_whether_it_plateaued(tmp_path):
    path = _bench_file(tmp_path, models=("vit_n_ape",))
    out = run_benchmark(*load_bench(path, ["train.epochs=5", "bench.shapes=[]"]), log=lambda *a: None)
    record = json.loads((out / "evals" / "vit_n_ape-s0.json").read_text())
    curve = record["curve"]  # every epoch evaluated at the training point, the last one as the table's base row
    assert [c["epoch"] for c in curve] == [1, 2, 3, 4, 5] and all(c["train_loss"] > 0 for c in curve)
    base = next(r for r in record["rows"] if (r["height"], r["width"]) == (16, 16))
    assert curve[-1]["top1"] == pytest.approx(base["top1"])
    md = (out / "results.md").read_text()
    assert "## Training" in md and "| vit_n_ape | " in md and "last-fifth gain" in md
    gain = curve[-1]["top1"] - curve[3]["top1"]
    assert f"| {gain:+.1f} | {'yes' if gain < 0.5 else 'no'} |" in md
    summary = json.loads((out / "summary.json").read_text())
    assert summary["training"]["vit_n_ape"]["train_cpu_seconds"]["mean"] == record["train_cpu_seconds"]


def test_training_curve_reads_the_base_rows_and_weights_train_loss_by_steps(tmp_path):
    from visionpe.bench.extrapolate import training_curve

    rows = [
        dict(kind="train", epoch=1, global_step=3, loss=2.0),
        dict(kind="train", epoch=1, global_step=4, loss=1.0),  # a window of 1 step against one of 3
        dict(kind="eval", epoch=1, global_step=4, resolution=16, weights="model", top1=40.0),
        dict(kind="eval", epoch=1, global_step=4, resolution=16, weights="ema", top1=10.0),
        dict(kind="eval", epoch=1, global_step=4, resolution=24, weights="model", top1=20.0),
        dict(kind="train", epoch=2, global_step=8, loss=0.5),
        dict(kind="eval", epoch=2, global_step=8, resolution=16, weights="model", top1=50.0),
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "tra')  # cut off by a crash
    assert training_curve(path, 16) == [dict(epoch=1, top1=40.0, train_loss=1.75),
                                        dict(epoch=2, top1=50.0, train_loss=0.5)]  # fmt: skip
    assert training_curve(tmp_path / "missing.jsonl", 16) == []


def test_the_training_section_lists_cost_and_the_models_that_did_not_plateau():
    from visionpe.bench.report import _training, last_fifth_gain, training_summary

    def curve(values):
        return [dict(epoch=e + 1, top1=v, train_loss=1.0) for e, v in enumerate(values)]

    assert last_fifth_gain(curve([50, 60, 70, 80, 81])) == 1  # epoch 5 against epoch 4
    assert last_fifth_gain(curve([50, 60, 70, 80, 81, 81, 82, 83])) == 2  # epoch 8 against epoch 6
    assert last_fifth_gain(curve([80])) is None and last_fifth_gain(None) is None
    records = [
        dict(model="a", train_cpu_seconds=120.0, curve=curve([50, 60, 70, 80, 82])),
        dict(model="a", train_cpu_seconds=180.0, curve=curve([50, 60, 70, 80, 81])),
        dict(model="b", train_cpu_seconds=300.0, curve=curve([50, 60, 70, 80, 80.2])),
        dict(model="c", train_cpu_seconds=60.0),  # an old record: no curve
    ]
    s = dict(pretrained=False, training=training_summary(records, ["a", "b", "c"]))
    text = _training(s, ["a", "b", "c"])
    assert "| a | 2.5 ± 0.7 | 2.50 | +1.5 | no |" in text and "| b | 5.0 | 5.00 | +0.2 | yes |" in text
    assert "| c | 1.0 | 1.00 | - | - |" in text
    assert "Training did not plateau for 1 of 2 models" in text and ": a (+1.5);" in text
    assert "No curve for: c." in text
    old = _training(dict(pretrained=False, training=training_summary(records[3:], ["c"])), ["c"])
    assert "| c | 1.0 | 1.00 |" in old and "not known" in old and "last-fifth" not in old


def test_total_time_scales_the_timed_runs_to_the_untimed_ones():
    from visionpe.bench.report import _total_time_text

    timed = [
        dict(train_cpu_seconds=1100.0, eval_cpu_seconds=100.0),
        dict(train_cpu_seconds=1300.0, eval_cpu_seconds=100),
    ]
    text = _total_time_text([*timed, dict(train_cpu_seconds=None, eval_cpu_seconds=90.0)], processes=2)
    assert text.startswith("All 2 timed runs together: 43 CPU-minutes (training and evaluation), about 22 minutes")
    assert "The other 1 have no complete count" in text and "all 3 take about 65 CPU-minutes, 32 minutes on 2" in text
    assert "other" not in _total_time_text(timed, processes=2)


REPO = Path(__file__).resolve().parents[1]


# the benchmarks whose runs are in progress (their headers say so)
IN_PROGRESS: tuple[str, ...] = (
    "clipart",
    "clipart-2025",
    "clipart-seg",
    "clipart-gpu",
    "fashion-mnist-fov",
)


@pytest.mark.parametrize("name", list_recipes("bench"))
def test_every_packaged_benchmark_is_valid_and_agrees_with_its_committed_results(name, monkeypatch):
    # results/<name>/ must come from the recipe the packaged file states: a file changed without rerunning fails here
    monkeypatch.chdir(REPO)
    bench, cfg = load_bench(name, ["bench.device=cpu"])  # imagenet-pretrained asks for a GPU
    plan = make_plan(bench, cfg)
    validate(plan, check_models=False)  # raises on any record or run made with another recipe
    committed = sorted((REPO / "results" / name / "evals").glob("*.json"))
    planned = {j.record_path.name for j in plan.jobs}
    assert {p.name for p in committed} <= planned, f"results/{name}/evals holds runs the file does not plan"
    # complete except: a smoke test, a GPU, and the files whose runs are in progress (their headers say how many)
    if name not in ("quick", "imagenet-pretrained", *IN_PROGRESS):
        assert len(committed) == len(bench.models) * len(bench.seeds), f"results/{name}/evals is incomplete"


def test_base_samples_evaluate_the_training_point_on_more_items(tmp_path, monkeypatch):
    # the tables read the 24 items data.options.num_val keeps; the check reads the first N of the whole split
    path = _bench_file(tmp_path, models=("vit_n_ape",), extra="  base_samples: 24")
    sizes = ["bench.resolutions=16", "bench.shapes=[]"]
    out = run_benchmark(*load_bench(path, sizes), log=lambda *a: None)
    record = json.loads((out / "evals" / "vit_n_ape-s0.json").read_text())
    base_row = next(r for r in record["rows"] if (r["height"], r["width"]) == (16, 16))
    assert base_row["images"] == record["base_check"]["images"] == 24
    assert base_row["top1"] == record["base_check"]["top1"]  # the same first 24 items either way

    _no_training(monkeypatch)  # all of the split (synthetic-shapes: 1000 items): no training, the rows kept
    out = run_benchmark(*load_bench(path, [*sizes, "bench.base_samples=0"]), log=lambda *a: None)
    again = json.loads((out / "evals" / "vit_n_ape-s0.json").read_text())
    assert again["rows"] == record["rows"] and again["base_check"]["images"] == 1000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["base_check"]["vit_n_ape"]["mean"] == again["base_check"]["top1"]
    assert "on 1000 validation items (bench.base_samples; the tables read 24," in (out / "results.md").read_text()
    (card,) = write_cards(out.parent, tmp_path / "cards", ["vit"])
    top1 = again["base_check"]["top1"]
    assert "The training point on 1000 validation items (the tables read fewer" in card.read_text()
    assert (  # synthetic shapes are drawn, not augmented
        "model options: embed_dim=32, depth=1, num_heads=2; augmentation: none) from random init" in card.read_text()
        and "hflip" not in card.read_text()
    )
    assert f"vit_n_ape {top1:.1f}." in card.read_text()
    with pytest.raises(BenchConfigError, match="bench.base_samples must be >= 0"):
        run_benchmark(*load_bench(path, ["bench.base_samples=-1"]), log=lambda *a: None)


_ORPHAN = """
import multiprocessing, os, time
from concurrent.futures import ProcessPoolExecutor
from visionpe.bench.jobs import worker_init

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=worker_init, initargs=(1, os.getpid()))
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 120)  # the worker is busy with a run
    time.sleep(1)
    os._exit(0)  # the benchmark process dies without shutting its pool down
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_bench_workers_stop_when_the_benchmark_process_dies(tmp_path):
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    worker = int(out.stdout.split()[0])
    deadline = time.monotonic() + 30  # the worker polls its parent every second; its job would last 120 s
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(worker)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["bench.models=vit_n_apex"], "nearest visionpe models: vit_n_ape"),
        (["data.name=fashion-mnst"], "nearest: fashion-mnist"),
        (["bench.models=[]"], "bench.models is empty"),
        (["bench.seeds=[]"], "bench.seeds is empty"),
        (["bench.resolutions=[]", "bench.shapes=[]"], "both empty"),
        (["bench.resolutions=2,16"], "cannot take 2 px"),
        (["bench.shapes=16x"], "HxW"),
        (["bench.position_modes=stretch"], "position_modes.0. must be one of extrapolate"),
        (["bench.processes=0"], "bench.processes must be >= 1"),
        (["bench.sedes=0"], "unknown config key .bench.sedes. on the command line; did you mean .bench.seeds."),
        (["bench.extra_seeds=3"], "needs trained runs with at least two bench.seeds"),
        (["bench.seeds=0,1", "bench.extra_seeds=1,2"], r"repeats bench.seeds \[1\]"),
    ],
)
def test_bad_benchmarks_fail_before_any_training(tmp_path, monkeypatch, overrides, match):
    _no_training(monkeypatch)
    with pytest.raises(ValueError, match=match):
        run_benchmark(*load_bench(_bench_file(tmp_path), overrides), log=lambda *a: None)


def _write_records(plan, top1: dict) -> None:
    """Finished records for every job of `plan`: top-1 `top1[model][seed]` at every point and mode."""
    from visionpe.bench.extrapolate import write_record

    for job in plan.jobs:
        record = job.record()
        record.update(modes_agree=False, rows=record["rows"] + [
            dict(mode=m, protocol=p.protocol, height=p.height, width=p.width, frames=p.frames, tokens=p.tokens,
                 top1=top1[job.model][job.seed], top5=100.0, loss=1.0, images=24, same_as=None)
            for m, p in job.missing(record)])  # fmt: skip
        write_record(job.record_path, record)


def test_extra_seeds_go_to_the_models_of_comparisons_within_noise_and_only_after_the_first_seeds(tmp_path):
    models = ("vit_n_nope", "vit_n_cpe", "vit_n_ape", "vit_n_irpe")  # claims: PEG > no PE, iRPE > APE
    overrides = ["bench.seeds=0,1,2", "bench.extra_seeds=3,4"]
    bench, cfg = load_bench(_bench_file(tmp_path, models), overrides)
    plan = make_plan(bench, cfg)
    assert [(j.model, j.seed) for j in plan.jobs] == [(m, s) for m in models for s in (0, 1, 2)]  # none done yet
    top1 = {
        "vit_n_nope": {0: 60.0, 1: 61.0, 2: 62.0},
        "vit_n_cpe": {0: 90.0, 1: 91.0, 2: 92.0},  # 30 points ahead at a spread of 1: holds
        "vit_n_ape": {0: 80.0, 1: 83.0, 2: 86.0},
        "vit_n_irpe": {0: 81.0, 1: 84.0, 2: 85.0},  # 0.3 ahead at a spread of 3: within noise
    }
    _write_records(make_plan(bench, cfg), top1)
    plan = make_plan(bench, cfg)
    extra = [(j.model, j.seed) for j in plan.jobs if j.seed > 2]
    assert extra == [("vit_n_ape", 3), ("vit_n_ape", 4), ("vit_n_irpe", 3), ("vit_n_irpe", 4)]
    # the extra runs' results do not change which runs are planned (the choice reads seeds 0-2 only)
    for m in ("vit_n_ape", "vit_n_irpe"):
        top1[m].update({3: 99.0 if m == "vit_n_irpe" else 50.0, 4: 99.0 if m == "vit_n_irpe" else 50.0})
    _write_records(plan, top1)
    again = make_plan(bench, cfg)
    assert [(j.model, j.seed) for j in again.jobs] == [(j.model, j.seed) for j in plan.jobs]
    assert all(j.done(j.record()) for j in again.jobs)


def test_a_benchmark_runs_its_extra_seeds_after_the_first_ones_and_reports_them(tmp_path, monkeypatch):
    import visionpe.bench.extrapolate as extrapolate

    chosen = []
    monkeypatch.setattr(extrapolate, "undecided_models", lambda records, plan: chosen.append(len(records)) or
                        ["vit_n_ape"])  # fmt: skip
    bench, cfg = load_bench(_bench_file(tmp_path), ["bench.seeds=0,1", "bench.extra_seeds=2"])
    out = run_benchmark(bench, cfg, log=lambda *a: None)
    assert chosen and set(chosen) == {4}  # decided from the 2 x 2 first runs, once they were all done
    assert sorted(p.name for p in (out / "evals").glob("*.json")) == [
        "vit_n_ape-s0.json", "vit_n_ape-s1.json", "vit_n_ape-s2.json", "vit_n_rope2d_mixed-s0.json",
        "vit_n_rope2d_mixed-s1.json"]  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["extra_seeds"] == {"vit_n_ape": [2]} and summary["seeds"] == [0, 1, 2]


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    assert bench_main(["extrapolate", "-c", _bench_file(tmp_path), "bench.models=vit_n_apex", "--dry-run"]) == 2
    assert "unknown model 'vit_n_apex'" in capsys.readouterr().err
    assert bench_main(["nonsense"]) == 2
    assert bench_main([]) == 0 and "extrapolate" in capsys.readouterr().out


def test_position_modes_agree_only_for_pes_that_read_no_coordinates():
    x = torch.randn(2, 3, 48, 48)
    modes = ["extrapolate", "interpolate"]
    kw = dict(img_size=32, embed_dim=32, depth=1, num_heads=2, num_classes=4)
    assert modes_agree(timm.create_model("vit_n_ape", **kw), x, modes)
    assert modes_agree(timm.create_model("vit_n_cpe", **kw), x, modes)
    assert not modes_agree(timm.create_model("vit_n_rope2d", **kw), x, modes)
    assert not modes_agree(timm.create_model("vit_n_sincos", **kw), x, modes)


def test_sizes_parse_square_and_non_square():
    assert parse_size(28) == (28, 28) and parse_size("28x56") == (28, 56) and parse_size([28, 56]) == (28, 56)
    with pytest.raises(ValueError, match="HxW"):
        parse_size("28by56")


# ---------------------------------------------------------------------------------------------------------- cards


def test_cards_are_written_from_results_files(tmp_path):
    results = tmp_path / "results"
    (results / "speed").mkdir(parents=True)
    machine = dict(cpu="Test CPU 9000", cores=2, threads=1, torch="2.x", timm="1.x", device="cpu", date="2025-01-01")
    speed_rows = [
        dict(
            model=m,
            resolution=224,
            reference=ref,
            tokens=196,
            params_m=p,
            gflops=g,
            infer_ips=ips,
            train_ips=None,
            infer_mem_mb=50.0,
            train_mem_mb=None,
            notes=[],
        )
        for m, ref, p, g, ips in [
            ("vit_s_ape", "vit_small_patch16_224", 22.05, 4.61, 123.4),
            ("vit_small_patch16_224", None, 22.05, 4.61, 120.0),
            ("vit_s_rope2d", None, 21.97, 4.61, 98.7),
        ]
    ]
    settings = dict(batch=2, rounds=3, steps=1, clock="cpu", zoo=True)
    (results / "speed" / "zoo.json").write_text(json.dumps(dict(machine=machine, settings=settings, rows=speed_rows)))
    (results / "fm").mkdir()
    table = [
        dict(
            model=m,
            pe=m[6:],
            protocol="upsample",
            mode="extrapolate",
            height=h,
            width=h,
            frames=0,
            mean=acc,
            std=0.5,
            n=3,
            delta=d,
        )
        for m, h, acc, d in [("vit_n_ape", 28, 88.0, 0.0), ("vit_n_ape", 56, 61.5, -26.5)]
    ]
    summary = dict(
        name="fm",
        dataset="fashion-mnist",
        base=[28, 28],
        sizes=[[28, 28], [56, 56]],
        modes=["extrapolate"],
        protocols=["upsample"],
        base_frames=0,
        seeds=[0, 1, 2],
        models=["vit_n_ape"],
        modes_agree=[],
        machine=machine,
        date="2025-01-01",
        table=table,
        claims=[],
        pretrained=False,
        base_check={},
    )
    (results / "fm" / "summary.json").write_text(json.dumps(summary))
    (results / "fm" / "bench.yaml").write_text("data: {name: fashion-mnist, resolution: 28}\n")  # the run's recipe
    paths = write_cards(results, tmp_path / "cards", ["vit", "cvt"])
    vit = (tmp_path / "cards" / "vit.md").read_text()
    assert [p.name for p in paths] == ["vit.md", "cvt.md"]
    assert "Test CPU 9000" in vit and "| vit_s_ape | 22.05 | 4.61 | 123.4 | 1.00 |" in vit
    assert "| vit_s_rope2d | 21.97 | 4.61 | 98.7 | 0.80 |" in vit
    assert "| vit_s_ape | vit_small_patch16_224 | 4.61 / 4.61 | 1.03 |" in vit
    assert "| vit_n_ape | **88.0 ± 0.5** | 61.5 ± 0.5 (-26.5) |" in vit and "../results/fm/results.md" in vit
    assert "checkpoint" in vit.lower() and "arXiv:2403.13298" in vit
    cvt = (tmp_path / "cards" / "cvt.md").read_text()
    assert "No accuracy benchmark of this family yet" in cvt and "speed --zoo" in cvt
    with pytest.raises(ValueError, match="unknown family"):
        write_cards(results, tmp_path / "cards", ["vitt"])


def test_the_legend_has_as_many_columns_as_fit_the_figure():
    """One panel (5.6 in) takes 3 columns of 17-character labels, two panels 6, never more than the labels: a
    six-column legend under one panel ran off both edges of the figure."""
    from visionpe.bench.report import legend_columns

    long = ["rope2d_dinov3_aug"] + ["ape"] * 18
    assert legend_columns(long, 5.6) == 3 and legend_columns(long, 11.2) == 6
    assert legend_columns(["ape", "nope"], 5.6) == 2 and legend_columns(["x" * 200], 5.6) == 1
