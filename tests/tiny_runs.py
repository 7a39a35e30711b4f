"""The overrides of a training run of a few seconds, shared by the tests that train: a one-block 32-wide ViT at
16 px for 2 epochs, 1 thread, fp32, no progress bars. Each test file adds its own data settings."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch.distributed as dist

TINY_MODEL = ["model.name=vit_n_ape", "model.kwargs.depth=1", "model.kwargs.embed_dim=32", "model.kwargs.num_heads=2"]


def tiny_run(out: Path, data: list[str], *extra: str) -> list[str]:
    """TINY_MODEL trained on `data` (overrides of data.*) with run directories under `out`; `extra` comes last."""
    return [
        *TINY_MODEL,
        *data,
        "data.resolution=16",
        "train.epochs=2",
        "train.threads=1",
        "train.progress=false",
        "train.amp=none",
        f"train.output_dir={out}",
        *extra,
    ]


@contextlib.contextmanager
def group_of_one():
    """A process group of one (gloo) for a trainer given a larger DistContext: its refusals come before any
    collective that needs the other ranks."""
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if owns:
            dist.destroy_process_group()
