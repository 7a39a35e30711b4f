"""Run directories written before issue 46 (one checkpoint path for every strategy) still resume: tests/data/
run_dirs.tar.gz holds a plain and a sharded run killed after their first checkpoint (tests/data/make_run_dirs.py);
resumed by today's code, each reaches the weights of an uninterrupted run."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import torch

from visionpe.attention.backends import attn_backend
from visionpe.engine import train
from visionpe.engine.checkpoint import find_checkpoint, load_weights
from visionpe.engine.export import export_main

DATA = Path(__file__).with_name("data") / "run_dirs.tar.gz"
_COMMON = [
    "model.name=vit_n_ape",
    "model.kwargs.depth=1",
    "model.kwargs.embed_dim=16",
    "model.kwargs.num_heads=2",
    "model.kwargs.drop_path_rate=0.1",
    "data.options.num_train=64",
    "data.options.num_val=16",
    "data.batch_size=16",
    "data.resolution=16",
    "eval.resolutions=16",
    "train.epochs=2",
    "train.threads=1",
    "train.progress=false",
    "train.amp=none",
    "train.ema=true",
    "train.ckpt_every_steps=2",
]
ARGS = {"plain": [*_COMMON, "aug.mixup=0.4"], "sharded": [*_COMMON, "train.strategy=fsdp"]}


def _final_weights(run_dir: Path, tmp_path: Path, ema: bool) -> dict[str, torch.Tensor]:
    if "sharded" not in json.loads((run_dir / "checkpoint.json").read_text()):
        ref = find_checkpoint(run_dir)
        return load_weights(ref.ema if ema else ref.weights)[0]
    out = tmp_path / f"{run_dir.name}-{ema}.safetensors"
    assert export_main(["--checkpoint", str(run_dir), "--out", str(out), *(["--ema"] if ema else [])]) == 0
    return load_weights(out)[0]


@pytest.mark.parametrize("name", list(ARGS))
def test_a_run_directory_written_before_one_checkpoint_path_resumes_exactly(tmp_path, name):
    with tarfile.open(DATA) as tar:
        tar.extractall(tmp_path / "old", filter="data")
    old = tmp_path / "old" / name
    with attn_backend("sdpa"):
        train(None, resume=old)
        want = train(None, [*ARGS[name], f"train.output_dir={tmp_path / 'new'}", f"train.run_name={name}"])
    for ema in (False, True):
        got, expect = _final_weights(old, tmp_path, ema), _final_weights(want, tmp_path, ema)
        assert got.keys() == expect.keys() and all(torch.equal(got[k], v) for k, v in expect.items())
