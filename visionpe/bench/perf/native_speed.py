"""Speed of native-aspect batches: packed vs padded vs square-resized at an equal token budget (issue 31, item 5).

    visionpe-bench native-speed --models vit_s_ape,vit_s_rope2d_mixed,vit_s_irpe --threads 1,2

One set of images with aspect ratios log-uniform in 1:3 to 3:1, each at a budget drawn from `--budgets` patches
(its own resolution), feeds three arms with the same token slots per batch (`--rows` x the largest budget):
square (every image resized to the largest square grid, a plain [B, C, H, W] batch), padded (one image per row,
padded to the largest budget) and packed (rows of twice the largest budget, online first-fit decreasing). Each arm
times forward + backward on the same model; the table gives images/s, the padding fraction and the ratios to
padded, all from the same run. Random pixels: only speed is measured.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from ...data.native.collate import collate_native
from ...data.native.pack import OnlinePacker
from ...data.native.resize import budget_size, patchify
from ...data.native.sampler import NativeKey

__all__ = ["image_sizes", "arm_batches", "time_arm", "main"]


def image_sizes(n: int, patch: int, budgets: list[int], max_aspect: float, seed: int) -> list[tuple[int, int]]:
    """(H, W) px of n images: aspect log-uniform in [1 / max_aspect, max_aspect], a budget drawn per image."""
    g = torch.Generator().manual_seed(seed)
    log_ar = (2 * torch.rand(n, generator=g, dtype=torch.float64) - 1) * math.log(max_aspect)
    picks = torch.randint(len(budgets), (n,), generator=g).tolist()
    return [
        budget_size((round(448 / math.sqrt(a)), round(448 * math.sqrt(a))), patch, budgets[b])
        for a, b in zip(log_ar.exp().tolist(), picks)
    ]


def _collate(rows: list[list[tuple[int, int]]], row_len: int, patch: int, chans: int, packed: bool):
    items = []
    for r, row in enumerate(rows):
        for size in row:
            x = torch.randn(chans, *size)
            items.append((patchify(x, patch), 0, NativeKey(0, size, None, r, row_len, len(rows), packed)))
    return collate_native(items)


def arm_batches(arm: str, sizes, patch: int, rows: int, budget: int, chans: int = 3, steps: int = 4) -> list:
    """`steps` batches of one arm (inputs, images, padding fraction), all with rows x budget token slots."""
    out, it = [], iter(sizes)
    if arm == "square":
        side = math.isqrt(budget) * patch
        for _ in range(steps):
            x = torch.randn(rows * budget // (side // patch) ** 2, chans, side, side)
            out.append((x, x.shape[0], 1 - x.shape[0] * (side // patch) ** 2 / (rows * budget)))
        return out
    if arm == "padded":
        for _ in range(steps):
            b = _collate([[next(it)] for _ in range(rows)], budget, patch, chans, False)
            out.append((b.inputs, b.images, 1 - b.tokens / b.slots))
        return out
    packer = OnlinePacker(2 * budget, rows // 2, 4 * rows)
    while len(out) < steps:
        size = next(it)
        for batch in packer.push(size, (size[0] // patch) * (size[1] // patch)):
            b = _collate(batch, 2 * budget, patch, chans, True)
            out.append((b.inputs, b.images, 1 - b.tokens / b.slots))
    return out


def time_arm(model: torch.nn.Module, batches: list, warmup: int = 1) -> tuple[float, float]:
    """(images/s of forward + backward, mean padding) over the batches after `warmup`."""
    for inputs, _, _ in batches[:warmup]:
        model(inputs).sum().backward()
    images, t0 = 0, time.perf_counter()
    for inputs, n, _ in batches[warmup:]:
        model(inputs).sum().backward()
        images += n
    pad = sum(p for _, _, p in batches[warmup:]) / max(len(batches) - warmup, 1)
    return images / (time.perf_counter() - t0), pad


def measure(argv: list[str] | None = None) -> list[dict]:
    """The table of the command line `argv` (one row per model, threads and arm), printed as it is measured."""
    import timm

    import visionpe  # noqa: F401  (registers the models)

    p = argparse.ArgumentParser(prog="visionpe-bench native-speed", description=__doc__.splitlines()[0])
    p.add_argument("--models", default="vit_s_ape,vit_s_rope2d_mixed,vit_s_irpe")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--budgets", default="64,100,144,196", help="per-image token budgets (patches)")
    p.add_argument("--rows", type=int, default=8, help="rows of the largest budget per batch")
    p.add_argument("--steps", type=int, default=4, help="batches per arm, the first one warmup")
    p.add_argument("--depth", type=int, default=0, help="blocks (0: the model's)")
    a = p.parse_args(argv)
    budgets = [int(b) for b in a.budgets.split(",")]
    table = []
    for name in a.models.split(","):
        kwargs = {"depth": a.depth} if a.depth else {}
        model = timm.create_model(name, num_classes=10, **kwargs)
        patch = model.patch_embed.patch_size[0]
        sizes = image_sizes(8 * a.rows * a.steps, patch, budgets, 3.0, seed=0)  # more than any arm takes
        arms = {
            arm: arm_batches(arm, sizes, patch, a.rows, max(budgets), steps=a.steps)
            for arm in ("square", "padded", "packed")
        }
        for threads in [int(t) for t in a.threads.split(",")]:
            torch.set_num_threads(threads)
            res = {arm: time_arm(model, batches) for arm, batches in arms.items()}
            for arm, (ips, pad) in res.items():
                row = dict(
                    model=name, threads=threads, arm=arm, img_per_s=ips, padding=pad, vs_padded=ips / res["padded"][0]
                )
                table.append(row)
                print(
                    f"{name:22} {threads:>2} {arm:7} {ips:9.2f} img/s  padding {pad:6.1%}  "
                    f"x{row['vs_padded']:.2f} vs padded",
                    flush=True,
                )
    return table


def main(argv: list[str] | None = None) -> int:
    measure(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
