"""Extrapolation protocols: field-of-view canvases keep the content's scale, clip lengths keep the temporal-order task,
orderings are judged against the seed spread, and pretrained weights are evaluated without training."""

from __future__ import annotations

import csv
import gzip
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import timm
import torch
import torch.nn.functional as F
from PIL import Image

import visionpe  # noqa: F401
import visionpe.engine
from visionpe.bench.cards import write_cards
from visionpe.bench.claims import detectable_after_holm, judge, judge_claims, tally_text
from visionpe.bench.extrapolate import BenchConfigError, load_bench, run_benchmark
from visionpe.bench.extrapolate import main as extrapolate_main
from visionpe.bench.protocols import Point, SizedView, evaluate_view, modes_agree, set_position_mode
from visionpe.bench.stats import detectable_difference, holm, mean_std, welch
from visionpe.data import build_dataset
from visionpe.data.datasets.video_shapes import render_scene, reverse_scene
from visionpe.engine.setup import build_eval_sets

TINY = "{embed_dim: 32, depth: 1, num_heads: 2}"


def _no_training(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(visionpe.engine, "train", refuse)


def _fashion_folder(root: Path, n: int = 40) -> Path:
    """Fashion-MNIST-shaped IDX files: a bright square whose corner encodes the class, on black."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix in ("train", "t10k"):
        labels = np.arange(n) % 10
        images = np.zeros((n, 28, 28), np.uint8)
        for i, y in enumerate(labels):
            r, c = 2 + 2 * (y // 5) * 5, 2 + 4 * (y % 5)
            images[i, r : r + 8, c : c + 6] = 255
            images[i] += rng.integers(0, 20, (28, 28), dtype=np.uint8)
        for kind, arr, dims in (("images-idx3", images, images.shape), ("labels-idx1", labels, labels.shape)):
            header = bytes([0, 0, 8, len(dims)]) + b"".join(int(d).to_bytes(4, "big") for d in dims)
            with gzip.open(root / f"{prefix}-{kind}-ubyte.gz", "wb") as f:
                f.write(header + arr.astype(np.uint8).tobytes())
    return root


# ------------------------------------------------------------------------------------------------- fov canvases


def test_fov_canvas_keeps_the_item_pixels_at_training_scale_inside_the_canvas(tmp_path):
    root = _fashion_folder(tmp_path / "fm")
    ds = build_dataset("fashion-mnist-canvas", "val", 32, root=str(root))
    for index in range(6):
        item, y = ds.base.render(index, 28)
        canvas, y2 = ds.render_canvas(index, (48, 64))
        assert canvas.shape == (1, 48, 64) and y2 == y
        # the item appears exactly once, pixel for pixel, fully inside; everything else is the background
        found = [
            (t, left)
            for t in range(48 - 28 + 1)
            for left in range(64 - 28 + 1)
            if torch.equal(canvas[:, t : t + 28, left : left + 28], item)
        ]
        assert len(found) == 1
        t, left = found[0]
        rest = canvas.clone()
        rest[:, t : t + 28, left : left + 28] = ds.fill
        assert torch.all(rest == ds.fill)
        assert torch.equal(ds.render_canvas(index, (48, 64))[0], canvas)  # evaluation canvases are fixed
    offsets = {tuple((ds.render_canvas(i, (96, 96))[0] != ds.fill).nonzero()[0].tolist()) for i in range(10)}
    assert len(offsets) > 3  # positions vary over items, so the far corners of the canvas are visited


def test_fov_training_draws_the_item_at_random_sizes_with_background_and_evaluation_at_item(tmp_path):
    root = _fashion_folder(tmp_path / "fm")
    opts = dict(root=str(root), options=dict(item=20, item_min=10))
    train = build_dataset("fashion-mnist-canvas", "train", 32, training=True, **opts)
    torch.manual_seed(0)
    # the garment's bounding box (non-black pixels) over many draws: sizes vary, never beyond 20 px
    extents = set()
    for index in range(30):
        canvas = train[index % 10][0][0]
        rows, cols = (canvas != train.fill).any(1).nonzero(), (canvas != train.fill).any(0).nonzero()
        if len(rows):
            extents.add(max(int(rows[-1] - rows[0]), int(cols[-1] - cols[0])) + 1)
    assert max(extents) <= 20 and min(extents) < 16 and len(extents) > 3
    val = build_dataset("fashion-mnist-canvas", "val", 32, **opts)
    item, _ = val.base.render(3, 20)
    canvas = val.render_canvas(3, (48, 48))[0]
    assert any(torch.equal(canvas[:, t : t + 20, c : c + 20], item) for t in range(29) for c in range(29))
    with pytest.raises(ValueError, match="item_min"):
        build_dataset("fashion-mnist-canvas", "train", 32, root=str(root), options=dict(item=20, item_min=24))


def test_upsample_and_fov_protocols_differ_only_away_from_the_training_size(tmp_path):
    root = _fashion_folder(tmp_path / "fm")
    ds = build_dataset("fashion-mnist-canvas", "val", 32, root=str(root))
    base = (32, 32)
    up = SizedView(ds, (64, 64), protocol="upsample", base=base)[2][0]
    fov = SizedView(ds, (64, 64), protocol="fov", base=base)[2][0]
    ref = F.interpolate(ds.render_canvas(2, base)[0][None], size=(64, 64), mode="bilinear", align_corners=False)[0]
    assert torch.allclose(up, ref, atol=1e-6)  # same op on the same input; fp32 rounding only
    # upsampling doubles the item (about 4x its bright area), fov keeps it: count pixels above mid-grey
    bright = ds.fill + 1.0
    assert (up > bright).sum() > 3 * (fov > bright).sum() > 0
    at_base = [SizedView(ds, base, protocol=p, base=base)[2][0] for p in ("upsample", "fov")]
    assert torch.equal(*at_base)


def test_fov_needs_a_canvas_dataset_and_room_for_the_item(tmp_path):
    root = _fashion_folder(tmp_path / "fm")
    with pytest.raises(ValueError, match="render_canvas"):
        SizedView(build_dataset("fashion-mnist", "val", 28, root=str(root)), (56, 56), protocol="fov")
    ds = build_dataset("fashion-mnist-canvas", "val", 32, root=str(root))
    with pytest.raises(ValueError, match="at least 28 px"):
        ds.render_canvas(0, (24, 24))


# --------------------------------------------------------------------------------------------- temporal order


def test_frames_protocol_clips_need_temporal_order():
    ds = build_dataset("video-shapes", "val", 16, options=dict(num_samples=8, noise=0.0))
    for index in range(8):
        clip, y, *_ = SizedView(ds, (16, 16), protocol="frames", frames=16)[index]
        assert clip.shape == (3, 16, 16, 16)
        scene = ds.scene(index)
        rev = reverse_scene(scene)
        assert rev["target"] != y  # playing the clip backwards changes the class ...
        backwards = render_scene(rev, 16, 16)
        # ... and is exactly the reversed clip (frame f samples time (f + 0.5) / T, symmetric under t -> 1 - t);
        # the shapes' edges are thresholds of fp32 coordinates, so allow a few boundary pixels to flip
        assert (backwards - clip.flip(1)).abs().gt(1e-4).float().mean() < 0.01
        assert (clip - clip.flip(1)).abs().gt(1e-4).float().mean() > 0.01  # and the clip is not a palindrome


# ------------------------------------------------------------------------------------------------ statistics


def test_welch_test_matches_scipys_independent_implementation():
    a, b = [81.0, 82.5, 80.2], [78.1, 79.9, 80.4, 77.0]
    got = welch(a, b)
    ref = scipy.stats.ttest_ind(a, b, equal_var=False, alternative="greater")
    assert got["p"] == pytest.approx(ref.pvalue, rel=1e-9)
    lo, hi = scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert got["ci95"] == pytest.approx([lo, hi], rel=1e-9)
    # Welch-Satterthwaite by hand: variances of the means 0.01343..., 0.5456...
    va, vb = statistics.variance(a) / 3, statistics.variance(b) / 4
    assert got["df"] == pytest.approx((va + vb) ** 2 / (va**2 / 2 + vb**2 / 3), rel=1e-12)
    # no spread on either side: the difference is exact
    assert welch([80.0, 80.0], [70.0, 70.0])["p"] == 0.0 and welch([70.0, 70.0], [80.0, 80.0])["p"] == 1.0
    with pytest.raises(ValueError, match="two values"):
        welch([80.0], [70.0, 71.0])


def test_holm_adjusts_step_down_and_keeps_order():
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01, max(0.03, 2 x 0.03), max(0.06, 1 x 0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]) == []


def test_detectable_difference_shrinks_with_more_seeds():
    # n = 3: (t_0.95,4 + t_0.8,4) x s x sqrt(2/3) = (2.1318 + 0.9410) x 1 x 0.8165
    assert detectable_difference(1.0, 3) == pytest.approx((2.131847 + 0.940965) * math.sqrt(2 / 3), rel=1e-5)
    assert detectable_difference(1.0, 5) < detectable_difference(1.0, 3)
    assert detectable_difference(1.0, 1) is None
    # Holm's first step over m = 10 comparisons: t_0.995,4 = 4.6041 in place of t_0.95,4
    holm_10 = (4.604095 + 0.940965) * math.sqrt(2 / 3)
    assert detectable_difference(1.0, 3, alpha=0.005) == pytest.approx(holm_10, rel=1e-5)


def test_a_claims_family_reports_the_difference_its_seeds_detect_after_holm():
    """m counted comparisons (uninformative and one-seed ones left out), the median spread of their cells, the
    fewest seeds, and the difference at one-sided p < 0.05 / m with 80% power."""
    cs = [dict(a_values=[60.0 + d, 62.0 + d, 64.0 + d], b_values=[50.0, 51.0, 52.0]) for d in (0.0, 3.0)]
    cs.append(dict(a_values=[12.0, 12.5, 13.0], b_values=[11.0, 11.5, 12.0]))  # within 5 points of chance 10
    for c in cs:
        c.update(a_stat=mean_std(c["a_values"]), b_stat=mean_std(c["b_values"]))
    found = detectable_after_holm(judge(cs, 10.0))
    assert (found["m"], found["seeds"], found["std"]) == (2, 3, pytest.approx(1.5))  # median of 2, 1, 2, 1
    # t_0.975,4 = 2.7764 (0.05 / 2), t_0.8,4 = 0.9410, spread 1.5, sqrt(2 / 3)
    assert found["difference"] == pytest.approx((2.776445 + 0.940965) * 1.5 * math.sqrt(2 / 3), rel=1e-5)
    assert detectable_after_holm(judge(cs[2:], 10.0)) is None  # nothing counted


def _judged(good: list[float], bad: list[float], chance: float | None = 10.0) -> str:
    c = dict(a_values=good, b_values=bad, a_stat=mean_std(good), b_stat=mean_std(bad))
    return judge([c], chance)[0]["verdict"]


def test_verdicts_follow_the_corrected_one_sided_p():
    assert _judged([80.0, 81.0, 82.0], [70.0, 71.0, 72.0]) == "holds"  # p ~ 1e-4
    assert _judged([70.0, 71.0, 72.0], [80.0, 81.0, 82.0]) == "does not hold"
    # a lead of 2 standard errors at 3 seeds (the old rule's "holds") is p ~ 0.06: within noise now
    se = math.sqrt(2 / 3)
    assert _judged([79.0, 80.0, 81.0], [x - 2.0 * se for x in (79.0, 80.0, 81.0)]) == "within noise"
    assert _judged([12.0, 13.0, 14.0], [10.0, 10.5, 11.0]) == "uninformative"  # both within 5 points of chance
    assert _judged([70.0], [60.0, 61.0]) == "one seed"
    # Holm over a claim's comparisons: p 0.02 alone holds; beside two others of p 0.02 it needs p < 0.05 / 3
    cs = [dict(a_values=[80.0 + d, 81.0 + d, 82.0 + d], b_values=[79.0, 80.0, 81.0]) for d in (1.2, 1.2, 1.2)]
    for c in cs:
        c.update(a_stat=mean_std(c["a_values"]), b_stat=mean_std(c["b_values"]))
    ps = [welch(c["a_values"], c["b_values"])["p"] for c in cs]
    assert 0.05 / 3 < ps[0] < 0.05
    assert {c["verdict"] for c in judge(cs, None)} == {"within noise"}
    assert judge(cs[:1], None)[0]["verdict"] == "holds"


def test_claims_compare_pes_on_one_backbone_beyond_the_training_point():
    records = [
        dict(model=m, family="vit", size="n", pe=pe)
        for m, pe in (("vit_n_rope2d_mixed", "rope2d_mixed"), ("vit_n_rope2d", "rope2d"), ("vit_n_ape", "ape"))
    ]
    base, far = Point("fov", 32, 32), Point("fov", 64, 64)
    values = {
        ("vit_n_rope2d_mixed", "extrapolate", base): [89.0, 90.0, 91.0],
        ("vit_n_rope2d", "extrapolate", base): [89.0, 90.0, 91.0],
        ("vit_n_ape", "extrapolate", base): [89.0, 90.0, 91.0],
        ("vit_n_rope2d_mixed", "extrapolate", far): [69.0, 70.0, 71.0],
        ("vit_n_rope2d", "extrapolate", far): [59.0, 60.0, 61.0],
        ("vit_n_ape", "extrapolate", far): [64.0, 65.0, 66.0],
    }
    judged = judge_claims(values, records, [base, far], ["extrapolate"], lambda p: base)
    rope = next(j for j in judged if j["claim"].startswith("RoPE-Mixed"))
    got = {(c["a"], c["b"]): c["verdict"] for c in rope["comparisons"]}
    assert got == {("vit_n_rope2d_mixed", "vit_n_rope2d"): "holds", ("vit_n_rope2d", "vit_n_ape"): "does not hold"}
    assert all((c["height"], c["width"]) == (64, 64) for c in rope["comparisons"])  # the base point is not beyond
    assert next(j for j in judged if j["claim"].startswith("VideoRoPE"))["comparisons"] == []
    assert tally_text(next(j for j in judged if j["claim"].startswith("iRPE"))) == (
        "not measured: this benchmark lacks models with the PEs ape, irpe on one backbone"
    )

    # both video PEs on one backbone, but only larger images: a claim about longer clips has no point to judge
    records += [dict(model=f"mm_n_{pe}", family="mm", size="n", pe=pe) for pe in ("mrope", "videorope")]
    values |= {(f"mm_n_{pe}", "extrapolate", far): [49.0, 50.0, 51.0] for pe in ("mrope", "videorope")}
    judged = judge_claims(values, records, [base, far], ["extrapolate"], lambda p: base)
    video = next(j for j in judged if j["claim"].startswith("VideoRoPE"))
    assert video["comparisons"] == [] and video["present"] == [["mm_n_videorope", "mm_n_mrope"]]
    assert tally_text(video).startswith("not measured: this benchmark has mm_n_videorope and mm_n_mrope, but no ")


# ------------------------------------------------------------------------------------------- end to end (tiny)


def test_tiny_benchmark_reports_both_image_protocols_side_by_side(tmp_path):
    root = _fashion_folder(tmp_path / "fm", n=48)
    path = tmp_path / "fov.yaml"
    path.write_text(f"""
bench:
  models: [vit_n_ape, vit_n_rope2d]
  seeds: [0, 1]
  resolutions: [48]
  protocols: [upsample, fov]
  output_dir: {tmp_path / "out"}
  runs_dir: {tmp_path / "runs"}
model: {{kwargs: {TINY}}}
data:
  {{name: fashion-mnist-canvas, root: {root}, resolution: 32, batch_size: 16, options: {{num_train: 32, num_val: 8}}}}
train: {{epochs: 1, amp: none, progress: false}}
""")
    out = run_benchmark(*load_bench(path), log=lambda *a: None)
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    # models x seeds x modes x (base + up 48 + fov 48 + fov's base, copied from upsample's)
    assert len(rows) == 2 * 2 * 2 * 4
    assert {r["protocol"] for r in rows} == {"upsample", "fov"}
    copied = [r for r in rows if r["same_as"] == "upsample"]
    assert copied and all((r["protocol"], r["height"]) == ("fov", "32") for r in copied)
    md = (out / "results.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| model | PE |"))
    assert "base (32)" in header and "up 48" in header and "fov 48" in header  # one row per PE, both protocols
    assert "## Statistics" in md and "RoPE-Mixed >= RoPE-Axial >= APE" in md
    summary = json.loads((out / "summary.json").read_text())
    assert {r["protocol"] for r in summary["table"]} == {"upsample", "fov"}
    assert all(r["n"] == 2 for r in summary["table"])
    rope = next(c for c in summary["claims"] if c["claim"].startswith("RoPE-Mixed"))
    assert {(c["a"], c["b"]) for c in rope["comparisons"]} == {("vit_n_rope2d", "vit_n_ape")}
    assert {c["protocol"] for c in rope["comparisons"]} == {"upsample", "fov"}
    (card,) = write_cards(out.parent, tmp_path / "cards", ["vit"])  # the card shows both protocols and the claim
    assert (
        "| model | base (32) | up 48 | fov 48 |" in card.read_text() and "RoPE-Mixed >= RoPE-Axial" in card.read_text()
    )


def test_tiny_video_benchmark_evaluates_longer_clips_and_larger_frames(tmp_path):
    path = tmp_path / "video.yaml"
    path.write_text(f"""
bench:
  models: [vivit_n_mrope, vivit_n_videorope]
  seeds: [0]
  resolutions: [24]
  frames: [2, 8]
  protocols: [frames, duration, upsample]
  position_modes: [extrapolate]
  output_dir: {tmp_path / "out"}
  runs_dir: {tmp_path / "runs"}
model: {{kwargs: {{embed_dim: 32, depth: 1, num_heads: 2, patch_size: 8}}}}
data: {{name: video-shapes, resolution: 16, batch_size: 8, options: {{num_samples: 16, frames: 4}}}}
train: {{epochs: 1, amp: none, progress: false}}
""")
    out = run_benchmark(*load_bench(path), log=lambda *a: None)
    record = json.loads((out / "evals" / "vivit_n_videorope-s0.json").read_text())
    got = {(r["protocol"], r["frames"], r["height"]) for r in record["rows"]}
    assert got == {("frames", 4, 16), ("frames", 2, 16), ("frames", 8, 16), ("upsample", 0, 16), ("upsample", 0, 24),
                   ("duration", 4, 16), ("duration", 2, 16), ("duration", 8, 16)}  # fmt: skip
    # the duration protocol's training point shows the frames protocol's inputs: one evaluation serves both
    duration = [r for r in record["rows"] if r["protocol"] == "duration"]
    assert {(r["frames"], r.get("same_as")) for r in duration} == {(4, "frames"), (2, None), (8, None)}
    summary = json.loads((out / "summary.json").read_text())
    video = next(c for c in summary["claims"] if c["claim"].startswith("VideoRoPE"))
    assert {c["frames"] for c in video["comparisons"] if c["protocol"] == "frames"} == {8}  # longer than trained
    assert {c["frames"] for c in video["comparisons"] if c["protocol"] == "duration"} == {8}
    assert all(c["verdict"] == "one seed" for c in video["comparisons"])
    assert "8 f" in (out / "results.md").read_text() and "dur 8 f" in (out / "results.md").read_text()


def _video_bench(tmp_path, modes: str) -> Path:
    path = tmp_path / "video-modes.yaml"
    path.write_text(f"""
bench:
  models: [vivit_n_ape, vivit_n_rope3d]
  seeds: [0]
  frames: [8]
  protocols: [frames]
  position_modes: [{modes}]
  output_dir: {tmp_path / "out"}
  runs_dir: {tmp_path / "runs"}
model: {{kwargs: {{embed_dim: 32, depth: 1, num_heads: 2, patch_size: 8}}}}
data: {{name: video-shapes, resolution: 16, batch_size: 8, options: {{num_samples: 16, frames: 4}}}}
train: {{epochs: 1, amp: none, progress: false}}
""")
    return path


def test_video_benchmark_evaluates_test_time_rope_scaling(tmp_path):
    out = run_benchmark(*load_bench(_video_bench(tmp_path, "extrapolate, ntk, yarn")), log=lambda *a: None)
    for model in ("vivit_n_ape", "vivit_n_rope3d"):
        record = json.loads((out / "evals" / f"{model}-s0.json").read_text())
        rows = {(r["mode"], r["frames"]): r for r in record["rows"]}
        assert set(rows) == {(m, f) for m in ("extrapolate", "ntk", "yarn") for f in (4, 8)}
        copied = {r["same_as"] for r in record["rows"] if "same_as" in r}
        assert copied == ({"extrapolate"} if record["modes_agree"] else set())
    assert json.loads((out / "evals" / "vivit_n_ape-s0.json").read_text())["modes_agree"] is True
    assert "## ntk" in (out / "results.md").read_text() and "## yarn" in (out / "results.md").read_text()


def test_rope_scaling_modes_change_a_video_models_logits_beyond_the_training_clip():
    kw = dict(embed_dim=64, depth=1, num_heads=1, patch_size=8, img_size=16, num_frames=4)
    rope, ape = (timm.create_model(n, **kw).eval() for n in ("vivit_n_rope3d", "vivit_n_ape"))
    with torch.no_grad():  # attention far from uniform, so that rotations show in the logits
        for model in (rope, ape):
            for name, p in model.named_parameters():
                if "qkv" in name:
                    p.mul_(30)
    modes = ["extrapolate", "ntk", "yarn"]
    longer, trained = torch.randn(2, 3, 8, 16, 16), torch.randn(2, 3, 4, 16, 16)
    assert not modes_agree(rope, longer, modes) and not modes_agree(rope, longer, modes[::2])
    assert modes_agree(rope, trained, modes)  # nothing is rescaled at the training clip
    assert modes_agree(ape, longer, modes) and rope.position_mode == "extrapolate"  # the mode is restored
    with pytest.raises(ValueError, match="no position mode 'interpolate'"):
        set_position_mode(rope, "interpolate")


def test_a_position_mode_a_model_lacks_fails_before_training(tmp_path, monkeypatch):
    _no_training(monkeypatch)
    with pytest.raises(BenchConfigError, match="vivit_n_ape' has no position mode 'interpolate'.*extrapolate, ntk"):
        run_benchmark(*load_bench(_video_bench(tmp_path, "extrapolate, interpolate")), log=lambda *a: None)


def test_bad_protocols_fail_before_training(tmp_path, monkeypatch):
    _no_training(monkeypatch)
    root = _fashion_folder(tmp_path / "fm")
    base = ["data.name=fashion-mnist", f"data.root={root}", "data.resolution=28", "bench.models=vit_n_ape"]
    with pytest.raises(BenchConfigError, match="render_canvas"):
        run_benchmark(*load_bench(None, [*base, "bench.resolutions=56", "bench.protocols=fov"]), log=print)
    with pytest.raises(BenchConfigError, match="go together"):
        run_benchmark(*load_bench(None, [*base, "bench.resolutions=56", "bench.frames=16"]), log=print)
    with pytest.raises(BenchConfigError, match="not a video"):
        run_benchmark(*load_bench(None, [*base, "bench.protocols=frames", "bench.frames=16"]), log=print)
    with pytest.raises(BenchConfigError, match="protocols.0. must be one of upsample, fov, frames"):
        run_benchmark(*load_bench(None, [*base, "bench.resolutions=56", "bench.protocols=zoom"]), log=print)


# ------------------------------------------------------------------------------------------------- pretrained


def _image_folder(root: Path, classes: int = 3, per_class: int = 4) -> Path:
    rng = np.random.default_rng(0)
    for c in range(classes):
        d = root / "val" / f"n0000{c}"
        d.mkdir(parents=True)
        for i in range(per_class):
            arr = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
            arr[..., c] = 255  # a class-coloured image, so a trained-looking model is not needed to read it
            Image.fromarray(arr).save(d / f"{i}.png")
    return root


def test_pretrained_mode_evaluates_saved_weights_without_training(tmp_path, monkeypatch):
    _no_training(monkeypatch)
    root = _image_folder(tmp_path / "imgs")
    kw = dict(embed_dim=32, depth=1, num_heads=2, img_size=32)
    ckpts = {}
    for name in ("vit_n_ape", "vit_n_rope2d_mixed"):
        model = timm.create_model(name, num_classes=3, **kw)
        ckpts[name] = tmp_path / f"{name}.pth"
        torch.save(model.state_dict(), ckpts[name])
    path = tmp_path / "pre.yaml"
    path.write_text(f"""
bench:
  models: [vit_n_ape, vit_n_rope2d_mixed]
  resolutions: [48, 64]
  checkpoints: {{vit_n_ape: {ckpts["vit_n_ape"]}, vit_n_rope2d_mixed: {ckpts["vit_n_rope2d_mixed"]}}}
  output_dir: {tmp_path / "out"}
model: {{kwargs: {{embed_dim: 32, depth: 1, num_heads: 2}}}}
data: {{name: imagefolder, root: {root}, resolution: 32, batch_size: 4}}
train: {{amp: none}}
""")
    assert extrapolate_main(["--pretrained", "-c", str(path)]) == 0
    out = tmp_path / "out"
    record = json.loads((out / "evals" / "vit_n_rope2d_mixed-s0.json").read_text())
    assert record["pretrained"] == str(ckpts["vit_n_rope2d_mixed"])
    assert {(r["mode"], r["height"]) for r in record["rows"]} == {
        (m, s) for m in ("extrapolate", "interpolate") for s in (32, 48, 64)
    }
    # the weights were loaded: the recorded loss is the saved model's own loss on the same folder at 64 px

    model = timm.create_model("vit_n_rope2d_mixed", num_classes=3, **kw)
    model.load_state_dict(torch.load(ckpts["vit_n_rope2d_mixed"]))
    cfg = load_bench(path, ["bench.pretrained=true"])[1]
    ds = build_eval_sets(cfg, [64])[64]  # the engine's preprocessing; what is checked here is the weights
    expect = evaluate_view(model.eval(), SizedView(ds, (64, 64)), "interpolate", 4, torch.device("cpu"), None)
    row = next(r for r in record["rows"] if (r["mode"], r["height"]) == ("interpolate", 64))
    assert row["loss"] == pytest.approx(expect["loss"], rel=1e-5)  # same fp32 ops on the same inputs
    assert "Pretrained weights" in (out / "results.md").read_text()


def test_tiny_image_text_benchmark_evaluates_more_visual_tokens(tmp_path):
    path = tmp_path / "mm.yaml"
    path.write_text(f"""
bench:
  models: [mm_n_mrope, mm_n_v2pe]
  seeds: [0]
  resolutions: [48]
  position_modes: [extrapolate]
  output_dir: {tmp_path / "out"}
  runs_dir: {tmp_path / "runs"}
model: {{kwargs: {{embed_dim: 32, depth: 1, num_heads: 2}}}}
data: {{name: image-text-shapes, resolution: 32, batch_size: 8, options: {{num_samples: 16}}}}
train: {{epochs: 1, amp: none, progress: false}}
""")
    out = run_benchmark(*load_bench(path), log=lambda *a: None)
    record = json.loads((out / "evals" / "mm_n_v2pe-s0.json").read_text())
    assert {(r["height"], r["images"]) for r in record["rows"]} == {(32, 16), (48, 16)}
    summary = json.loads((out / "summary.json").read_text())
    v2pe = next(c for c in summary["claims"] if c["claim"].startswith("V2PE"))
    assert {(c["a"], c["b"], c["height"]) for c in v2pe["comparisons"]} == {("mm_n_v2pe", "mm_n_mrope", 48)}
