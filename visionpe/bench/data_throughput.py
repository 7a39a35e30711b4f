"""Is the data loader fast enough? Fashion-MNIST loading vs the training step of every nano ViT, in images/s.

    python -m visionpe.bench.data_throughput [--steps 5] [--workers 0 1] [--models vit_n_ape vit_n_rope2d]

Measures, in one process and one run (so the ratios compare like with like):
- loader: the engine's training loader (augmentation, per-item seeding, collate) alone, at 28 px and with a random
  resolution per batch from 20/28/36 px, for each worker count;
- step: forward + backward + AdamW step of each `vit_n_*` model on a batch already in memory (its own images/s, and
  relative to vit_n_ape), best of interleaved rounds;
- loop: loader and step together for the first model, to see the overhead the loader adds to training.
A loader/step ratio above 1 means the loader is not the bottleneck.
"""

from __future__ import annotations

import argparse
import json
import time

import timm
import torch
from timm.optim import create_optimizer_v2

from .. import list_visionpe_models
from ..data import build_dataset, build_train_loader

__all__ = ["loader_rate", "step_rates", "loop_rate", "main"]


def _dataset(root: str | None):
    return build_dataset("fashion-mnist", "train", 28, root=root, training=True)


def loader_rate(dataset, batch_size: int, resolutions: list[int], workers: int, batches: int) -> float:
    """Images/s of the training loader alone (the first batch, which pays for worker start-up, is not timed)."""
    loader = build_train_loader(dataset, batch_size, resolutions, seed=0, workers=workers)
    loader.batch_sampler.set_epoch(0)
    it = iter(loader)
    next(it)
    t = time.perf_counter()
    n = 0
    for _ in range(batches):
        n += len(next(it).targets)
    return n / (time.perf_counter() - t)


def _model(name: str):
    model = timm.create_model(name, num_classes=10, in_chans=1, img_size=28)
    return model, create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)


def _step(model, opt, x, y) -> None:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def step_rates(names: list[str], batch_size: int, steps: int, rounds: int = 3, warmup: int = 2) -> dict[str, float]:
    """Training images/s of each model on a batch already in memory: rounds interleave the models and the best
    round counts, so that load from other processes drifting over the run does not favour whichever came first."""
    x, y = torch.randn(batch_size, 1, 28, 28), torch.randint(0, 10, (batch_size,))
    built = {}
    for name in names:
        built[name] = _model(name)
        for _ in range(warmup):
            _step(*built[name], x, y)
    best = dict.fromkeys(names, 0.0)
    for _ in range(rounds):
        for name, (model, opt) in built.items():
            t = time.perf_counter()
            for _ in range(steps):
                _step(model, opt, x, y)
            best[name] = max(best[name], batch_size * steps / (time.perf_counter() - t))
    return best


def loop_rate(name: str, dataset, batch_size: int, steps: int, workers: int, warmup: int = 2) -> float:
    """Training images/s with the loader feeding the step."""
    model, opt = _model(name)
    loader = build_train_loader(dataset, batch_size, [28], seed=0, workers=workers)
    loader.batch_sampler.set_epoch(0)
    it = iter(loader)
    for _ in range(warmup):
        b = next(it)
        _step(model, opt, b.inputs, b.targets)
    t = time.perf_counter()
    for _ in range(steps):
        b = next(it)
        _step(model, opt, b.inputs, b.targets)
    return batch_size * steps / (time.perf_counter() - t)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=None, help="default: every registered vit_n_* model")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="timed training steps per model and round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the models (the best counts)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: per-core figures, steady on shared CPUs)")
    p.add_argument("--batches", type=int, default=20, help="timed loader batches per setting")
    p.add_argument("--workers", type=int, nargs="*", default=[0, 1])
    p.add_argument("--root", default=None, help="Fashion-MNIST IDX folder (default: Debian's package)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = args.models or list_visionpe_models("vit_n_*")
    ds = _dataset(args.root)
    print(f"torch threads {torch.get_num_threads()}, batch {args.batch_size}, Fashion-MNIST train ({len(ds)} images)")

    loaders = {}
    for w in args.workers:
        for label, res in (("28px", [28]), ("multires 20/28/36", [20, 28, 36])):
            loaders[f"{label}, {w} worker(s)"] = loader_rate(ds, args.batch_size, res, w, args.batches)
    steps = step_rates(models, args.batch_size, args.steps, args.rounds)
    base = models[0] if "vit_n_ape" not in steps else "vit_n_ape"
    fastest = max(steps.values())
    loop = {w: loop_rate(models[0], ds, args.batch_size, args.steps, w) for w in args.workers}

    print("\nloader alone (images/s; ratio to the fastest training step, > 1: not the bottleneck)")
    for k, v in loaders.items():
        print(f"  {k:<32} {v:>8.0f}   x{v / fastest:.1f}")
    print(f"\ntraining step, batch in memory (images/s; ratio to {base})")
    for m, v in sorted(steps.items(), key=lambda kv: -kv[1]):
        print(f"  {m:<32} {v:>8.0f}   {v / steps[base]:.2f}")
    print(f"\nloader + step, {models[0]} (images/s; ratio to the step alone)")
    for w, v in loop.items():
        print(f"  {w} worker(s){'':<21} {v:>8.0f}   {v / steps[models[0]]:.2f}")
    result = dict(
        threads=torch.get_num_threads(),
        batch_size=args.batch_size,
        loader=loaders,
        step=steps,
        loop={str(w): v for w, v in loop.items()},
        baseline=base,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
