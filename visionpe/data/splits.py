"""Split names: the synonyms timm accepts ("train"/"training", "val"/"valid"/"validation"/"eval"/"evaluation")."""

from __future__ import annotations

__all__ = ["TRAIN_SPLITS", "EVAL_SPLITS", "split_kind"]

TRAIN_SPLITS = ("train", "training")
EVAL_SPLITS = ("val", "valid", "validation", "eval", "evaluation", "test")


def split_kind(split: str) -> str:
    """'train' or 'val' for any accepted split name; a clear error for anything else."""
    name = split.split("[")[0].lower()
    if name in TRAIN_SPLITS:
        return "train"
    if name in EVAL_SPLITS:
        return "val"
    raise ValueError(f"unknown split {split!r}; use one of {', '.join(TRAIN_SPLITS + EVAL_SPLITS)}")
