"""Loading published Swin weights: timm's `SwinTransformer` names (and the official checkpoints they come from).

Ours equal timm's except the relative position bias tables, which the PE converts (visionpe.pos.checkpoint, layout
"swin"). Official checkpoints (patch merging at the end of a stage, `head.weight`) are first moved to timm's layout
(merging at the start of the next stage, `head.fc.weight`).
"""

from __future__ import annotations

import re

from timm.layers import resample_patch_embed

from ..pos.base import CheckpointSource
from ..pos.checkpoint import is_visionpe_layout, place_flat_entries, split_pe_entries
from .checkpoint_filters import describe_checkpoint, ensure_fits, expect_blocks, unwrap

__all__ = ["checkpoint_filter_fn"]


def _official_to_timm(state_dict: dict) -> dict:
    """Official Swin: `layers.{s}.downsample` merges at the end of stage s, timm's at the start of stage s + 1."""
    out = {}
    for k, v in state_dict.items():
        k = re.sub(r"^layers\.(\d+)\.downsample", lambda m: f"layers.{int(m[1]) + 1}.downsample", k)
        if k.startswith("head.") and not k.startswith("head.fc."):
            k = "head.fc." + k[len("head.") :]
        out[k] = v
    return out


def checkpoint_filter_fn(state_dict: dict, model) -> dict:
    """Rename and reshape a timm / official Swin state dict for a visionpe SwinTransformer."""
    original = state_dict = unwrap(state_dict)
    if is_visionpe_layout(state_dict):  # already ours (maybe with flat PE names)
        return place_flat_entries(model, state_dict)
    expect_blocks(state_dict, "layers.", "Swin")
    if "layers.0.downsample.reduction.weight" in state_dict:
        state_dict = _official_to_timm(state_dict)
    source = CheckpointSource("swin", model.pe_name, lambda: describe_checkpoint(original))
    out, rest = split_pe_entries(model.pe, state_dict, source)
    out = place_flat_entries(model, out)
    model_sd = model.state_dict()
    for k, v in rest.items():
        if k.endswith("attn_mask"):
            continue  # a buffer, rebuilt from the window
        if k == "patch_embed.proj.weight" and v.shape[-2:] != model_sd[k].shape[-2:]:
            v = resample_patch_embed(v, list(model_sd[k].shape[-2:]), interpolation="bicubic", antialias=True)
        out[k] = v
    ensure_fits(out, model, original, skip=("head.",))
    return out
