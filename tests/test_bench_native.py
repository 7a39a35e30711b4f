"""The native-aspect protocol of the extrapolation benchmark: a tiny run end to end on generated Fashion-MNIST files
(token budgets at each image's own aspect ratio, fixed aspect ratios never trained on), its numbers against a
forward pass of each image alone, its tables, plot, claims and rerun, and one-line errors for bad settings."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import visionpe  # noqa: F401
import visionpe.engine
from visionpe.bench.claims import is_beyond
from visionpe.bench.extrapolate import BenchConfigError, load_bench, make_plan, run_benchmark
from visionpe.bench.protocols import NativeView, Point, first_inputs, point_label
from visionpe.bench.settings import parse_aspect
from visionpe.data import build_dataset
from visionpe.data.native.resize import budget_size

TINY = "{embed_dim: 32, depth: 1, num_heads: 2, patch_size: 4}"


def _fashion_folder(root: Path, n: int = 48) -> Path:
    """Fashion-MNIST-shaped IDX files: a bright bar whose place encodes the class (of 4), with noise."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix in ("train", "t10k"):
        labels = np.arange(n) % 4
        images = rng.integers(0, 30, (n, 28, 28), dtype=np.uint8)
        for i, y in enumerate(labels):
            images[i, 4 + 5 * y : 9 + 5 * y, 4:24] = 255
        for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
            header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
            with gzip.open(root / f"{prefix}-{kind}-ubyte.gz", "wb") as f:
                f.write(header + arr.astype(np.uint8).tobytes())
    return root


def _bench_file(tmp_path, bench_extra: str = "", native: str = "mode: packed, max_tokens: 16") -> str:
    root = _fashion_folder(tmp_path / "fm")
    path = tmp_path / "native.yaml"
    path.write_text(f"""
bench:
  models: [vit_n_ape, vit_n_irpe]
  seeds: [0]
  protocols: [native]
  tokens: [36]
  aspects: ["1:3", "1:1", "3:1"]
  position_modes: [extrapolate, interpolate]
  output_dir: {tmp_path / "out"}
  runs_dir: {tmp_path / "runs"}
{bench_extra}
model: {{kwargs: {TINY}}}
data:
  name: fashion-mnist-native
  root: {root}
  resolution: 16
  options: {{num_train: 48, num_val: 20, item: 16, side: 18, max_aspect: 1.5}}
  native: {{{native}, row_tokens: 48, tokens_per_batch: 192}}
optim: {{lr: 3.0e-3}}
train: {{epochs: 8, amp: none, progress: false}}
""")
    return str(path)


@torch.no_grad()
def _alone_top1(model, ds, point: Point, patch: int) -> float:
    """Top-1 (%) with each image drawn at the point's size and run alone as a plain [1, C, H, W] tensor."""
    correct = 0
    for i in range(len(ds)):
        native = (point.height * 1000, point.width * 1000) if point.height else ds.native_size(i)
        image, y = ds.render_size(i, budget_size(native, patch, point.tokens))
        correct += int(model(image[None]).argmax(-1).item() == y)
    return 100.0 * correct / len(ds)


