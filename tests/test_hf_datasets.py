"""Hugging Face datasets through timm's readers, for real: `hfds/` (random access) and `hfids/` (streamed) on a local
image folder that the `datasets` package loads offline. Training, evaluation and the image counts end to end."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_runs import tiny_run

from visionpe.attention.backends import attn_backend
from visionpe.engine import evaluate_checkpoint, train

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("datasets") is None, reason="datasets is not installed (pip install visionpe[hf])"
)
CLASSES = ("ant", "bee", "cow")
NUM_TRAIN, NUM_VAL = 8, 5  # images per class


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """An image folder `datasets` reads as the "imagefolder" builder: <split>/<class>/<image>.png."""
    root = tmp_path_factory.mktemp("hf_images")
    rng = np.random.default_rng(0)
    for split, n in (("train", NUM_TRAIN), ("validation", NUM_VAL)):
        for c, name in enumerate(CLASSES):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (18, 22, 3), dtype=np.uint8)
                pixels[..., c] = 255  # each class has one saturated channel: learnable in a few steps
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
    return root


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _data(prefix: str, folder: Path, cache: Path) -> list[str]:
    return [f"data.name={prefix}/{folder}", f"data.root={cache}", "data.val_split=validation", "data.batch_size=6"]


def test_hfds_trains_and_evaluates_and_hfids_streams_the_same_images(folder, tmp_path):
    cache = tmp_path / "cache"
    with attn_backend("sdpa"):
        run = train(None, tiny_run(tmp_path, _data("hfds", folder, cache), "train.run_name=run", "eval.resolutions=16"))
    pointer = json.loads((run / "checkpoint.json").read_text())
    assert pointer["finished"] and pointer["global_step"] == 2 * (3 * NUM_TRAIN // 6)  # drop_last: 4 steps an epoch
    (final,) = json.loads((run / "results.json").read_text())
    assert final["images"] == 3 * NUM_VAL
    # the same validation split streamed (hfids/), in other batches: the same 15 images, so the same count of right
    # answers, and the mean loss up to the summation order (rel 1e-6, ~8 fp32 eps over 15 terms)
    with attn_backend("sdpa"):
        (streamed,) = evaluate_checkpoint(
            run, [16], overrides=[f"data.name=hfids/{folder}", f"data.root={cache}", "data.eval_batch_size=4"]
        )
    assert streamed["images"] == 3 * NUM_VAL and streamed["top1"] == final["top1"]
    assert streamed["loss"] == pytest.approx(final["loss"], rel=1e-6)


def test_hfids_training_needs_the_split_size_when_the_dataset_does_not_record_it(folder, tmp_path):
    # a local folder streamed as it is records no split sizes: one clear line; with timm's `download` option the
    # `datasets` builder prepares it first (locally, no network) and records sizes and class names
    data = _data("hfids", folder, tmp_path / "cache")
    with pytest.raises(ValueError, match=r"set data.options.train_num_samples=") as e:
        train(None, tiny_run(tmp_path, [*data, "data.options.num_classes=3"], "eval.resolutions=16"))
    assert "\n" not in str(e.value)
    with attn_backend("sdpa"):
        run = train(None, tiny_run(tmp_path, [*data, "data.options.download=true"], "eval.resolutions=16"))
    pointer = json.loads((run / "checkpoint.json").read_text())
    assert pointer["finished"] and pointer["global_step"] == 2 * (3 * NUM_TRAIN // 6)
    (final,) = json.loads((run / "results.json").read_text())
    assert final["images"] == 3 * NUM_VAL
