"""Deterministic seeds for data: augmentation is a function of (seed, epoch, index), not of worker or process."""

from __future__ import annotations

import random
from contextlib import contextmanager

import numpy as np
import torch
from torch.utils.data import get_worker_info

__all__ = ["mix_seed", "preserved_rngs", "seed_rngs", "seeded_rngs"]

_MASK = 0xFFFFFFFFFFFFFFFF


def mix_seed(*values: int) -> int:
    """A 63-bit seed from integers (splitmix64-style mixing), so neighbouring inputs get unrelated streams."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2))) & _MASK
        h = (h * 0xBF58476D1CE4E5B9) & _MASK
        h ^= h >> 31
    return h & 0x7FFFFFFFFFFFFFFF


@contextmanager
def preserved_rngs():
    """Restore torch's, Python's and NumPy's global RNG states on exit, so that loading does not disturb the training
    RNG (dropout, mixup), which exact resume depends on. In a loader worker the states are the worker's own: nothing
    to restore. Saving NumPy's state costs ~0.1 ms, hence one save per batch (`KeyedDataset.__getitems__`)."""
    if get_worker_info() is not None:
        yield
        return
    saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])


def seed_rngs(seed: int) -> None:
    """Seed torch's, Python's and NumPy's global RNGs for one item (timm's transforms draw from all three)."""
    torch.random.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)


@contextmanager
def seeded_rngs(seed: int):
    """`seed_rngs(seed)` for one item inside `preserved_rngs()`."""
    with preserved_rngs():
        seed_rngs(seed)
        yield
