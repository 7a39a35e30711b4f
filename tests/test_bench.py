"""The benchmarks: extrapolation runs end to end and resume, FLOPs match a hand count, cards come from results files,
bad benchmark files fail before any training."""

from __future__ import annotations

import csv
import importlib.metadata
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import timm
import torch

import visionpe  # noqa: F401
import visionpe.attention
import visionpe.engine
from visionpe.attention import attn_backend
from visionpe.backend_check import xformers_status
from visionpe.bench import gpu_check
from visionpe.bench.__main__ import main as bench_main
from visionpe.bench.cards import write_cards
from visionpe.bench.extrapolate import BenchConfigError, load_bench, make_plan, run_benchmark, validate
from visionpe.bench.measure import (
    Clock,
    count_flops,
    example_input,
    interleave,
    paired_ratios,
    saved_activation_mb,
    spread,
)
from visionpe.bench.protocols import modes_agree
from visionpe.bench.speed import measure
from visionpe.engine.bench_settings import parse_size
from visionpe.engine.checkpoint import find_checkpoint
from visionpe.recipes import list_recipes
from visionpe.zoo import create_model, expand_models, family_of, timm_equivalent

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


IN_PROGRESS: tuple[str, ...] = ()


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
from visionpe.engine.interrupt import worker_init

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
    ],
)
def test_bad_benchmarks_fail_before_any_training(tmp_path, monkeypatch, overrides, match):
    _no_training(monkeypatch)
    with pytest.raises(ValueError, match=match):
        run_benchmark(*load_bench(_bench_file(tmp_path), overrides), log=lambda *a: None)


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


# --------------------------------------------------------------------------------------------------- FLOPs, speed


