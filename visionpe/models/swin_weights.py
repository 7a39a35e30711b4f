"""Loading published Swin weights: timm's `SwinTransformer` names (and the official checkpoints they come from).

Ours equal timm's except the relative position bias tables, which live with the PE: timm's
`layers.{s}.blocks.{j}.attn.relative_position_bias_table` [(2ws-1)^2, heads] is `pe.encodings.irpe.bias_tables.{i}`
with i the block index over all stages (same layout: iRPE's product mapping with an identity index). Official
checkpoints (patch merging at the end of a stage, `head.weight`) are first moved to timm's layout (merging at the
start of the next stage, `head.fc.weight`). Tables trained for another window are resized bicubically, as timm does.
"""

from __future__ import annotations

import re

from timm.layers import resample_patch_embed, resize_rel_pos_bias_table

from .checkpoints import CheckpointMismatch, describe_checkpoint, ensure_fits, unwrap

__all__ = ["checkpoint_filter_fn", "CheckpointMismatch"]

_TABLE = re.compile(r"^layers\.(\d+)\.blocks\.(\d+)\.attn\.relative_position_bias_table$")


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
    if any(k.startswith("pe.") for k in state_dict):  # already ours
        return state_dict
    if not any(k.startswith("layers.") for k in state_dict):
        raise CheckpointMismatch(f"this is not a Swin checkpoint but {describe_checkpoint(state_dict)}")
    if "layers.0.downsample.reduction.weight" in state_dict:
        state_dict = _official_to_timm(state_dict)
    model_sd = model.state_dict()
    tables = "irpe" in model.pe.encodings and model.pe.encodings["irpe"].mode == "bias"
    if not tables and any(_TABLE.match(k) for k in state_dict):
        raise CheckpointMismatch(
            f"the checkpoint has Swin's relative position bias but the model's PE is {model.pe_name!r}; "
            "load it into the rpb preset (e.g. swin_t_rpb), or drop the tables and train the new PE (strict=False)"
        )
    out = {}
    for k, v in state_dict.items():
        if k.endswith(("relative_position_index", "attn_mask")):
            continue  # buffers, rebuilt from the window
        m = _TABLE.match(k)
        if m:
            s, j = int(m[1]), int(m[2])
            k = f"pe.encodings.irpe.bias_tables.{model.stage_starts[s] + j}" if s < len(model.stage_starts) else k
            if k not in model_sd:
                raise CheckpointMismatch(
                    f"the checkpoint has more blocks than the model; it is {describe_checkpoint(original)}"
                )
            target = model_sd[k].shape
            if v.shape[0] != target[0] and v.shape[1] == target[1]:
                v = resize_rel_pos_bias_table(v, new_window_size=model.window_sizes[s], new_bias_shape=tuple(target))
        elif k == "patch_embed.proj.weight" and v.shape[-2:] != model_sd[k].shape[-2:]:
            v = resample_patch_embed(v, list(model_sd[k].shape[-2:]), interpolation="bicubic", antialias=True)
        out[k] = v
    ensure_fits(out, model, original, skip=("head.",))
    return out
