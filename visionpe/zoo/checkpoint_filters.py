"""Helpers shared by the checkpoint filters of every family: unwrapping, and a guess of what a
checkpoint is when it does not fit the model it is loaded into (so the error names what to pass instead)."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from ..pos.base import CheckpointMismatch
from ..pos.checkpoint import place_flat_entries
from .family import FAMILIES

__all__ = [
    "checked_filter",
    "describe_checkpoint",
    "ensure_fits",
    "expect_blocks",
    "kind_mismatches",
    "unwrap",
]


def unwrap(state_dict: dict) -> dict:
    """The weights inside a training checkpoint ({"model_ema"|"model"|"state_dict": weights, ...})."""
    for key in ("model_ema", "model", "state_dict"):
        if key in state_dict and isinstance(state_dict[key], dict):
            return state_dict[key]
    return state_dict


def expect_blocks(state_dict: dict, block_prefix: str, family: str) -> None:
    """A CheckpointMismatch naming what the checkpoint is unless it has a `block_prefix` key (a `family` one)."""
    if not any(k.startswith(block_prefix) for k in state_dict):
        raise CheckpointMismatch(f"this is not a {family} checkpoint but {describe_checkpoint(state_dict)}")


def _count(state_dict: dict, pattern: str) -> int:
    found = {m[1] for k in state_dict if (m := re.match(pattern, k))}
    return len(found)


def _width(state_dict: dict, *keys: str) -> int | None:
    for k in keys:
        if k in state_dict and isinstance(state_dict[k], torch.Tensor):
            return int(state_dict[k].shape[0])
    return None


def _guess(state_dict: dict) -> tuple[str, dict]:
    """(family, dims) of a checkpoint in any layout we load: ours, timm's, or the official ones."""
    if any(re.match(r"^(cvt\.)?encoder\.stages\.", k) for k in state_dict) or any(
        re.match(r"^stages?\.?\d+\.patch_embed", k) for k in state_dict
    ):
        hf = any(k.startswith(("cvt.", "encoder.")) for k in state_dict)
        stage = r"^(?:cvt\.)?encoder\.stages\.(\d+)\." if hf else r"^stages?\.?(\d+)\."
        n = _count(state_dict, stage)
        depths, widths = [], []
        for s in range(n):
            block = rf"^(?:cvt\.)?encoder\.stages\.{s}\.layers\.(\d+)\." if hf else rf"^stages?\.?{s}\.blocks\.(\d+)\."
            depths.append(_count(state_dict, block))
            emb = (
                f"cvt.encoder.stages.{s}.embedding.convolution_embeddings.projection.weight"
                if hf
                else next((k for k in state_dict if re.match(rf"^stages?\.?{s}\.patch_embed\.proj\.weight$", k)), "")
            )
            widths.append(_width(state_dict, emb, emb.replace("cvt.", "", 1)))
        return "cvt", dict(embed_dims=tuple(widths), depths=tuple(depths))
    if any(re.match(r"^layers\.\d+\.blocks\.", k) for k in state_dict):
        n = _count(state_dict, r"^layers\.(\d+)\.")
        depths = tuple(_count(state_dict, rf"^layers\.{s}\.blocks\.(\d+)\.") for s in range(n))
        return "swin", dict(embed_dim=_width(state_dict, "patch_embed.proj.weight"), depths=depths)
    if any(re.match(r"^blocks\.\d+\.", k) for k in state_dict):
        depth = _count(state_dict, r"^blocks\.(\d+)\.")
        return "vit", dict(embed_dim=_width(state_dict, "patch_embed.proj.weight"), depth=depth)
    return "unknown", {}


def _same(a, b) -> bool:
    return tuple(a) == tuple(b) if isinstance(b, tuple) and a is not None else a == b


def _size_name(family: str, dims: dict) -> str | None:
    """The registered size whose table matches the checkpoint's dims (None if no size does)."""
    fam = FAMILIES.get(family)
    if fam is None:
        return None
    for size, args in fam.sizes.items():
        if all(_same(args.get(k), v) for k, v in dims.items()):
            return size
    return None