def vit_flops_by_hand(
    img: int,
    patch: int,
    dim: int,
    depth: int,
    num_classes: int,
    in_chans: int = 3,
    num_prefix: int = 1,
    mlp_ratio: float = 4.0,
) -> dict[str, int]:
    """MACs of a ViT with CLS pooling, by part, counted as fvcore does (LayerNorm: 5 per element): what
    measure.count_flops must give."""
    n = (img // patch) ** 2
    t = n + num_prefix
    hidden = int(dim * mlp_ratio)
    per_block = {
        "linear": t * dim * 3 * dim + t * dim * dim + 2 * t * dim * hidden,  # qkv, proj, fc1, fc2
        "attention": 2 * t * t * dim,  # q k^T and probs @ v over all heads
        "layer_norm": 2 * 5 * t * dim,
    }
    return {
        "conv": n * dim * in_chans * patch * patch,
        "linear": depth * per_block["linear"] + dim * num_classes,  # blocks + head on the CLS token
        "attention": depth * per_block["attention"],
        "layer_norm": depth * per_block["layer_norm"] + 5 * t * dim,  # blocks + final norm
    }


def test_flops_of_a_vit_match_the_hand_count_with_attention_counted():
    kw = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    model = timm.create_model("vit_n_ape", **kw)
    x = torch.randn(1, 3, 32, 32)
    hand = vit_flops_by_hand(32, 8, 32, 2, 10)
    ops = count_flops(model, x)
    assert sum(ops.values()) == sum(hand.values())
    assert ops["scaled_dot_product_attention"] == hand["attention"] == 2 * 2 * 17 * 17 * 32
    assert ops["linear"] == hand["linear"] and ops["conv"] == hand["conv"]
    with attn_backend("math"):  # explicit matmuls count the same
        assert sum(count_flops(model, x).values()) == sum(ops.values())


def test_ours_and_timms_vit_measured_in_one_run():
    assert timm_equivalent("vit_s_ape")[0] == "vit_small_patch16_224"
    assert timm_equivalent("swin_t_rpb")[0] == "swin_tiny_patch4_window7_224"
    assert timm_equivalent("cvt_13") is None
    rows = measure(["vit_t_ape"], [32], batch=1, rounds=1, steps=1, train=False, memory=False, log=lambda *a: None)
    by = {r.model: r for r in rows}
    assert by["vit_t_ape"].reference == "vit_tiny_patch16_224"
    # integer flop counts (exact in float64) / 1e9: equal to ~1 ulp; a missing layer is off by > 1 %
    assert by["vit_t_ape"].gflops == pytest.approx(by["vit_tiny_patch16_224"].gflops)
    assert by["vit_t_ape"].gflops == pytest.approx(sum(vit_flops_by_hand(32, 16, 192, 12, 1000).values()) / 1e9)
    assert all(r.infer_ips > 0 for r in rows)


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


# ----------------------------------------------------------------------------------------- speed: clock and ratios


class _StepClock:
    """A clock that advances only when a task says so: exact, machine-independent rates."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_interleaved_rounds_give_paired_ratios_and_their_spread():
    clock = _StepClock()

    def task(cost: float):
        def run() -> int:
            clock.t += cost
            return 2  # items per call

        return run

    rates = interleave({"fast": task(1.0), "slow": task(4.0)}, clock, rounds=5, steps=3)
    assert rates["fast"] == [2.0] * 5 and rates["slow"] == [0.5] * 5  # 6 items in 3 (resp. 12) time units
    assert paired_ratios(rates, "fast")["slow"] == [0.25] * 5
    s = spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.q1, s.q3, s.min, s.max) == (3.0, 2.0, 4.0, 1.0, 5.0)
    assert s.text() == "3.00 [2.00-4.00]" and spread([1.0, 3.0]).text() == "2.00 [1.00-3.00]"
    with pytest.raises(ValueError, match="baseline 'nope' was not measured"):
        paired_ratios(rates, "nope")
    with pytest.raises(ValueError, match="use the 'wall' clock"):
        Clock("cpu", "cuda")


def test_speed_covers_video_lengths_against_a_baseline_in_one_run():
    rows = measure(
        ["vivit_n_ape", "vivit_n_rope3d"],
        [32],
        batch=1,
        rounds=2,
        steps=1,
        train=False,
        memory=False,
        flops=False,
        frames=[2, 4],
        baseline="vivit_n_ape",
        log=lambda *a: None,
    )
    by = {(r.model, r.frames): r for r in rows}
    assert set(by) == {(m, f) for m in ("vivit_n_ape", "vivit_n_rope3d") for f in (2, 4)}
    assert by["vivit_n_ape", 4].tokens == 2 * by["vivit_n_ape", 2].tokens  # tubelets along time double
    assert all(r.baseline == "vivit_n_ape" for r in rows)
    assert by["vivit_n_ape", 2].infer_vs_base["median"] == 1.0  # the baseline against itself, round by round
    model = timm.create_model("vivit_n_ape")
    small, large = (saved_activation_mb(model, example_input("vivit_n_ape", 32, 1, f)) for f in (2, 4))
    assert large > 1.5 * small  # activations grow about linearly with the clip length


def test_speed_command_rejects_bad_models_and_sizes(capsys):
    with pytest.raises(SystemExit):
        bench_main(["speed", "--models", "zzz_*"])
    assert "matches no registered visionpe model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["speed", "--models", "vit_n_ape", "--resolutions", "0"])
    assert "--resolutions: takes whole numbers above 0, got '0'" in capsys.readouterr().err
    assert bench_main(["speed", "--data", "no-such-set", "--models", "vit_n_ape"]) == 2  # one line, no traceback
    err = capsys.readouterr().err
    assert "unknown dataset 'no-such-set'" in err and "Traceback" not in err
    assert expand_models(["vit_n_rope2d*", "vit_n_rope2d"]) == [
        "vit_n_rope2d",
        "vit_n_rope2d_ape",
        "vit_n_rope2d_dinov3",
        "vit_n_rope2d_dinov3_aug",
        "vit_n_rope2d_mixed",
        "vit_n_rope2d_mixed_ape",
    ]


def test_speed_data_measures_any_image_dataset_at_the_given_sizes(tmp_path, capsys):
    out = tmp_path / "data"
    args = ["speed", "--data", "synthetic-shapes", "--models", "vit_n_ape", "--batch", "8", "--rounds", "1"]
    args += ["--steps", "1", "--workers", "0", "--out", str(out)]
    assert bench_main([*args, "--data-options", "num_train=24", "--resolutions", "16", "24"]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["images"] == 24 and result["options"] == {"num_train": 24}  # the option reached the dataset
    tasks = {r["task"]: r for r in result["rows"]}
    assert set(tasks) == {
        "loader 16px, 0 worker(s)",
        "loader sizes 16/24, 0 worker(s)",
        "step vit_n_ape",
        "loop vit_n_ape, 0 worker(s)",
    }
    assert tasks["step vit_n_ape"]["vs_base"]["median"] == 1.0  # the baseline against itself
    assert all(r["ips"]["median"] > 0 for r in tasks.values())
    assert "synthetic-shapes (num_train=24)" in out.with_suffix(".md").read_text()
    capsys.readouterr()
    # bad input: one line naming the fix, no traceback
    assert bench_main([*args]) == 2  # a generated dataset has no size of its own
    assert "give the size to measure 'synthetic-shapes' at with --resolutions" in capsys.readouterr().err
    assert bench_main([*args, "--resolutions", "16", "--data-options", "num_items=3"]) == 2
    assert "does not take option(s) ['num_items']" in capsys.readouterr().err
    assert bench_main([*args[:2], "video-shapes", *args[3:], "--resolutions", "16"]) == 2
    assert "--data measures image datasets; 'video-shapes' is a video dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main([*args, "--resolutions", "16", "--data-options", "num_train"])
    assert "--data-options takes KEY=VALUE words, got 'num_train'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- gpu-check


def test_gpu_check_on_cpu_compares_sdpa_with_math_and_says_what_it_skipped(tmp_path, capsys):
    assert bench_main(["gpu-check", "--out", str(tmp_path / "g")]) == 0
    result = json.loads((tmp_path / "g.json").read_text())
    assert {r["backend"] for r in result["agreement"]} == {"sdpa"}
    assert {r["model"] for r in result["agreement"]} == set(gpu_check.AGREEMENT_MODELS.values())
    assert all(r["ok"] and r["rel_err"] <= r["tol"] for r in result["agreement"])
    assert result["throughput"] == [] and any("no CUDA device" in s for s in result["skipped"])
    assert result["masked"] == result["native"] == [] and any("masked attention" in s for s in result["skipped"])
    assert "| bias (Swin RPB + shift mask) | swin_n_rpb | float32 | sdpa |" in (tmp_path / "g.md").read_text()


def _fake_xformers(monkeypatch, calls: list):
    """An `xformers` package whose kernel is plain attention on [B, M, H, K] tensors (counts its calls)."""
    ops = types.ModuleType("xformers.ops")

    def memory_efficient_attention(q, k, v, attn_bias=None, scale=None):
        calls.append(q.shape)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        attn = (q * scale) @ k.transpose(-2, -1) + (0 if attn_bias is None else attn_bias.to(q.dtype))
        return (attn.softmax(-1) @ v).transpose(1, 2)

    class BlockDiagonalMask:  # stands in for fmha's: here the dense additive mask of the segments
        @staticmethod
        def from_seqlens(seqlens):
            ids = torch.repeat_interleave(torch.arange(len(seqlens)), torch.tensor(seqlens))
            return torch.zeros(len(ids), len(ids)).masked_fill(ids[:, None] != ids[None, :], float("-inf"))

    ops.memory_efficient_attention = memory_efficient_attention
    ops.fmha = types.SimpleNamespace(BlockDiagonalMask=BlockDiagonalMask)
    pkg = types.ModuleType("xformers")
    pkg.ops = ops
    monkeypatch.setitem(sys.modules, "xformers", pkg)
    monkeypatch.setitem(sys.modules, "xformers.ops", ops)


def test_gpu_check_cuda_branches_run_with_a_mocked_gpu(monkeypatch):
    calls: list = []
    _fake_xformers(monkeypatch, calls)
    allocated = iter(range(0, 10**9, 2**20))  # every reading 1 MiB more: the probe must subtract its base
    real_flex, cuda_is_available = visionpe.attention.flex_attend, torch.cuda.is_available

    def flex_attend(*args):  # the real flex attention (eager on CPU); dynamo inside it must see no CUDA
        with monkeypatch.context() as m:
            m.setattr(torch.cuda, "is_available", cuda_is_available)
            return real_flex(*args)

    monkeypatch.setattr(visionpe.attention, "flex_attend", flex_attend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Mock GPU")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: next(allocated))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: next(allocated) + 5 * 2**20)
    monkeypatch.setattr(gpu_check.checks, "xformers_status", lambda: dict(torch="t", cuda="c", usable=True, reason=""))
    monkeypatch.setattr(visionpe.attention, "xformers_supports", lambda q, bias: (True, ""))
    shape = dict(rows=2, length=48, images_per_row=3, heads=2, head_dim=8, reps=1)
    tiny = lambda name: create_model(name, **family_of(name).tiny)
    result = gpu_check.run_check("cpu", "vit_n_ape", (32,), 1, "vit_n_rope2d_mixed", tiny, shape)
    assert result["gpu"] == "Mock GPU" and result["backends"] == ["sdpa", "xformers"]
    got = {(r["model"], r["dtype"], r["backend"]) for r in result["agreement"]}
    assert got == {
        (m, d, b)
        for m in gpu_check.AGREEMENT_MODELS.values()
        for d in ("float32", "bfloat16")
        for b in ("sdpa", "xformers")
    }
    assert calls and all(r["ok"] for r in result["agreement"]), [r for r in result["agreement"] if not r["ok"]]
    assert [r["backend"] for r in result["throughput"]] == ["math", "sdpa", "xformers"]
    assert all(r["peak_mb"] == 6.0 and r["vs"] == "sdpa" for r in result["throughput"])  # 1 MiB step + 5 MiB peak
    md = gpu_check.format_markdown(result)
    assert "| vit_n_ape | 32 | xformers |" in md
    # native-resolution batches: a masked-attention line and a packed-model line per backend, all within tolerance
    masked = ["flex", "xformers", "sdpa"]
    assert [r["backend"] for r in result["masked"]] == [r["backend"] for r in result["native"]] == masked
    for r in result["masked"]:  # the math reference is float64 on CPU: fp32 agrees to ~1e-7, bf16 to ~1e-2
        assert r["ok"] and r["fp32_max_rel_err"] < 1e-5 and 0 < r["bf16_max_rel_err"] <= 3e-2, r
        assert r["images"] == 6 and r["fp32_images_per_s"] > 0 and r["bf16_images_per_s"] > 0
    for r in result["native"]:
        assert r["ok"] and r["fp32_max_rel_err"] < 1e-5 and r["images"] == 8, r
    assert "| xformers (block-diagonal) | " in md and "vit_n_rope2d_mixed on a packed batch" in md
    assert result["ok"]


def test_gpu_check_reports_a_failing_masked_backend_and_fails(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no triton")

    monkeypatch.setattr(gpu_check.checks, "check_masked_backend", broken)
    rows = gpu_check.masked_attention(["flex", "sdpa"], "cpu")
    assert [r["ok"] for r in rows] == [False, False] and rows[0]["error"] == "RuntimeError: no triton"
    assert "| flex (block mask) | RuntimeError: no triton | - | False |" in "\n".join(gpu_check.format_native(rows, []))


def test_gpu_check_reports_an_xformers_build_for_another_torch(monkeypatch):
    _fake_xformers(monkeypatch, [])  # imports, but has no compiled `xformers._C`
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.34")
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: ["numpy", "torch==2.10.0"])
    status = xformers_status()
    assert status["xformers"] == "0.0.34" and status["xformers_requires_torch"] == "==2.10.0"
    assert status["ops_import"] and not status["compiled_ops"] and not status["usable"]
    assert "compiled ops do not load with torch" in status["reason"]


def test_cpu_memory_probe_runs_with_a_fixed_mmap_threshold(monkeypatch):
    # glibc's default threshold grows after large frees, and the resident set then keeps freed heap blocks (ViT-B
    # 1024 px iRPE read 463 MiB that way against 188 MiB live): the probe process must get the fixed threshold
    from visionpe.bench import measure as memprobe

    seen = {}

    def fake_run(cmd, capture_output, text, env):
        seen.update(cmd=cmd, env=env)
        return types.SimpleNamespace(returncode=0, stdout="12.5\n", stderr="")

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(memprobe.subprocess, "run", fake_run)
    assert memprobe.peak_memory_mb("vit_n_ape", 32) == 12.5
    assert seen["env"]["MALLOC_MMAP_THRESHOLD_"] == str(256 * 1024)
    assert json.loads(seen["cmd"][-1])["name"] == "vit_n_ape"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # a user's own setting is kept
    memprobe.peak_memory_mb("vit_n_ape", 32)
    assert seen["env"]["MALLOC_MMAP_THRESHOLD_"] == "65536"


def test_growth_fit_recovers_the_exponents_of_time_and_memory():
    """Rows whose time per item grows as N^1.5 and memory as N^2 (exact powers) give those exponents back; a model
    measured at one token count gets no fit."""
    from visionpe.bench.speed import SpeedRow, format_markdown, scaling

    rows = [
        SpeedRow("m", r, tokens=n, infer_ips=1e6 / n**1.5, infer_mem_mb=n**2 / 1e3)
        for r, n in ((224, 196), (448, 784), (896, 3136))
    ]
    rows.append(SpeedRow("single", 224, tokens=196, infer_ips=1.0, infer_mem_mb=1.0))
    fit = scaling(rows)
    assert set(fit) == {"m"}
    assert fit["m"]["tokens"] == [196, 3136]
    assert abs(fit["m"]["time_exp"] - 1.5) < 1e-9 and abs(fit["m"]["memory_exp"] - 2.0) < 1e-9  # exact data: fp64 fit
    machine = dict(date="d", cpu="cpu", cores=2, threads=1, torch="t", timm="t")
    text = format_markdown(rows, machine, dict(rounds=5, batch=1, steps=2, clock="cpu"))
    assert "| m | 196 -> 3136 | 1.50 | 2.00 | - |" in text
