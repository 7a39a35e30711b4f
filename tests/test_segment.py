"""clipart-scenes (pixel labels from the drawings' alpha, upsample and field of view) and `visionpe-bench segment`
(mIoU, records, resume), on a small SVG tree written here (Debian's openclipart-svg is not needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

try:
    import cairosvg  # noqa: F401
except (ImportError, OSError):  # OSError: the cairo library is missing
    pytestmark = pytest.mark.skip(reason="clip art renders with cairosvg and the cairo library")

from visionpe.bench.leaderboard import benchmarks
from visionpe.bench.segmentation import segment
from visionpe.bench.settings import BenchConfigError, load_bench
from visionpe.data import build_dataset
from visionpe.engine.setup import build_split

SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="100" height="100" viewBox="0 0 100 100">{}</svg>'


def make_tree(root: Path) -> Path:
    """squares: 6 drawings filling their whole canvas; discs: 6 circles in the middle (corners transparent)."""
    for i in range(6):
        square = f'<rect width="100" height="100" fill="#{20 * i:02x}4080"/>'
        disc = f'<circle cx="50" cy="50" r="{30 + i}" fill="#80{20 * i:02x}40"/>'
        for rel, body in ((f"squares/s{i}.svg", square), (f"discs/d{i}.svg", disc)):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(SVG.format(body))
    return root


def scenes(tmp_path: Path, split: str = "val", resolution: int = 16, **options):
    options = {"min_drawings": 2, "val_percent": 50, "cache_dir": str(tmp_path / "cache"), **options}
    return build_dataset("clipart-scenes", split, resolution, str(make_tree(tmp_path / "svg")), options)


def test_labels_come_from_each_drawings_alpha(tmp_path):
    ds = scenes(tmp_path, objects=[1, 1], scale=[0.5, 0.5])
    assert ds.classes == ("background", "discs", "squares") and ds.num_classes == 3
    for i in range(len(ds)):
        ((drawing, _, x, y),) = ds.layout(i)
        image, labels = ds.render(i, 32)
        assert image.shape == (3, 32, 32) and labels.shape == (32, 32) and labels.dtype == torch.int64
        top, left = round(y * 16), round(x * 16)  # a 16 px object on a 32 px canvas
        cls = ds.drawings.labels[drawing] + 1
        assert labels[top + 8, left + 8] == cls  # the middle of the drawing
        assert set(labels.unique().tolist()) == {0, cls}
        inside = labels[top : top + 16, left : left + 16]
        if ds.classes[cls] == "squares":
            assert (inside == cls).all() and (labels == cls).sum() == 256
        else:
            assert inside[0, 0] == 0 and inside[-1, -1] == 0  # a disc's transparent corners are background
    train = scenes(tmp_path, "train")
    assert not set(ds.drawings.digests) & set(train.drawings.digests)  # val scenes hold val drawings only


def test_the_upsampled_scene_is_the_same_scene_at_more_pixels(tmp_path):
    ds = scenes(tmp_path)
    for i in range(4):
        base, up = ds.render(i, 16)[1], ds.render(i, 48)[1]
        resized = F.interpolate(base[None, None].float(), size=(48, 48), mode="nearest")[0, 0].long()
        assert (resized == up).float().mean() > 0.9  # only object borders may differ
        assert torch.equal(ds.render(i, 16)[0], ds.render(i, 16)[0])  # evaluation scenes are fixed
        assert torch.equal(ds.render_canvas(i, (16, 16))[1], base)  # the base canvas is the same scene


def test_field_of_view_keeps_the_objects_pixel_size_and_adds_objects(tmp_path):
    ds = scenes(tmp_path, scale=[0.5, 0.5])
    sizes, real = [], ds.drawings.drawing
    ds.drawings.drawing = lambda i, d, alpha=False: sizes.append(d) or real(i, d, alpha)
    for i in range(3):
        image, labels = ds.render_canvas(i, (48, 64))
        assert image.shape == (3, 48, 64) and labels.shape == (48, 64)
        assert len(ds.layout(i, 48 * 64 / 16**2)) == 12 * len(ds.layout(i))
    assert set(sizes) == {8}  # half the 16 px training canvas, whatever the canvas
    sizes.clear()
    ds.render(0, 64)
    assert set(sizes) == {32}  # upsample: half of the 64 px canvas
    with pytest.raises(ValueError, match="cannot hold"):
        ds.render_canvas(0, (4, 64))


def test_miou_and_pixel_accuracy_by_hand():
    target = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 2]])
    pred = torch.tensor([[0, 1, 1, 1], [0, 0, 2, 2]])
    found = segment.scores(segment.confusion(pred, target, 4))
    # background: 3 hits, union 4 -> 75; class 1: 2 hits, truth 3, pred 3 -> union 4 -> 50; class 2: 1 / 2 -> 50
    assert found["iou"] == [75.0, 50.0, 50.0, None]  # class 3 is absent: left out of the mean
    assert found["miou"] == pytest.approx(175 / 3) and found["pixel_acc"] == pytest.approx(75.0)


def bench_file(tmp_path: Path) -> Path:
    root = make_tree(tmp_path / "svg")
    path = tmp_path / "seg.yaml"
    path.write_text(f"""
