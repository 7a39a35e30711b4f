"""visionpe ViTs against timm's equivalents, same weights, same run: inference and training images/s as ratios.

python -m visionpe.bench.vit_speed [--size 224] [--batch 8] [--rounds 3] [--steps 2]
"""

from __future__ import annotations

import argparse
import os

import timm
import torch

import visionpe  # noqa: F401
from visionpe.models.vit_weights import checkpoint_filter_fn

from .timing import interleaved_throughput

PAIRS = [  # (ours, kwargs, timm's model)
    ("vit_s_ape", {}, "vit_small_patch16_224"),
    ("vit_s_rope2d_mixed", dict(init_values=1e-5), "vit_small_patch16_rope_mixed_224"),
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args(argv)
    print(
        f"# ViT speed at {args.size}px, batch {args.batch}, {torch.get_num_threads()} threads, {os.cpu_count()} cores"
    )
    print("| ours | timm | mode | ours img/s | timm img/s | ratio |")
    print("|---|---|---|---:|---:|---:|")
    for ours, kwargs, ref_name in PAIRS:
        ref = timm.create_model(ref_name)
        model = timm.create_model(ours, **kwargs)
        model.load_state_dict(checkpoint_filter_fn(ref.state_dict(), model))
        for train in (False, True):
            ips = interleaved_throughput(
                {"ours": model, "timm": ref},
                lambda: torch.randn(args.batch, 3, args.size, args.size),
                train=train,
                rounds=args.rounds,
                steps=args.steps,
            )
            mode = "train" if train else "infer"
            ratio = ips["ours"] / ips["timm"]
            print(f"| {ours} | {ref_name} | {mode} | {ips['ours']:.1f} | {ips['timm']:.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
