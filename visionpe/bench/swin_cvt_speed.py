"""Swin and CvT speed, as ratios measured in the same run.

1. swin_t_rpb against timm's swin_tiny_patch4_window7_224 with the same weights (target: at least 0.95 of timm's
   images/s at 224).
2. What each PE costs on Swin-T (against swin_t_rpb, the paper's model) and on CvT-13 (against cvt_13, no PE).

Models run interleaved (A, B, C, A, ...) and each keeps its median. On CPU the default clock is the CPU time of the
one thread doing the work (torch.set_num_threads(1), time.thread_time), which a shared, oversubscribed machine
disturbs far less than wall-clock time; `--clock wall` uses wall-clock time and torch's default threads.

python -m visionpe.bench.swin_cvt_speed [--size 224] [--batch 2] [--rounds 3] [--clock cpu|wall] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import timm
import torch
from torch import nn

import visionpe  # noqa: F401  (registers the models)
from visionpe.models.swin_weights import checkpoint_filter_fn

__all__ = ["seconds_per_image", "main"]

SWIN_PES = ["rpb", "rope2d", "rope2d_mixed", "irpe", "lepe", "nope"]
CVT_PES = ["", "rope2d", "rope2d_mixed", "irpe", "cpe"]
TIMM_SWIN = "swin_tiny_patch4_window7_224"


def seconds_per_image(
    models: dict[str, nn.Module], x: torch.Tensor, rounds: int, clock: str = "cpu"
) -> dict[str, float]:
    """Median inference seconds per image of each model over `rounds` interleaved forwards (after one warm-up)."""
    if clock not in ("cpu", "wall"):
        raise ValueError(f"clock must be 'cpu' (thread CPU time) or 'wall', got {clock!r}")
    if clock == "cpu" and x.device.type != "cpu":
        raise ValueError("the 'cpu' clock measures CPU work; use --clock wall on a GPU")
    threads = torch.get_num_threads()
    if clock == "cpu":
        torch.set_num_threads(1)  # all the work in this thread, so its CPU time is the cost
    now = time.thread_time if clock == "cpu" else time.perf_counter
    times: dict[str, list[float]] = {name: [] for name in models}
    try:
        with torch.inference_mode():
            for m in models.values():
                m(x)
            for _ in range(rounds):
                for name, m in models.items():
                    if x.device.type == "cuda":
                        torch.cuda.synchronize()
                    start = now()
                    m(x)
                    if x.device.type == "cuda":
                        torch.cuda.synchronize()
                    times[name].append((now() - start) / x.shape[0])
    finally:
        torch.set_num_threads(threads)
    return {name: statistics.median(v) for name, v in times.items()}


def _pe_table(title: str, names: list[str], base: str, x: torch.Tensor, rounds: int, clock: str) -> None:
    models = {n: timm.create_model(n).eval().to(x.device) for n in names}
    secs = seconds_per_image(models, x, rounds, clock)
    print(f"\n{title}")
    print(f"| model | ms / image | time vs {base} |")
    print("|---|---:|---:|")
    for n in names:
        print(f"| {n} | {secs[n] * 1e3:.1f} | {secs[n] / secs[base]:.3f} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clock", choices=("cpu", "wall"), default=None, help="default: cpu on CPU, wall on a GPU")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip-pe-cost", action="store_true", help="only the timm comparison")
    args = ap.parse_args(argv)
    clock = args.clock or ("cpu" if args.device == "cpu" else "wall")
    x = torch.randn(args.batch, 3, args.size, args.size, device=args.device)
    print(
        f"# Swin / CvT speed at {args.size}px, batch {args.batch}, {args.device}, {clock} clock, "
        f"median of {args.rounds} interleaved rounds, {os.cpu_count()} cores"
    )

    ref = timm.create_model(TIMM_SWIN).eval()
    ours = timm.create_model("swin_t_rpb").eval()
    ours.load_state_dict(checkpoint_filter_fn(ref.state_dict(), ours))
    pair = {"swin_t_rpb": ours.to(args.device), TIMM_SWIN: ref.to(args.device)}
    secs = seconds_per_image(pair, x, max(args.rounds, 5), clock)
    ips = {n: 1.0 / s for n, s in secs.items()}
    ratio = ips["swin_t_rpb"] / ips[TIMM_SWIN]
    print("\n| ours | timm | ours img/s | timm img/s | ours / timm | target | met |")
    print("|---|---|---:|---:|---:|---:|---|")
    met = "yes" if ratio >= 0.95 else "NO"
    print(f"| swin_t_rpb | {TIMM_SWIN} | {ips['swin_t_rpb']:.2f} | {ips[TIMM_SWIN]:.2f} | {ratio:.3f} | 0.95 | {met} |")
    if args.skip_pe_cost:
        return
    _pe_table("PE cost on Swin-T", [f"swin_t_{pe}" for pe in SWIN_PES], "swin_t_rpb", x, args.rounds, clock)
    cvt = [f"cvt_13_{pe}" if pe else "cvt_13" for pe in CVT_PES]
    _pe_table("PE cost on CvT-13", cvt, "cvt_13", x, args.rounds, clock)


if __name__ == "__main__":
    main()
