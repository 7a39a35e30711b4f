"""`visionpe-bench fsdp-memory`: what sharding saves. Per rank, the bytes of parameters, gradients and
AdamW state (counted from the tensors each rank holds: its local shards under fsdp, full replicas under ddp), the
process's peak RSS, and the training step time, for train.strategy=fsdp against ddp in the same invocation.

    visionpe-bench fsdp-memory --models vit_b_rope2d_mixed vit_l_ape --ranks 2 --batch 1 --steps 3

Each (model, strategy) runs in fresh processes (one per rank, gloo on CPU, fp32, one thread each), so every peak RSS
is that strategy's own; they run with glibc's mmap threshold fixed at 256 KiB (MALLOC_MMAP_THRESHOLD_, as the speed
benchmark's memory probe), so that freed tensors leave the resident set and the peak follows the live tensors.
Writes <out>.json and <out>.md with the ratios fsdp / ddp and the state per rank projected to --project ranks (the
full state divided by that many ranks; activations and gathered blocks come on top).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.tensor import DTensor

from ...engine.config_sections import STRATEGIES

__all__ = ["state_bytes", "project_state", "measure", "main"]

GiB = 2**30
MMAP_THRESHOLD = 256 * 1024  # bytes: larger allocations are mmap'ed and returned to the system when freed


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        local = _local(t)
        total += local.numel() * local.element_size()
    return total


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """{"params", "grads", "optimizer", "total"}: bytes this rank holds (a DTensor counts its local shard; a tied
    parameter once). Gradients are those present now; the optimizer's are the tensors of its state (AdamW: two
    moments and a step counter per parameter)."""
    params = list(model.parameters())
    counts = {"params": _nbytes(params), "grads": _nbytes(p.grad for p in params)}
    state = optimizer.state.values() if optimizer is not None else []
    counts["optimizer"] = _nbytes(v for s in state for v in s.values() if isinstance(v, torch.Tensor))
    counts["total"] = counts["params"] + counts["grads"] + counts["optimizer"]
    return counts


def project_state(per_rank_bytes: int, ranks: int, to_ranks: int) -> float:
    """The sharded state per rank at `to_ranks` ranks, from its measured size at `ranks` (each rank holds 1/N)."""
    if ranks < 1 or to_ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks} and {to_ranks}")
    return per_rank_bytes * ranks / to_ranks


# ------------------------------------------------------------------------------------------------- one rank's run


def _build(name: str, strategy: str, res: int, classes: int, ctx):
    from torch.nn.parallel import DistributedDataParallel

    from ...engine.config import load_config
    from ...engine.fsdp import build_sharded_model
    from ...engine.setup import build_model

    cfg = load_config(None, [f"model.name={name}", f"data.resolution={res}", "train.amp=none", "model.drop_path=0"])
    if strategy == "fsdp":
        model = build_sharded_model(cfg, classes, 3, ctx, None)
        return model, model
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, classes, 3)
    return model, DistributedDataParallel(model)


def _rank_main(rank: int, world: int, port: int, job: dict, out: str) -> None:
    """One rank: build, train `steps` AdamW steps after one warm-up step, count, and (rank 0) write every rank's
    figures to `out`."""
    from timm.optim import create_optimizer_v2

    from ...engine.distributed import gather_objects, init_distributed, shutdown

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ["LOCAL_RANK"] = str(rank)
    torch.set_num_threads(job["threads"])
    ctx = init_distributed("cpu")
    import visionpe  # noqa: F401  (the registry, so that the start RSS holds the libraries)

    rss_start = _rss_now()
    model, net = _build(job["model"], job["strategy"], job["res"], job["classes"], ctx)
    optimizer = create_optimizer_v2(model, "adamw", lr=1e-4, weight_decay=0.05)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(job["batch"], 3, job["res"], job["res"], generator=g)
    y = torch.randint(0, job["classes"], (job["batch"],), generator=g)
    times = []
    for step in range(job["steps"] + 1):
        torch.distributed.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
        if step:  # the first step allocates the gradients and AdamW's state
            times.append(time.perf_counter() - start)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    mine = {**state_bytes(model, optimizer), "rss": rss, "rss_above_start": rss - rss_start}
    mine["step_s"] = statistics.median(times)
    every = gather_objects(mine, ctx)
    if ctx.is_main:
        Path(out).write_text(json.dumps(every))
    shutdown(ctx)


def _rss_now() -> int:
    """This process's resident memory now, in bytes (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(job: dict, ranks: int) -> list[dict]:
    """Every rank's figures for one (model, strategy) job, run in `ranks` fresh processes."""
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = saved or str(MMAP_THRESHOLD)  # read by glibc when each rank starts
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "ranks.json")
            mp.spawn(_rank_main, args=(ranks, _free_port(), job, out), nprocs=ranks, join=True)
            return json.loads(Path(out).read_text())
    finally:
        if saved is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]


