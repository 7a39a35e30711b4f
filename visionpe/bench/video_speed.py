"""Video ViT speed and memory per PE: tokens/s as ratios against the space-time APE in the same run, and how time and
memory grow with clip length.

1. Inference tokens/s of `{family}_{pe}` at 8 x 112 x 112 and 16 x 224 x 224 (batch 1; runs interleaved across
   models and clips, the fastest of --rounds kept), as ratios against `{family}_ape`.
2. Clip-length sweep at 112 x 112: seconds per clip (inference), the activation memory a training step keeps for
   backward (bytes of the tensors autograd saves; exact, no allocator noise) and the peak resident memory of one
   inference step (a fresh process per point), with the growth exponent k of time ~ T^k.

python -m visionpe.bench.video_speed [--family vivit_s] [--pes ape rope3d vrope] [--rounds 3] [--lengths 4 8 16 32]
    [--clock cpu|wall]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time

import timm
import torch

import visionpe  # noqa: F401  (registers the models)

__all__ = ["tokens_per_second", "seconds_per_clip", "saved_activation_mb", "peak_rss_mb", "growth_exponent", "main"]

CLIPS = [(8, 112), (16, 224)]  # (frames, side)


def _tokens(model, frames: int, side: int) -> int:
    t, h, w = model.patch_embed.token_grid(frames, side, side)
    return t * h * w


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def tokens_per_second(
    models: dict, clips: list[tuple[int, int]], rounds: int, clock: str = "wall"
) -> dict[tuple[str, int, int], float]:
    """Inference tokens/s of each model on one clip of each (frames, side): the fastest of `rounds` runs, the runs
    interleaved across models and clips (on a shared machine the fastest run is the least disturbed one).
    clock 'cpu' counts the process's CPU seconds instead of wall seconds: steadier when other jobs share the cores."""
    now = CLOCKS[clock]
    best = {(pe, *clip): math.inf for pe in models for clip in clips}
    with torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms every shape up
            for frames, side in clips:
                x = torch.randn(1, 3, frames, side, side)
                for pe, model in models.items():
                    start = now()
                    model(x)
                    if r:
                        best[pe, frames, side] = min(best[pe, frames, side], now() - start)
    return {(pe, f, s): _tokens(models[pe], f, s) / sec for (pe, f, s), sec in best.items()}


def seconds_per_clip(
    models: dict, lengths: list[int], side: int, rounds: int, clock: str = "wall"
) -> dict[tuple[str, int], float]:
    """Inference seconds for one clip per (pe, length), measured as in `tokens_per_second`."""
    tps = tokens_per_second(models, [(t, side) for t in lengths], rounds, clock)
    return {(pe, t): _tokens(models[pe], t, side) / v for (pe, t, _), v in tps.items()}


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


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def _probe(name: str, frames: int, side: int) -> None:
    """Child process: peak RSS growth (MiB) of one inference step of one clip. Reads VmHWM after resetting it
    (/proc/self/clear_refs): getrusage's ru_maxrss would include the parent's RSS, inherited through fork."""
    torch.set_num_threads(1)
    model = timm.create_model(name).eval()
    k, p = model.patch_embed.tubelet_size, model.patch_embed.patch_size[0]
    x = torch.randn(1, 3, frames, side, side)
    with torch.inference_mode():
        model(torch.randn(1, 3, k, p, p))  # warm-up on one tubelet: loads kernels and thread pools
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS to the current RSS
        before = _status_mb("VmRSS")
        model(x)
    print(f"{max(_status_mb('VmHWM') - before, 0.0):.1f}")


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
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="'cpu': process CPU seconds on one thread (steady on a shared machine, the default); 'wall': wall "
        "seconds on all threads (for a dedicated machine)",
    )
    ap.add_argument("--probe", nargs=3, metavar=("NAME", "FRAMES", "SIDE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        _probe(args.probe[0], int(args.probe[1]), int(args.probe[2]))
        return
    if "ape" not in args.pes:
        raise SystemExit("--pes must include 'ape': every figure is a ratio against it")

    if args.clock == "cpu":
        torch.set_num_threads(1)  # CPU seconds of one thread: no spin-waiting of idle worker threads counted
    unit = "tokens per CPU-second" if args.clock == "cpu" else "tokens/s"
    print(f"# {args.family}: {unit}, {torch.get_num_threads()} thread(s), {os.cpu_count()} cores, batch 1")
    print(
        "| clip | tokens | "
        + " | ".join(f"{pe} tok/s" for pe in args.pes)
        + " | "
        + " | ".join(f"{pe} / ape" for pe in args.pes if pe != "ape")
        + " |"
    )
    print("|---|---:|" + "---:|" * (2 * len(args.pes) - 1))
    models = {pe: timm.create_model(f"{args.family}_{pe}").eval() for pe in args.pes}
    all_tps = tokens_per_second(models, CLIPS, args.rounds, args.clock)
    for frames, side in CLIPS:
        tps = {pe: all_tps[pe, frames, side] for pe in args.pes}
        n = _tokens(models["ape"], frames, side)
        ratios = " | ".join(f"{tps[pe] / tps['ape']:.3f}" for pe in args.pes if pe != "ape")
        print(
            f"| {frames} x {side} x {side} | {n} | "
            + " | ".join(f"{tps[pe]:.0f}" for pe in args.pes)
            + f" | {ratios} |"
        )

    print(f"\n# clip-length sweep at {args.side} x {args.side}: {args.clock} s per clip, saved activations, peak RSS")
    print("| pe | T | tokens | s/clip | time / T=min | saved act. MiB | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    secs = seconds_per_clip(models, args.lengths, args.side, args.rounds, args.clock)
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
