"""Split names: the synonyms timm accepts ("train"/"training", "val"/"valid"/"validation"/"eval"/"evaluation"), and
the item count a dataset keeps of a split."""

from __future__ import annotations

__all__ = ["TRAIN_SPLITS", "EVAL_SPLITS", "split_kind", "split_size"]

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


def split_size(split: str, num_samples: int | None, num_train: int | None, num_val: int | None) -> int | None:
    """The item count asked of a split: num_samples (either split) or num_train / num_val (the split's own); None
    keeps the dataset's default. Giving num_samples with a per-split count is ambiguous."""
    if num_samples is not None and (num_train is not None or num_val is not None):
        raise ValueError(
            "give either num_samples (both splits) or num_train / num_val (per split), not both; "
            "e.g. data.options: {num_train: 12000}"
        )
    if num_samples is not None:
        return num_samples
    return num_train if split_kind(split) == "train" else num_val
