"""Progress bars over the whole run and evaluation, optional TensorBoard scalars, top-k counting through timm."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from test_train_eval import run_train, tiny
from torch import nn
from tqdm import tqdm

import visionpe.engine.evaluate as evaluate_mod
import visionpe.engine.trainer as trainer_mod
from visionpe.data import Batch
from visionpe.engine import ConfigError, evaluate_loader
from visionpe.engine.tensorboard import TENSORBOARD_DIR


def _recording_bars(monkeypatch, module) -> list:
    """Replace `module.tqdm` by a bar that always draws (to a string buffer) and remembers itself."""
    import io

    bars = []

    class Recorder(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.update(disable=kwargs.get("disable") is True, file=io.StringIO())
            super().__init__(*args, **kwargs)
            self.made_total, self.made_initial = self.total, self.n
            bars.append(self)

    monkeypatch.setattr(module, "tqdm", Recorder)
    return bars


def test_one_bar_covers_the_whole_run_and_one_each_evaluation(tmp_path, monkeypatch):
    train_bars = _recording_bars(monkeypatch, trainer_mod)
    eval_bars = _recording_bars(monkeypatch, evaluate_mod)
    # 64 items / batch 16 = 4 steps per epoch, 3 epochs; evaluation of 32 items in batches of 8 at 2 resolutions
    run_train(tiny(tmp_path, "train.epochs=3", "train.progress=true", "data.eval_batch_size=8"))
    assert len(train_bars) == 1
    bar = train_bars[0]
    assert (bar.made_total, bar.made_initial, bar.n) == (12, 0, 12)  # total and final count: every step of the run
    assert len(eval_bars) == 3 * 2  # epochs x resolutions
    assert all(b.made_total == 4 and b.n == 4 for b in eval_bars)


def test_progress_false_draws_nothing(tmp_path, monkeypatch):
    bars = _recording_bars(monkeypatch, trainer_mod) + _recording_bars(monkeypatch, evaluate_mod)
    run_train(tiny(tmp_path, "train.epochs=1"))  # tiny() sets train.progress=false
    assert all(b.disable for b in bars)


def test_tensorboard_holds_the_metrics_lines(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = run_train(tiny(tmp_path, "train.log_tensorboard=true", "train.log_every=3", "train.ema=true"))
    acc = EventAccumulator(str(run / TENSORBOARD_DIR))
    acc.Reload()
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]

    def logged(tag: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in acc.Scalars(tag)]

    def f32(x: float) -> float:  # TensorBoard stores scalars as float32
        return float(torch.tensor(x, dtype=torch.float32))

    train = [ln for ln in lines if ln["kind"] == "train"]
    assert len(train) == 2 * 2  # steps 3 and 4 of each epoch (log_every=3, and the epoch's last step)
    for key in ("loss", "lr", "img_per_s"):
        assert logged(f"train/{key}") == [(ln["global_step"], f32(ln[key])) for ln in train]
    for weights, group in (("model", "val"), ("ema", "val_ema")):
        for res in (16, 24):
            rows = [ln for ln in lines if ln["kind"] == "eval" and ln["weights"] == weights and ln["resolution"] == res]
            assert len(rows) == 2  # one per epoch
            for key in ("top1", "top5", "loss"):
                assert logged(f"{group}/{key}@{res}") == [(r["global_step"], f32(r[key])) for r in rows]


def test_missing_tensorboard_is_a_one_line_error_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard -> ImportError
    with pytest.raises(ConfigError, match=r"pip install tensorboard") as e:
        run_train(tiny(tmp_path, "train.log_tensorboard=true"))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


class _Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize("classes", [3, 10])
def test_top_k_counts_through_timm_match_a_direct_count(classes):
    g = torch.Generator().manual_seed(0)
    # coarse logits (integers 0..3): many ties, where an ordering difference between two top-k counts would show
    batches = [torch.randint(0, 4, (n, classes), generator=g).float() for n in (7, 16, 1)]
    targets = [torch.randint(0, classes, (len(b),), generator=g) for b in batches]
    loader = [Batch(b, t, 16, ()) for b, t in zip(batches, targets)]
    out = evaluate_loader(_Identity(), loader)
    k = min(5, classes)
    hits = [(b.topk(k, dim=1).indices == t[:, None]) for b, t in zip(batches, targets)]
    n = sum(len(t) for t in targets)
    assert out["images"] == n == 24
    assert out["top1"] == 100 * sum(int(h[:, 0].sum()) for h in hits) / n  # exact: the same counts, same division
    assert out["top5"] == 100 * sum(int(h.any(1).sum()) for h in hits) / n
    if classes <= 5:
        assert out["top5"] == 100.0  # every class is within the top k


def test_evaluating_no_images_is_an_error_not_zero_scores():
    # an empty loader (an empty split, or a stream of empty shards) must not give top-1 0.0 over 0 images as a result
    with pytest.raises(ValueError, match="val at 16 px gave no images to evaluate") as e:
        evaluate_loader(_Identity(), [], where="val at 16 px")
    assert "\n" not in str(e.value)
