"""Run directories written before issue 46 (one checkpoint path for every strategy) still resume: tests/data/
run_dirs.tar.gz holds a plain and a sharded run killed after their first checkpoint (tests/data/make_run_dirs.py);
today's code restores each exactly from its files and trains it on to the end."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from visionpe.attention.backends import attn_backend
from visionpe.engine.checkpoint import load_weights
from visionpe.engine.config import load_config
from visionpe.engine.distributed import init_distributed, shutdown
from visionpe.engine.trainer import Trainer

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


def _saved(old: Path, scratch: Path) -> tuple[dict, dict]:
    """What the earlier code wrote at step 2, read from its files alone: ({"model.<k>", "ema.<k>",
    "optimizer.state.<param>.<key>": tensor}, the training state); a plain run's optimizer keys its parameters by
    index, a sharded one's by name."""
    ckpt = old / "checkpoints"
    if (ckpt / "e0000-b000002.dcp").is_dir():
        folder = ckpt / "e0000-b000002.dcp"
        dcp_to_torch_save(folder, scratch / "full.pt")  # outside the run directory it resumes
        full = torch.load(scratch / "full.pt")
        tensors = {f"{part}.{k}": v for part in ("model", "ema") for k, v in full[part].items()}
        return tensors | _moments(full["optimizer"]), torch.load(folder / "rank0.state.pt", weights_only=False)
    state = torch.load(ckpt / "e0000-b000002.state.pt", weights_only=False)
    tensors = {f"model.{k}": v for k, v in load_weights(ckpt / "e0000-b000002.safetensors")[0].items()}
    tensors |= {f"ema.{k}": v for k, v in load_weights(ckpt / "e0000-b000002-ema.safetensors")[0].items()}
    return tensors | _moments(state["optimizer"]), state


def _moments(optim: dict) -> dict:
    return {
        f"optimizer.state.{param}.{k}": v
        for param, moments in optim["state"].items()
        for k, v in moments.items()
        if isinstance(v, torch.Tensor)
    }


def _restored(trainer) -> dict:
    """The tensors a resumed trainer holds, keyed as `_saved`'s (full tensors of a sharded model)."""
    full = lambda v: v.full_tensor() if hasattr(v, "full_tensor") else v  # noqa: E731
    out = {f"model.{k}": full(v) for k, v in trainer.net.model.state_dict().items()}
    out |= {f"ema.{k}": full(v) for k, v in trainer.net.ema.module.state_dict().items()}
    sharded = trainer.cfg.train.strategy == "fsdp"
    model, optimizer = trainer.net.model, trainer.opt.optimizer
    optim = get_optimizer_state_dict(model, optimizer) if sharded else optimizer.state_dict()
    return out | {k: full(v) for k, v in _moments(optim).items()}


@pytest.mark.parametrize("name", list(ARGS))
def test_a_run_directory_written_before_one_checkpoint_path_resumes_exactly(tmp_path, name):
    """Today's code restores every tensor and counter the earlier code saved, bit for bit, then trains on to the end.
    (Compared with the files rather than with an uninterrupted run: the fixture's first two steps were computed on
    another CPU, whose float kernels may round differently.)"""
    with tarfile.open(DATA) as tar:
        tar.extractall(tmp_path / "old", filter="data")
    old = tmp_path / "old" / name
    saved, state = _saved(old, tmp_path)
    cfg = load_config(old / "config.yaml")
    cfg.train.output_dir, cfg.train.run_name = str(old.parent), old.name
    ctx = init_distributed(cfg.train.device)
    try:
        with attn_backend("sdpa"):
            trainer = Trainer(cfg, ctx, resume=True)
            got, now = _restored(trainer), trainer.parts.rank_state(ctx)
            assert got.keys() == saved.keys()
            assert [k for k, v in saved.items() if not torch.equal(got[k], v)] == []
            for key in ("epoch", "batch", "global_step", "scheduler", "sched_key", "loss_tally"):
                assert now[key] == state[key], key
            assert all(a >= b for a, b in zip(now["spent"], state["spent"]))  # the earlier attempt's cost, carried on
            assert torch.equal(now["rng"]["torch"], state["rng"]["torch"])
            assert torch.equal(torch.as_tensor(now["rng"]["numpy"]), torch.as_tensor(state["rng"]["numpy"]))
            for key in ("python", "numpy_pos", "numpy_gauss"):
                assert now["rng"][key] == state["rng"][key], key
            trainer.run()
    finally:
        shutdown(ctx)
    pointer = json.loads((old / "checkpoint.json").read_text())
    assert pointer["global_step"] == 8 and pointer["epoch"] == 2
