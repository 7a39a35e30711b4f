"""Loading published ViT weights: timm's ViT/DeiT, the RoPE-ViT and DINOv3 ports (timm's eva.py names), DINOv3's
official checkpoints (`storage_tokens` for the registers, `qkv.bias` with its `bias_mask`, `rope_embed.periods`,
`mask_token`), naver's own RoPE-ViT checkpoints (naver-ai/rope-vit: mixed frequencies `freqs` [2, depth,
heads * d/2], position buffers `freqs_t_x/y`) and the iRPE authors' DeiT checkpoints (microsoft/Cream iRPE:
`blocks.{i}.attn.rpe_{q|k|v}.lookup_table_{weight|bias}`) -> visionpe names.

iRPE's official tables, per block i: on q / k `lookup_table_weight` [heads | 1, d, buckets] (ours `tables.{q|k}.{i}`
[buckets, d] shared or [heads, buckets, d]), on v [heads | 1, buckets, d] (ours `tables.v.{i}`), bias mode
`lookup_table_bias` [heads | 1, buckets] (ours `bias_tables.{i}` / `q_bias_tables.{i}` [buckets, heads | 1]). Both
number the buckets the same way (product: row bucket * (2B + 1) + column bucket; the prefix bucket last).

A checkpoint whose architecture does not match the model's options gets an error naming the option to pass
(`init_values` for LayerScale, `no_embed_class` for APE tables without a CLS entry, the PE preset).
"""

from __future__ import annotations

import math

import torch
from timm.layers import resample_abs_pos_embed

from .checkpoints import CheckpointMismatch, describe_checkpoint, ensure_fits, unwrap

__all__ = ["CheckpointMismatch", "checkpoint_filter_fn"]


def _ape_entries(num: int, model) -> int:
    """How many prefix entries a checkpoint's APE table has (0 or the model's prefix count)."""
    p = model.num_prefix_tokens
    if math.isqrt(num) ** 2 == num:
        return 0
    if p and math.isqrt(num - p) ** 2 == num - p:
        return p
    raise CheckpointMismatch(f"cannot tell the grid of a pos_embed with {num} entries (not a square grid + prefix)")


def _ape_key(model) -> str | None:
    return "pe.encodings.ape.pos_embed" if "ape" in model.pe.encodings else None


def _map_pos_embed(v: torch.Tensor, model) -> tuple[str, torch.Tensor]:
    key = _ape_key(model)
    if key is None:
        raise CheckpointMismatch(
            f"the checkpoint has a learned APE (pos_embed) but the model's PE {model.pe_name!r} has none; "
            "use an *_ape preset (e.g. vit_s_ape, vit_s_rope2d_ape)"
        )
    entries = _ape_entries(v.shape[1], model)
    model_entries = model.pe.encodings["ape"].num_prefix_entries
    if entries != model_entries:
        fix = "no_embed_class=True" if entries == 0 else "no_embed_class=False"
        raise CheckpointMismatch(
            f"the checkpoint's APE has {entries} prefix entries, the model {model_entries}; build it with {fix}"
        )
    side = math.isqrt(v.shape[1] - entries)
    grid = tuple(model.pe.encodings["ape"].grid)
    if (side, side) != grid:
        v = resample_abs_pos_embed(v, new_size=list(grid), old_size=[side, side], num_prefix_tokens=entries)
    return key, v


