"""`visionpe-bench speed --data NAME`: is the data loader fast enough? Loader vs training step, in images/s.

Measured in one run with the shared clock (timing.py; wall-clock, since loader workers are other processes), all
tasks interleaved in random order each round:
- loader: the engine's training loader (augmentation, per-item seeding, collate) alone, at the first size and with a
  random size per batch (the sizes given, or 0.7x / 1x / 1.3x of the one size), for each worker count;
- step: forward + backward + AdamW step of each model on a batch already in memory;
- loop: loader and step together for the first model, per worker count.
Ratios are per round against the baseline (the first model's step): a loader ratio above 1 means the loader is not
the bottleneck; a loop ratio below 1 is the overhead the loader adds to training.

Any registered image dataset can be measured (`--data fashion-mnist-canvas --data-options num_train=18000 item=22
--resolutions 24`); Fashion-MNIST defaults to its native 28 px, other datasets take their size from --resolutions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import timm
import torch
from timm.optim import create_optimizer_v2

from ..data import build_dataset, build_train_loader, get_dataset_info
from ..data.loader import dataset_num_classes
from .timing import Clock, Spread, interleave, paired_ratios, spread

__all__ = ["measure_data", "write_data_results"]

_NATIVE_SIZE = {"fashion-mnist": 28}  # datasets measured at their own size when no --resolutions are given


def _batches(dataset, batch: int, resolutions: list[int], workers: int):
    """Endless training batches (a new epoch when one ends)."""
    loader = build_train_loader(dataset, batch, resolutions, seed=0, workers=workers)
    epoch = 0
    while True:
        loader.batch_sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _trainer(name: str, size: int, chans: int, classes: int) -> Callable:
    model = timm.create_model(name, num_classes=classes, in_chans=chans, img_size=size)
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)

    def step(x, y) -> int:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return len(y)

    return step


def measure_data(
    dataset_name: str,
    models: list[str],
    batch: int,
    rounds: int,
    steps: int,
    workers: list[int],
    root: str | None,
    resolutions: list[int] | None = None,
    options: dict | None = None,
) -> dict:
    """Images/s of each loader setting, training step and loop, with per-round ratios against the first step.
    `resolutions`: the first is the measured size, all of them the multi-size loader's (default: the dataset's
    native size and 0.7x / 1.3x of it); `options` go to the dataset factory (e.g. num_train, item)."""
    info = get_dataset_info(dataset_name)
    if info.kind != "image":
        raise ValueError(f"--data measures image datasets; {dataset_name!r} is a {info.kind} dataset")
    if not resolutions:
        if dataset_name not in _NATIVE_SIZE:
            raise ValueError(f"give the size to measure {dataset_name!r} at with --resolutions (e.g. --resolutions 32)")
        size = _NATIVE_SIZE[dataset_name]
        resolutions = [size, round(size * 0.7), round(size * 1.3)]
    size, chans = resolutions[0], info.in_chans
    ds = build_dataset(info, "train", size, root=root, options=options, training=True)
    classes = dataset_num_classes(info, ds)
    sizes = [(f"{size}px", [size])]
    if len(resolutions) > 1:
        sizes.append((f"sizes {'/'.join(map(str, resolutions))}", resolutions))
    tasks: dict[str, Callable[[], int]] = {}
    for w in workers:
        for label, res in sizes:
            it = _batches(ds, batch, res, w)
            tasks[f"loader {label}, {w} worker(s)"] = lambda it=it: len(next(it).targets)
    x, y = torch.randn(batch, chans, size, size), torch.randint(0, classes, (batch,))
    for name in models:
        trainer = _trainer(name, size, chans, classes)
        tasks[f"step {name}"] = lambda s=trainer: s(x, y)
    for w in workers:
        it, s = _batches(ds, batch, [size], w), _trainer(models[0], size, chans, classes)
        tasks[f"loop {models[0]}, {w} worker(s)"] = lambda it=it, s=s: (lambda b: s(b.inputs, b.targets))(next(it))
    rates = interleave(tasks, Clock("wall"), rounds, steps, warmup=2)
    baseline = f"step {models[0]}"
    ratios = paired_ratios(rates, baseline)
    rows = [dict(task=n, ips=spread(v).as_dict(), vs_base=spread(ratios[n]).as_dict()) for n, v in rates.items()]
    return dict(
        dataset=dataset_name,
        options=options or {},
        images=len(ds),
        batch=batch,
        workers=workers,
        baseline=baseline,
        rows=rows,
    )


def _options_text(options: dict | None) -> str:
    return f" ({', '.join(f'{k}={v}' for k, v in options.items())})" if options else ""


def _text(d: dict, spec: str) -> str:
    return Spread(**d).text(spec)


def write_data_results(result: dict, out: Path, machine: dict, settings: dict) -> tuple[Path, Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    json_path.write_text(json.dumps(dict(machine=machine, settings=settings, **result), indent=1) + "\n")
    lines = [
        f"# Loader vs training step: {result['dataset']}{_options_text(result.get('options'))} ({machine['date']})",
        "",
        f"{machine['cpu']}, {machine['threads']} torch threads, batch {result['batch']}, {settings['rounds']} "
        f"interleaved rounds of {settings['steps']} batches, wall-clock seconds. Ratios per round against "
        f"{result['baseline']}: median [spread].",
        "",
        f"| task | images/s | vs {result['baseline']} |",
        "|---|---:|---:|",
    ]
    lines += [f"| {r['task']} | {_text(r['ips'], '.0f')} | {_text(r['vs_base'], '.2f')} |" for r in result["rows"]]
    md_path.write_text("\n".join(lines) + "\n")
    return json_path, md_path