def describe_checkpoint(state_dict: dict) -> str:
    """One line: what the checkpoint looks like and which visionpe name loads it."""
    family, dims = _guess(unwrap(state_dict))
    if family == "unknown":
        return "a checkpoint of no family visionpe knows (no ViT, Swin or CvT block keys)"
    shown = ", ".join(f"{k}={v}" for k, v in dims.items())
    size = _size_name(family, dims)
    where = f"load it into {family}_{size}_*" if size else f"no registered {family} size has these dims"
    return f"a {family} checkpoint ({shown}): {where}"


def ensure_fits(mapped: dict, model: torch.nn.Module, original: dict, skip: tuple[str, ...] = ()) -> None:
    """Raise one CheckpointMismatch naming what the checkpoint is when its mapped keys or shapes do not fit `model`.

    Keys starting with `skip` (the classifier, which timm drops when num_classes differs; PE parameters a model may
    train from scratch) are not compared."""
    target = model.state_dict()
    wrong = [k for k, v in mapped.items() if k in target and not k.startswith(skip) and v.shape != target[k].shape]
    extra = [k for k in mapped if k not in target and not k.startswith(skip)]
    missing = [k for k in target if k not in mapped and not k.startswith(skip) and "num_batches_tracked" not in k]
    if wrong or extra or missing:
        first = (wrong or extra or missing)[0]
        what = "has the wrong shape" if wrong else ("is not in the model" if extra else "is missing")
        raise CheckpointMismatch(
            f"the checkpoint does not fit this {type(model).__name__} ({first!r} {what}); "
            f"it is {describe_checkpoint(original)}"
        )


def _kind(t: torch.Tensor) -> tuple[bool, bool]:
    return t.is_floating_point(), t.is_complex()


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def kind_mismatches(state: dict, own: dict) -> list[str]:
    """'key is int64 (the model's is float32)' for each tensor of `state` holding another kind of number (integer or
    bool, float, complex) than the model's tensor of that name: load_state_dict would cast int64 or bool values into
    float weights, a garbage model and no error. Shared by the engine's loader and timm's pretrained route."""
    out = []
    for k, v in own.items():
        w = state.get(k)
        if isinstance(w, torch.Tensor) and isinstance(v, torch.Tensor) and _kind(w) != _kind(v):
            out.append(f"{k} is {_dtype(w)} (the model's is {_dtype(v)})")
    return out


def _check_loadable(state: dict, model: torch.nn.Module) -> None:
    """What timm's load_pretrained would load silently wrong or refuse with torch's text: tensors of another kind
    of number, and a classifier timm keeps (model and pretrained cfg agree on num_classes) of another size."""
    own = model.state_dict()
    kinds = kind_mismatches(state, own)
    if kinds:
        raise CheckpointMismatch(
            f"the checkpoint holds {len(kinds)} tensor(s) of another kind of number than the model's "
            f"({'; '.join(kinds[:3])}); use a file of float weights (the one training wrote)"
        )
    cfg = getattr(model, "pretrained_cfg", None) or {}
    names = cfg.get("classifier") or ()
    if getattr(model, "num_classes", None) != cfg.get("num_classes"):
        return  # timm drops the checkpoint's classifier: the model trains a new one
    for name in (names,) if isinstance(names, str) else names:
        w, v = state.get(f"{name}.weight"), own.get(f"{name}.weight")
        if isinstance(w, torch.Tensor) and isinstance(v, torch.Tensor) and w.shape[:1] != v.shape[:1]:
            n, m = w.shape[0], v.shape[0]
            raise CheckpointMismatch(
                f"the checkpoint's classifier {name!r} has {n} classes, the model {m}: add num_classes={n} to "
                f"pretrained_cfg_overlay (the model then has {n} classes and loads them; a model given num_classes of "
                "its own loads the rest and trains a new classifier)"
            )


def checked_filter(filter_fn: Callable | None) -> Callable:
    """A family's timm `pretrained_filter_fn` (published layouts -> ours, or None) followed by the checks of
    `_check_loadable`, so that weights given through timm (`pretrained_cfg_overlay=dict(file=...)`, also from the
    engine's `model.kwargs`) are refused as the engine's own loader refuses them."""

    def checked(state_dict: dict, model: torch.nn.Module) -> dict:
        out = filter_fn(state_dict, model) if filter_fn is not None else state_dict
        out = place_flat_entries(model, out)  # visionpe's layout before each layer owned its PE state
        _check_loadable(out, model)
        return out

    return checked