def checkpoint_filter_fn(state_dict: dict, model) -> dict:
    """Rename and reshape a timm ViT / DeiT / RoPE-ViT (eva) state dict for a visionpe VisionTransformer."""
    original = state_dict = unwrap(state_dict)
    if any(k.startswith("pe.") for k in state_dict):  # already ours
        return state_dict
    if not any(k.startswith("blocks.") for k in state_dict):
        raise CheckpointMismatch(f"this is not a ViT checkpoint but {describe_checkpoint(state_dict)}")
    model_keys = set(model.state_dict().keys())
    has_ls_model = any(k.endswith("ls1.gamma") for k in model_keys)
    has_ls_ckpt = any(k.endswith(("gamma_1", "ls1.gamma")) for k in state_dict)
    if has_ls_ckpt and not has_ls_model:
        raise CheckpointMismatch("the checkpoint has LayerScale; build the model with init_values=1e-5")
    if has_ls_model and not has_ls_ckpt:
        raise CheckpointMismatch("the checkpoint has no LayerScale; build the model with init_values=None")

    out = {}
    q_bias, v_bias, bias_masks = {}, {}, {}
    for k, v in state_dict.items():
        if k == "storage_tokens":  # DINOv3's registers
            k = "reg_token"
        if k == "mask_token" or k.startswith(("rope_embed.", "local_cls_norm.")):
            continue  # DINOv3's pretraining-only tensors and its periods (fixed, rebuilt by the PE)
        if k.endswith("qkv.bias_mask"):
            bias_masks[k[: -len("bias_mask")] + "bias"] = v
            continue
        if k == "pos_embed":
            k, v = _map_pos_embed(v, model)
        elif k in ("freqs_t_x", "freqs_t_y"):
            continue  # naver's patch positions (buffers), rebuilt from the layout
        elif k in ("rope.freqs", "freqs"):  # timm's port [2, depth, H, d/2]; naver's [2, depth, H * d/2]
            if "pe.encodings.rope2d.freqs" not in model_keys:
                raise CheckpointMismatch(
                    f"the checkpoint has RoPE-Mixed frequencies but the model's PE is {model.pe_name!r}; "
                    "use a rope2d_mixed preset (e.g. vit_s_rope2d_mixed)"
                )
            k = "pe.encodings.rope2d.freqs"
            v = _mixed_freqs(v, model, original)
        elif k.endswith(".gamma_1"):
            k = k[: -len("gamma_1")] + "ls1.gamma"
        elif k.endswith(".gamma_2"):
            k = k[: -len("gamma_2")] + "ls2.gamma"
        elif k.endswith("attn.q_bias"):
            q_bias[k[: -len("q_bias")]] = v
            continue
        elif k.endswith("attn.v_bias"):
            v_bias[k[: -len("v_bias")]] = v
            continue
        elif ".attn.rpe_" in k:
            k, v = _map_irpe(k, v, model)
        elif k.startswith("rope.") or k.endswith("k_bias"):
            continue  # non-persistent rope buffers / eva's zero k bias
        out[k] = v
    for prefix, qb in q_bias.items():  # eva: q and v biases, no k bias
        out[prefix + "qkv.bias"] = torch.cat([qb, torch.zeros_like(qb), v_bias[prefix]])
    for k, mask in bias_masks.items():  # DINOv3: the bias the official forward uses
        out[k] = out[k] * mask.to(out[k].dtype)
    _qv_biases(out, model)
    if "pe.encodings.rope2d.freqs" in model_keys and "pe.encodings.rope2d.freqs" not in out:
        raise CheckpointMismatch(
            f"the model's PE {model.pe_name!r} has learned RoPE-Mixed frequencies the checkpoint lacks; "
            "use the matching preset (rope2d for an axial RoPE checkpoint)"
        )
    if _ape_key(model) and _ape_key(model) not in out:
        raise CheckpointMismatch(
            f"the model's PE {model.pe_name!r} has a learned APE the checkpoint lacks; use a preset without 'ape'"
        )
    ensure_fits(out, model, original, skip=("head.",))
    return out


def _qv_biases(out: dict, model) -> None:
    """A q/v-only bias model (qkv_bias="qv"): k thirds zero, and zeros where the checkpoint has no qkv bias (timm's
    bias-free DINOv3 ports: the released biases are zero, so zeros give the same outputs)."""
    for name, module in model.named_modules():
        if getattr(module, "qv_bias_only", False):
            key = f"{name}.qkv.bias"
            bias = out.get(key)
            if bias is None:
                if f"{name}.qkv.weight" in out:
                    out[key] = torch.zeros_like(module.qkv.bias, device="cpu")
                continue
            d = bias.shape[0] // 3
            out[key] = torch.cat([bias[:d], torch.zeros_like(bias[d : 2 * d]), bias[2 * d :]])


def _mixed_freqs(v: torch.Tensor, model, original: dict) -> torch.Tensor:
    """RoPE-Mixed frequencies in timm's layout [2, depth, H, d/2] (naver stores them as [2, depth, H * d/2])."""
    target = model.pe.encodings["rope2d"].freqs.shape
    if v.shape == target:
        return v
    if v.dim() == 3 and v.numel() == target.numel() and tuple(v.shape[:2]) == tuple(target[:2]):
        return v.reshape(target)
    raise CheckpointMismatch(
        f"the checkpoint's RoPE-Mixed frequencies have shape {tuple(v.shape)}, the model's {tuple(target)} "
        f"[2, depth, heads, head_dim/2]; it is {describe_checkpoint(original)}"
    )


def _map_irpe(key: str, v: torch.Tensor, model) -> tuple[str, torch.Tensor]:
    """blocks.{i}.attn.rpe_{t}.lookup_table_{weight|bias} (official iRPE) -> our table name and layout."""
    block, rest = key[len("blocks.") :].split(".attn.rpe_")
    target, kind = rest.split(".lookup_table_")
    irpe = dict(model.pe.encodings.items()).get("irpe")
    if irpe is None or target not in irpe.targets:
        raise CheckpointMismatch(
            f"the checkpoint has iRPE on {target} ({key}) but the model's PE {model.pe_name!r} has none there; "
            "use the matching preset (irpe for rpe_k, irpe_qkv for rpe_q/k/v)"
        )
    mode = "bias" if kind == "bias" else "contextual"
    if irpe.mode != mode:
        raise CheckpointMismatch(
            f"the checkpoint's iRPE is {mode} ({key}), the model's {irpe.mode}; pass mode={mode!r}"
        )
    if mode == "bias":
        name = f"{'q_' if target == 'q' else ''}bias_tables.{block}"
        v = v.t()  # [heads | 1, R] -> [R, heads | 1]
    else:
        name = f"tables.{target}.{block}"
        if target != "v":
            v = v.transpose(-1, -2)  # [heads | 1, d, R] -> [heads | 1, R, d]
        if irpe.shared_heads:
            if v.shape[0] != 1:
                raise CheckpointMismatch(f"{key} has a table per head; build the model with shared_heads=False")
            v = v[0]
    return f"pe.encodings.irpe.{name}", v.contiguous()
