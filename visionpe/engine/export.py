"""One safetensors file from a run's checkpoint, sharded (train.strategy=fsdp) or not:

    visionpe-export --checkpoint runs/imagenet_vit_l_fsdp-vit_l_rope2d --out vit_l.safetensors [--ema]

The file carries the same metadata as a DDP run's weights (model name, config, classes), so `visionpe-eval
--checkpoint vit_l.safetensors`, `load_checkpoint(...)` and timm's `pretrained_cfg_overlay=dict(file=...)` read it.
It is gathered in one process from the shards, whatever world size wrote them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .checkpoint import CheckpointError, find_checkpoint, load_weights, save_weights
from .destinations import check_destination, writing
from .sharded_checkpoint import is_sharded_run, load_sharded_weights

__all__ = ["export_weights", "export_main"]


def export_weights(checkpoint: str | os.PathLike, out: str | os.PathLike, ema: bool = False) -> Path:
    """Write the weights (or EMA weights) of `checkpoint` (a run directory or a `.dcp` folder) to `out` (checked
    before anything is read, written atomically)."""
    out = Path(out)
    if out.suffix != ".safetensors":
        raise CheckpointError(f"--out must name a .safetensors file, got {out}")
    check_destination(out, "--out")
    if is_sharded_run(checkpoint):
        state, meta = load_sharded_weights(checkpoint, ema)
    else:
        ref = find_checkpoint(checkpoint)
        if ref is None:
            raise CheckpointError(f"{checkpoint} has no checkpoint yet (no {checkpoint}/checkpoint.json)")
        if ema and ref.ema is None:
            raise CheckpointError(f"{checkpoint} has no EMA weights (train with train.ema=true)")
        state, meta = load_weights(ref.ema if ema else ref.weights)
    meta.pop("world_size", None)
    if ema:
        meta["ema"] = "true"
    else:
        meta.pop("ema", None)
    with writing(out, "--out"):
        save_weights(out, state, meta)
    return out


def export_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write one safetensors file from a run's latest checkpoint (sharded fsdp checkpoints included)."
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        type=os.path.expanduser,
        help="a run directory or a sharded checkpoint folder (.dcp)",
    )
    parser.add_argument("--out", required=True, type=os.path.expanduser, help="the .safetensors file to write")
    parser.add_argument("--ema", action="store_true", help="export the EMA weights")
    args = parser.parse_args(argv)
    from .cli import USER_ERRORS, user_error

    try:
        path = export_weights(args.checkpoint, args.out, args.ema)
    except (*USER_ERRORS, KeyError) as e:
        return user_error(e)
    print(f"wrote {path}")
    return 0