def test_native_protocol_end_to_end_agrees_with_each_image_run_alone(tmp_path, monkeypatch):
    bench, cfg = load_bench(_bench_file(tmp_path))
    plan = make_plan(bench, cfg)
    labels = [point_label(p) for p in plan.points]
    assert labels == ["16 tok", "36 tok", "1:3 16 tok", "1:1 16 tok", "3:1 16 tok"]
    out = run_benchmark(bench, cfg, log=lambda *a: None)

    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert len(rows) == 2 * 2 * 5  # models x modes x points
    assert {(r["height"], r["width"], r["tokens"]) for r in rows} == {
        ("0", "0", "16"), ("0", "0", "36"), ("3", "1", "16"), ("1", "1", "16"), ("1", "3", "16")
    }  # fmt: skip
    assert len({r["top1"] for r in rows}) > 2  # trained past chance (25%): the counts below tell points apart
    ds = build_dataset("fashion-mnist-native", "val", 16, root=cfg.data.root, options=cfg.data.options)
    for model_name in ("vit_n_ape", "vit_n_irpe"):
        record = json.loads((out / "evals" / f"{model_name}-s0.json").read_text())
        model, _, _ = visionpe.engine.load_checkpoint(record["run_dir"], device="cpu")
        model.eval().set_position_mode("extrapolate")
        for r in (r for r in record["rows"] if r["mode"] == "extrapolate"):
            point = Point("native", r["height"], r["width"], 0, r["tokens"])
            assert r["images"] == 20
            # padded rows of the benchmark vs each image alone: the same count of correct images (of 20)
            assert r["top1"] == pytest.approx(_alone_top1(model, ds, point, 4), abs=1e-9)

    md = (out / "results.md").read_text()
    assert "| model | PE | base (16 tok) | 36 tok | 1:3 16 tok | 1:1 16 tok | 3:1 16 tok |" in md
    assert "at native aspect ratios (canvases of 1:1.5 to 1.5:1), 16 tokens per image, packed rows" in md
    assert "*native* (`N tok`)" in md
    summary = json.loads((out / "summary.json").read_text())
    assert summary["base_tokens"] == 16 and summary["protocols"] == ["native"]
    (irpe,) = [j for j in summary["claims"] if j["claim"] == "iRPE > APE"]
    # every native point once: both models' modes agree, so the interpolate rows repeat the extrapolate ones
    assert len(irpe["comparisons"]) == 5 and {c["mode"] for c in irpe["comparisons"]} == {"extrapolate"}
    assert (out / "results.png").stat().st_size > 1000

    # a rerun with one more aspect ratio trains nothing and keeps the rows already measured
    monkeypatch.setattr(visionpe.engine, "train", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    before = json.loads((out / "evals" / "vit_n_ape-s0.json").read_text())["rows"]
    run_benchmark(*load_bench(_bench_file(tmp_path), ['bench.aspects=["1:3","1:1","3:1","1:2"]']), log=lambda *a: None)
    after = json.loads((out / "evals" / "vit_n_ape-s0.json").read_text())["rows"]
    assert len(after) == 2 * 6 and all(r in after for r in before)


def test_native_views_draw_every_image_at_the_points_budget_and_shape(tmp_path):
    root = _fashion_folder(tmp_path / "fm")
    ds = build_dataset("fashion-mnist-native", "val", 16, root=str(root), options=dict(item=16, side=18))
    wide = first_inputs(NativeView(ds, Point("native", 1, 3, 0, 48), 4), 6)
    grids = (wide["patch_coord"].amax(1) + 1) * wide["patch_valid"].any(1, keepdim=True)
    assert torch.equal(grids, torch.tensor([[4, 12]] * 6))  # 4 x 12 patches: 3:1 exactly, 48 tokens
    own = first_inputs(NativeView(ds, Point("native", 0, 0, 0, 36), 4), 6)
    for i in range(6):  # each image at its own aspect ratio: the budget's size of its native canvas
        H, W = budget_size(ds.native_size(i), 4, 36)
        assert int(own["patch_valid"][i].sum()) == (H // 4) * (W // 4) <= 36
    assert parse_aspect("3:1") == (1, 3) and parse_aspect("2:4") == (2, 1)
    base = Point("native", 0, 0, 0, 16)
    assert [is_beyond(Point("native", h, w, 0, t), base) for h, w, t in ((0, 0, 16), (1, 1, 16), (1, 3, 16),
           (0, 0, 36))] == [False, False, True, True]  # fmt: skip


@pytest.mark.parametrize(
    "extra, native, match",
    [
        ('  aspects: ["3-1"]', "mode: packed, max_tokens: 16", "an aspect ratio is W:H"),
        ("  tokens: []\n  aspects: []", "mode: packed, max_tokens: 16", "the native protocol and bench.tokens"),
        ("", "mode: buckets, max_tokens: 16", "data.native.mode packed or padded"),
    ],
)
def test_bad_native_benchmarks_fail_before_any_training(tmp_path, monkeypatch, extra, native, match):
    monkeypatch.setattr(visionpe.engine, "train", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    path = Path(_bench_file(tmp_path, native=native))
    text = path.read_text()
    if extra:  # replace the keys the case names
        for key in ("tokens", "aspects"):
            if f"  {key}:" in extra:
                text = "\n".join(ln for ln in text.splitlines() if not ln.startswith(f"  {key}:"))
        text = text.replace("bench:\n", f"bench:\n{extra}\n", 1)
    path.write_text(text)
    with pytest.raises(BenchConfigError, match=match):
        run_benchmark(*load_bench(str(path)), log=lambda *a: None)


def test_native_protocol_needs_a_native_recipe(tmp_path):
    path = Path(_bench_file(tmp_path))
    path.write_text(path.read_text().replace("  native: {mode: packed, max_tokens: 16, row_tokens: 48, "
                                             "tokens_per_batch: 192}\n", ""))  # fmt: skip
    with pytest.raises(BenchConfigError, match="the recipe needs data.native settings"):
        make_plan(*load_bench(str(path)))
