"""Child process of `timing.peak_memory_mb`: build a model, run one step, print the peak RSS growth in MiB.

Usage: python -m visionpe.bench.memprobe NAME SIZE BATCH TRAIN(0|1) MODEL_KWARGS_JSON
"""

from __future__ import annotations

import json
import resource
import sys

import timm
import torch

import visionpe  # noqa: F401  (registers the models)
from visionpe.zoo import family_of


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM), so that the peak of the import and of model building is not read
    as the step's; False where /proc/self/clear_refs is not writable (the lifetime peak is used then)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _hwm_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM")) / 1024  # kB


def main(argv: list[str]) -> None:
    name, size, batch, train, kwargs = argv[0], int(argv[1]), int(argv[2]), argv[3] == "1", json.loads(argv[4])
    torch.set_num_threads(1)
    model = timm.create_model(name, **kwargs).train(train)
    fam = family_of(name) if name in visionpe.list_visionpe_models() else None
    if fam is not None and getattr(fam, "example_input", None) is not None:
        x = fam.example_input(size, batch)
    else:
        x = torch.randn(batch, model.pretrained_cfg.get("input_size", (3,))[0], size, size)
    before = _rss_mb()
    resettable = _reset_peak()
    if train:
        out = model(**x) if isinstance(x, dict) else model(x)
        out.float().square().mean().backward()
    else:
        with torch.inference_mode():
            model(**x) if isinstance(x, dict) else model(x)
    peak = _hwm_mb() if resettable else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"{max(peak - before, 0.0):.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
