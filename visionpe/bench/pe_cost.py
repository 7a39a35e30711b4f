"""What each PE costs on one backbone, as ratios against APE measured in the same run.

Inference time per image (default ViT-S at 224 on the CPU) and the peak memory of one inference step at 512 (a fresh
process per model on CPU; the CUDA allocator's high-water mark on a GPU). The models run interleaved, in a fresh random
order each round; the ratio is taken of the fastest round of each (other processes only ever add time) and, as a
check, of the medians. On CPU the default clock is the CPU time of the one thread doing the work
(torch.set_num_threads(1), time.thread_time): on a shared, oversubscribed machine wall-clock ratios swing by +-30%,
thread CPU time by a few percent. `--clock wall` measures wall-clock time with torch's default threads instead.
Targets from the issue: iRPE contextual <= 1.5x APE time; CPE, LePE and fuzzy PE <= 1.1x.

python -m visionpe.bench.pe_cost [--family vit_s] [--pes ape irpe ...] [--size 224] [--batch 2] [--mem-size 512]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import timm
import torch

import visionpe  # noqa: F401  (registers the models)

from .timing import peak_memory_mb

__all__ = ["PES", "TARGETS", "time_per_image", "memory_mb", "main"]

PES = ["ape", "irpe", "irpe_bias", "irpe_qkv", "cpe", "cpe_gap", "lepe", "fuzzy", "fuzzy_atm"]
TARGETS = {"irpe": 1.5, "cpe": 1.1, "cpe_gap": 1.1, "lepe": 1.1, "fuzzy": 1.1}  # max time vs APE


def time_per_image(
    family: str, pes: list[str], size: int, batch: int, rounds: int, clock: str = "cpu", device: str = "cpu"
) -> dict[str, list[float]]:
    """Inference seconds per image of each `{family}_{pe}`, one per round, rounds interleaved in random order."""
    if clock not in ("cpu", "wall"):
        raise ValueError(f"clock must be 'cpu' (thread CPU time) or 'wall', got {clock!r}")
    if clock == "cpu" and device != "cpu":
        raise ValueError("the 'cpu' clock measures CPU work; use --clock wall on a GPU")
    threads = torch.get_num_threads()
    if clock == "cpu":
        torch.set_num_threads(1)  # all the work in this thread, so its CPU time is the cost
    now = time.thread_time if clock == "cpu" else time.perf_counter
    try:
        models = {pe: timm.create_model(f"{family}_{pe}").eval().to(device) for pe in pes}
        x = torch.randn(batch, 3, size, size, device=device)
        times: dict[str, list[float]] = {pe: [] for pe in pes}
        with torch.inference_mode():
            for m in models.values():  # warm-up
                m(x)
            for _ in range(rounds):
                for pe, m in random.sample(list(models.items()), len(models)):
                    start = now()
                    m(x)
                    if device.startswith("cuda"):
                        torch.cuda.synchronize()
                    times[pe].append((now() - start) / batch)
    finally:
        torch.set_num_threads(threads)
    return times


def _cuda_peak_mb(name: str, size: int, batch: int) -> float:
    model = timm.create_model(name).eval().cuda()
    x = torch.randn(batch, 3, size, size, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.inference_mode():
        model(x)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def memory_mb(family: str, pes: list[str], size: int, batch: int = 1, device: str = "cpu") -> dict[str, float]:
    """Peak memory (MiB, beyond the weights) of one inference step of each `{family}_{pe}` at `size`."""
    if device.startswith("cuda"):
        return {pe: _cuda_peak_mb(f"{family}_{pe}", size, batch) for pe in pes}
    return {pe: peak_memory_mb(f"{family}_{pe}", size, batch) for pe in pes}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="vit_s", help="model name without the PE suffix (default vit_s)")
    ap.add_argument("--pes", nargs="+", default=PES, help="PE suffixes; 'ape' (the baseline) is always added")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--clock", choices=("cpu", "wall"), default=None, help="default: cpu on CPU, wall on a GPU")
    ap.add_argument("--mem-size", type=int, default=512, help="input size of the memory measurement (0: skip)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    pes = ["ape", *[p for p in args.pes if p != "ape"]]

    clock = args.clock or ("cpu" if args.device == "cpu" else "wall")
    secs = time_per_image(args.family, pes, args.size, args.batch, args.rounds, clock, args.device)
    mem = memory_mb(args.family, pes, args.mem_size, 1, args.device) if args.mem_size else {}
    print(
        f"# {args.family}_*: inference at {args.size}px, batch {args.batch}, {args.device}, {clock} clock, "
        f"{args.rounds} rounds, {os.cpu_count()} cores; peak memory at {args.mem_size}px, batch 1"
    )
    print("| PE | ms / image | time vs APE | (medians) | target | met | peak MiB | memory vs APE |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    best = {pe: min(v) for pe, v in secs.items()}
    median = {pe: statistics.median(v) for pe, v in secs.items()}
    for pe in pes:
        ratio = best[pe] / best["ape"]
        target = TARGETS.get(pe)
        met = "" if target is None else ("yes" if ratio <= target else "NO")
        mem_cols = f"{mem[pe]:.0f} | {mem[pe] / max(mem['ape'], 1e-9):.2f}" if mem else "- | -"
        target_col = f"{target:.1f}" if target else "-"
        ratio_med = median[pe] / median["ape"]
        print(f"| {pe} | {best[pe] * 1e3:.1f} | {ratio:.3f} | {ratio_med:.3f} | {target_col} | {met} | {mem_cols} |")


if __name__ == "__main__":
    main()