# -------------------------------------------------------------------------------------------------------- report


def _summary(name: str, runs: dict[str, list[dict]], ranks: int, to_ranks: int) -> dict:
    worst = {s: {k: max(r[k] for r in rows) for k in rows[0]} for s, rows in runs.items()}
    ddp, fsdp = worst["ddp"], worst["fsdp"]
    return {
        "model": name,
        "per_rank": worst,
        "state_ratio": fsdp["total"] / ddp["total"],
        "rss_ratio": fsdp["rss"] / ddp["rss"],
        "rss_above_start_ratio": fsdp["rss_above_start"] / ddp["rss_above_start"],
        "step_ratio": fsdp["step_s"] / ddp["step_s"],
        "projected_state_bytes": project_state(fsdp["total"], ranks, to_ranks),
    }


def _markdown(rows: list[dict], args) -> str:
    lines = [
        f"# FSDP against DDP: per-rank memory and step time ({args.ranks} ranks, gloo on CPU, fp32, "
        f"{args.res} px, batch {args.batch} per rank, {args.threads} thread per rank, median of {args.steps} steps)",
        "",
        "Parameters + gradients + AdamW state are counted from the tensors each rank holds (the largest rank shown); "
        "peak RSS is the whole process's (PyTorch and the libraries, DDP's gradient buckets, activations), and "
        "'above start' subtracts the RSS before the model was built; glibc's mmap threshold is fixed at 256 KiB, so "
        "the peak follows the live tensors.",
        "",
        f"| model | ddp state GiB | fsdp state GiB | fsdp / ddp state | peak RSS ddp / fsdp GiB | fsdp / ddp RSS | "
        f"fsdp / ddp RSS above start | fsdp / ddp step time | fsdp state per rank at {args.project} ranks GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d, f = r["per_rank"]["ddp"], r["per_rank"]["fsdp"]
        lines.append(
            f"| {r['model']} | {d['total'] / GiB:.2f} | {f['total'] / GiB:.2f} | {r['state_ratio']:.3f} | "
            f"{d['rss'] / GiB:.2f} / {f['rss'] / GiB:.2f} | {r['rss_ratio']:.2f} | {r['rss_above_start_ratio']:.2f} | "
            f"{r['step_ratio']:.2f} | "
            f"{r['projected_state_bytes'] / GiB:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="visionpe-bench fsdp-memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["vit_b_rope2d_mixed", "vit_l_ape"])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--res", type=int, default=224)
    ap.add_argument("--batch", type=int, default=1, help="images per rank")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--project", type=int, default=8, help="ranks to project the sharded state to")
    ap.add_argument("--out", default="results/fsdp_memory/fsdp_memory", help="output path without suffix")
    args = ap.parse_args(argv)
    if args.ranks < 2 or args.steps < 1 or args.batch < 1:
        ap.error("--ranks must be >= 2, --steps and --batch >= 1")
    rows = []
    for name in args.models:
        base = {"model": name, "res": args.res, "batch": args.batch, "steps": args.steps}
        base.update(threads=args.threads, classes=args.classes)
        runs = {s: measure({**base, "strategy": s}, args.ranks) for s in STRATEGIES}
        rows.append({**_summary(name, runs, args.ranks, args.project), "ranks": runs})
        print(_markdown(rows[-1:], args).splitlines()[-1], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    out.with_suffix(".md").write_text(_markdown(rows, args))
    print(f"wrote {out}.md and {out}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
