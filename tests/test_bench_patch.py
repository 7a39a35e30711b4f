"""The patch protocol: the training resolution's pixels at other patch sizes (more or fewer tokens), beside upsample;
its points are the model's own patch and bench.patch_sizes, each evaluated with the stem's kernel PI-resized."""

from __future__ import annotations

import copy
import json

import pytest
import timm
import torch

import visionpe  # noqa: F401
from visionpe.bench.extrapolate import BenchConfigError, load_bench, run_benchmark
from visionpe.bench.protocols import Point, evaluate_point, point_label
from visionpe.recipes import list_recipes


def _bench_file(tmp_path, models="vit_n_ape, vit_n_rope2d", extra="  patch_sizes: [2, 8]", kwargs=None) -> str:
    kwargs = kwargs or "{embed_dim: 32, depth: 1, num_heads: 2}"
    path = tmp_path / "patch.yaml"
    path.write_text(f"""
bench:
  models: [{models}]
  seeds: [0]
  resolutions: [24]
  protocols: [upsample, patch]
  position_modes: [extrapolate]
  output_dir: {tmp_path / "out"}
  runs_dir: {tmp_path / "runs"}
{extra}
model: {{kwargs: {kwargs}}}
data: {{name: synthetic-shapes, resolution: 16, batch_size: 32, options: {{num_train: 64, num_val: 24}}}}
train: {{epochs: 1, amp: none, progress: false}}
""")
    return str(path)


def test_a_tiny_benchmark_evaluates_each_patch_size_beside_upsample(tmp_path):
    out = run_benchmark(*load_bench(_bench_file(tmp_path)), log=lambda *a: None)
    record = json.loads((out / "evals" / "vit_n_rope2d-s0.json").read_text())
    rows = {(r["protocol"], r["height"], r.get("patch", 0)): r for r in record["rows"]}
    assert set(rows) == {("upsample", 16, 0), ("upsample", 24, 0), ("patch", 16, 0), ("patch", 16, 2), ("patch", 16, 8)}
    assert rows[("patch", 16, 0)]["same_as"] == "upsample"  # the own patch shows the training point's inputs
    assert all(rows[k]["images"] == 24 and 0 <= rows[k]["top1"] <= 100 for k in rows)
    results = (out / "results.md").read_text()
    assert "patch 2" in results and "patch 8" in results


def test_a_patch_point_is_the_model_resized_to_that_patch():
    """The point's accuracy and loss are the resized model's (set_input_size(patch_size=)) on the same pixels."""
    torch.manual_seed(0)
    model = timm.create_model("vit_n_rope2d", embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    resized = copy.deepcopy(model)
    resized.set_input_size(patch_size=8)
    data = [(torch.randn(3, 16, 16), i % 4) for i in range(8)]

    class View:
        def loader(self, batch_size, workers=0):
            from visionpe.data.multires import collate_to_resolution

            items = [(x, y, (16, 16), ()) for x, y in data]
            return torch.utils.data.DataLoader(items, batch_size=batch_size, collate_fn=collate_to_resolution)

    point = Point("patch", 16, 16, 0, 0, 8)
    got = evaluate_point(model, View(), point, "extrapolate", 4, torch.device("cpu"), None)
    want = evaluate_point(resized, View(), Point("patch", 16, 16), "extrapolate", 4, torch.device("cpu"), None)
    assert got == want and point_label(point) == "patch 8"
    assert model.patch_embed.patch_size == (4, 4)  # restored after the point


@pytest.mark.parametrize(
    "models, extra, match",
    [
        ("vit_n_ape", "", "the patch protocol and bench.patch_sizes go together"),
        ("vit_n_ape", "  patch_sizes: [2, 32]", "patches larger than the 16 px training images"),
        ("cvt_n", "  patch_sizes: [2]", "cannot evaluate 'cvt_n' at another patch size: its first embedding"),
    ],
)
def test_a_patch_benchmark_that_cannot_run_fails_before_training(tmp_path, models, extra, match):
    with pytest.raises(BenchConfigError, match=match):
        kwargs = "{depths: [1, 1, 1]}" if models.startswith("cvt") else None
        run_benchmark(*load_bench(_bench_file(tmp_path, models, extra, kwargs)), dry_run=True, log=lambda *a: None)


def test_the_clipart_benchmark_evaluates_patch_sizes_2_and_8_beside_its_4():
    assert "clipart" in list_recipes("bench")
    bench, cfg = load_bench("clipart")
    assert "patch" in bench.protocols and bench.patch_sizes == [2, 8]
    assert cfg.model.kwargs == {"embed_dim": 128, "num_heads": 4} and cfg.train.epochs == 30  # the recipe as recorded
