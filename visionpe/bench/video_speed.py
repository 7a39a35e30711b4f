"""Video ViT speed and memory per PE: tokens/s as ratios against the space-time APE in the same run, and how time and
memory grow with clip length.

1. Inference tokens/s of `{family}_{pe}` at 8 x 112 x 112 and 16 x 224 x 224 (interleaved runs, median), as ratios
   against `{family}_ape`.
2. Clip-length sweep at 112 x 112: seconds per clip (inference), the activation memory a training step keeps for
   backward (bytes of the tensors autograd saves; exact, no allocator noise) and the peak resident memory of one
   inference step (a fresh process per point), with the growth exponent k of time ~ T^k.

python -m visionpe.bench.video_speed [--family vivit_s] [--pes ape rope3d vrope] [--rounds 3] [--lengths 4 8 16 32]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import time

import timm
import torch

import visionpe  # noqa: F401  (registers the models)

from .timing import interleaved_throughput

__all__ = ["tokens_per_second", "seconds_per_clip", "saved_activation_mb", "peak_rss_mb", "growth_exponent", "main"]

CLIPS = [(8, 112), (16, 224)]  # (frames, side)


def _tokens(model, frames: int, side: int) -> int:
    t, h, w = model.patch_embed.token_grid(frames, side, side)
    return t * h * w


def tokens_per_second(family: str, pes: list[str], frames: int, side: int, rounds: int, batch: int = 1):
    """Median inference tokens/s of each `{family}_{pe}` on clips [batch, 3, frames, side, side], interleaved."""
    models = {pe: timm.create_model(f"{family}_{pe}").eval() for pe in pes}
    clips_per_s = interleaved_throughput(
        models, lambda: torch.randn(batch, 3, frames, side, side), train=False, rounds=rounds, steps=1
    )
    n = _tokens(next(iter(models.values())), frames, side)
    return {pe: v * n for pe, v in clips_per_s.items()}, n


def seconds_per_clip(models: dict, lengths: list[int], side: int, rounds: int) -> dict[tuple[str, int], float]:
    """Fastest of `rounds` inference seconds for one clip per (pe, length), the runs interleaved across models and
    lengths (minimum: the least disturbed run on a shared machine)."""
    best = {(pe, t): math.inf for pe in models for t in lengths}
    with torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms every shape up
            for pe, model in models.items():
                for t in lengths:
                    x = torch.randn(1, 3, t, side, side)
                    start = time.perf_counter()
                    model(x)
                    if r:
                        best[pe, t] = min(best[pe, t], time.perf_counter() - start)
    return best


def saved_activation_mb(model, frames: int, side: int) -> float:
    """MiB of tensors autograd saves for backward in one training forward of one clip (weights excluded)."""
    params = {p.data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randn(1, 3, frames, side, side))
    model.eval()
    return sum(seen.values()) / 2**20


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _probe(name: str, frames: int, side: int) -> None:
    """Child process: peak RSS growth (MiB) of one inference step of one clip."""
    torch.set_num_threads(1)
    model = timm.create_model(name).eval()
    k, p = model.patch_embed.tubelet_size, model.patch_embed.patch_size[0]
    with torch.inference_mode():
        model(torch.randn(1, 3, k, p, p))  # warm-up on one tubelet: loads kernels and thread pools
        before = _rss_mb()
        model(torch.randn(1, 3, frames, side, side))
    print(f"{max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before, 0.0):.1f}")


def peak_rss_mb(name: str, frames: int, side: int) -> float:
    """Peak resident memory (MiB) of one inference step beyond the model's weights, in a fresh process."""
    cmd = [sys.executable, "-m", "visionpe.bench.video_speed", "--probe", name, str(frames), str(side)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"memory probe for {name} at {frames} x {side} failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def growth_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope k of log y = k log x + c."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="vivit_s")
    ap.add_argument("--pes", nargs="+", default=["ape", "rope3d", "vrope"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--side", type=int, default=112, help="frame size of the clip-length sweep")
    ap.add_argument("--no-rss", action="store_true", help="skip the subprocess peak-memory probes")
    ap.add_argument("--probe", nargs=3, metavar=("NAME", "FRAMES", "SIDE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        _probe(args.probe[0], int(args.probe[1]), int(args.probe[2]))
        return
    if "ape" not in args.pes:
        raise SystemExit("--pes must include 'ape': every figure is a ratio against it")

    print(f"# {args.family} video speed, {torch.get_num_threads()} threads, {os.cpu_count()} cores, batch 1")
    print(
        "| clip | tokens | "
        + " | ".join(f"{pe} tok/s" for pe in args.pes)
        + " | "
        + " | ".join(f"{pe} / ape" for pe in args.pes if pe != "ape")
        + " |"
    )
    print("|---|---:|" + "---:|" * (2 * len(args.pes) - 1))
    for frames, side in CLIPS:
        tps, n = tokens_per_second(args.family, args.pes, frames, side, args.rounds)
        ratios = " | ".join(f"{tps[pe] / tps['ape']:.3f}" for pe in args.pes if pe != "ape")
        print(
            f"| {frames} x {side} x {side} | {n} | "
            + " | ".join(f"{tps[pe]:.0f}" for pe in args.pes)
            + f" | {ratios} |"
        )

    print(f"\n# clip-length sweep at {args.side} x {args.side}: seconds per clip, saved activations, peak RSS")
    print("| pe | T | tokens | s/clip | time / T=min | saved act. MiB | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    models = {pe: timm.create_model(f"{args.family}_{pe}").eval() for pe in args.pes}
    secs = seconds_per_clip(models, args.lengths, args.side, args.rounds)
    for pe, model in models.items():
        name = f"{args.family}_{pe}"
        times, mems = [secs[pe, t] for t in args.lengths], []
        for t, sec in zip(args.lengths, times):
            mems.append(saved_activation_mb(model, t, args.side))
            rss = "-" if args.no_rss else f"{peak_rss_mb(name, t, args.side):.0f}"
            n = _tokens(model, t, args.side)
            print(f"| {pe} | {t} | {n} | {sec:.3f} | {sec / times[0]:.2f} | {mems[-1]:.0f} | {rss} |")
        k_t, k_m = growth_exponent(args.lengths, times), growth_exponent(args.lengths, mems)
        print(f"| {pe} | fit | | time ~ T^{k_t:.2f} | | act. ~ T^{k_m:.2f} | |")


if __name__ == "__main__":
    main()