bench:
  models: [vit_n_nope, vit_n_rope2d]
  seeds: [0, 1]
  resolutions: [24]
  protocols: [upsample, fov]
  eval_batch_size: 4
  output_dir: {tmp_path / "results"}/{{name}}
  runs_dir: {tmp_path / "runs"}
model:
  kwargs: {{depth: 1, embed_dim: 32, num_heads: 2}}
data:
  name: clipart-scenes
  root: {root}
  resolution: 16
  batch_size: 4
  options: {{min_drawings: 2, val_percent: 50, num_train: 8, num_val: 4, cache_dir: {tmp_path / "cache"}}}
train:
  epochs: 1
  amp: none
  progress: false
""")
    return path


def test_a_tiny_segment_run_writes_records_and_resumes_without_training(tmp_path, monkeypatch):
    path = bench_file(tmp_path)
    out = segment.run_segment(*segment.load_segment(path), log=lambda *a: None)
    record = json.loads((out / "evals" / "vit_n_rope2d-s1.json").read_text())
    points = {(r["protocol"], r["mode"], r["height"]) for r in record["rows"]}
    assert points == {(p, m, s) for p in ("upsample", "fov") for m in ("extrapolate", "interpolate") for s in (16, 24)}
    assert all(0 <= r["miou"] <= 100 and r["images"] == 4 for r in record["rows"] if "same_as" not in r)
    assert record["classes"] == ["background", "discs", "squares"] and record["train_cpu_seconds"] >= 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "segmentation" and summary["stats"]["vit_n_nope"]["extrapolate|16"]["miou"]["n"] == 2
    claims = {c["claim"] for c in summary["comparisons"]}
    assert claims == {"vit_n_rope2d > vit_n_nope"}
    assert all(c["verdict"] in ("holds", "does not hold", "within noise") for c in summary["comparisons"])
    assert "## Each PE against NoPE (mIoU)" in (out / "results.md").read_text()
    assert out == tmp_path / "results" / "seg"
    ((name, _, ranked_cells),) = benchmarks(out.parent)  # the leaderboard ranks the runs by mIoU beyond 16 px
    cell = ranked_cells[("upsample", "extrapolate", "vit_n")]["vit_n_rope2d"]
    here = ("upsample", "extrapolate", 24)
    (at24,) = [r["miou"] for r in record["rows"] if (r["protocol"], r["mode"], r["height"]) == here]
    assert name == "seg" and cell["seeds"][1] == pytest.approx(at24) and len(cell["seeds"]) == 2

    def no_training(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(segment, "_train", no_training)
    (out / "evals" / "vit_n_nope-s0.json").unlink()  # the record lost: the finished run is only evaluated
    segment.run_segment(*segment.load_segment(path), log=lambda *a: None)
    again = json.loads((out / "evals" / "vit_n_nope-s0.json").read_text())
    assert again["rows"] and again["train_seconds"] is not None
    assert json.loads((out / "evals" / "vit_n_rope2d-s1.json").read_text()) == record  # done: untouched


def test_classifier_commands_refuse_a_segmentation_set_and_back(tmp_path):
    bench, cfg = load_bench(bench_file(tmp_path))
    with pytest.raises(ValueError, match="labels pixels.*visionpe-bench segment"):
        build_split(cfg, "train", 16, True)  # visionpe-train and visionpe-bench extrapolate build through here
    with pytest.raises(BenchConfigError, match="trains on segmentation sets"):
        segment.load_segment(bench_file(tmp_path), ["data.name=synthetic-shapes", "data.options={}"])
    with pytest.raises(BenchConfigError, match="upsampled and by field of view"):
        load_bench(bench_file(tmp_path), ["bench.protocols=upsample,native", "bench.tokens=16"])
