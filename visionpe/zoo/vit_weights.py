"""Loading published ViT weights: timm's ViT/DeiT, the RoPE-ViT and DINOv3 ports (timm's eva.py names), DINOv3's
official checkpoints (`storage_tokens` for the registers, `qkv.bias` with its `bias_mask`, `mask_token`), naver's
own RoPE-ViT checkpoints and the iRPE authors' DeiT checkpoints -> visionpe names.

The backbone maps its own tensors; every PE entry (APE, RoPE-Mixed frequencies, iRPE tables, DINOv3's RoPE periods)
goes to the PE that owns it (visionpe.pos.checkpoint, layout "vit"). A checkpoint whose architecture does not match
the model's options gets an error naming the option to pass (`init_values` for LayerScale; the PEs name theirs).
"""

from __future__ import annotations

import torch

from ..pos.base import CheckpointMismatch, CheckpointSource
from ..pos.checkpoint import is_visionpe_layout, place_flat_entries, split_pe_entries
from .checkpoint_filters import describe_checkpoint, ensure_fits, expect_blocks, unwrap

__all__ = ["checkpoint_filter_fn"]


def _check_layer_scale(state_dict: dict, model) -> None:
    has_ls_model = any(k.endswith("ls1.gamma") for k in model.state_dict())
    has_ls_ckpt = any(k.endswith(("gamma_1", "ls1.gamma")) for k in state_dict)
    if has_ls_ckpt and not has_ls_model:
        raise CheckpointMismatch("the checkpoint has LayerScale; build the model with init_values=1e-5")
    if has_ls_model and not has_ls_ckpt:
        raise CheckpointMismatch("the checkpoint has no LayerScale; build the model with init_values=None")


def checkpoint_filter_fn(state_dict: dict, model) -> dict:
    """Rename and reshape a timm ViT / DeiT / RoPE-ViT (eva) state dict for a visionpe VisionTransformer."""
    original = state_dict = unwrap(state_dict)
    if is_visionpe_layout(state_dict):  # already ours (maybe with flat PE names)
        return place_flat_entries(model, state_dict)
    expect_blocks(state_dict, "blocks.", "ViT")
    _check_layer_scale(state_dict, model)
    source = CheckpointSource("vit", model.pe_name, lambda: describe_checkpoint(original))
    out, rest = split_pe_entries(model.pe, state_dict, source)
    out = place_flat_entries(model, out)
    q_bias, k_bias, v_bias, bias_masks = {}, {}, {}, {}
    for k, v in rest.items():
        if k == "storage_tokens":  # DINOv3's registers
            k = "reg_token"
        if k == "mask_token" or k.startswith("local_cls_norm."):
            continue  # DINOv3's pretraining-only tensors
        if k.endswith("attn.k_bias"):  # eva's k bias (zero in timm's ports)
            k_bias[k[: -len("k_bias")]] = v
            continue
        if k.endswith("qkv.bias_mask"):
            bias_masks[k[: -len("bias_mask")] + "bias"] = v
            continue
        if k.endswith(".gamma_1"):
            k = k[: -len("gamma_1")] + "ls1.gamma"
        elif k.endswith(".gamma_2"):
            k = k[: -len("gamma_2")] + "ls2.gamma"
        elif k.endswith("attn.q_bias"):
            q_bias[k[: -len("q_bias")]] = v
            continue
        elif k.endswith("attn.v_bias"):
            v_bias[k[: -len("v_bias")]] = v
            continue
        out[k] = v
    sources = {}  # qkv.bias key -> the checkpoint key its k third comes from
    for prefix, kb in k_bias.items():
        if prefix not in q_bias and kb.any():
            raise CheckpointMismatch(f"checkpoint key {prefix}k_bias has no q_bias / v_bias beside it")
    for prefix, qb in q_bias.items():  # eva: q and v biases, the k bias zero unless the checkpoint has one
        out[prefix + "qkv.bias"] = torch.cat([qb, k_bias.get(prefix, torch.zeros_like(qb)), v_bias[prefix]])
        sources[prefix + "qkv.bias"] = prefix + "k_bias"
    for k, mask in bias_masks.items():  # DINOv3: the bias the official forward uses
        out[k] = out[k] * mask.to(out[k].dtype)
    _qv_biases(out, model, sources)
    ensure_fits(out, model, original, skip=("head.",))
    return out


def _qv_biases(out: dict, model, sources: dict) -> None:
    """A q/v-only bias model (qkv_bias="qv"): zeros where the checkpoint has no qkv bias (timm's bias-free DINOv3
    ports: the released biases are zero, so zeros give the same outputs); a checkpoint k bias that is not zero (after
    DINOv3's bias_mask) is refused, since the model cannot hold it (with RoPE it changes the outputs)."""
    for name, module in model.named_modules():
        if getattr(module, "qv_bias_only", False):
            key = f"{name}.qkv.bias"
            bias = out.get(key)
            if bias is None:
                if f"{name}.qkv.weight" in out:
                    out[key] = torch.zeros_like(module.qkv.bias, device="cpu")
                continue
            d = bias.shape[0] // 3
            if bias[d : 2 * d].any():
                raise CheckpointMismatch(
                    f"checkpoint key {sources.get(key, key)} has a non-zero k bias, which a qkv_bias='qv' model "
                    "cannot hold; build the model with qkv_bias=True"
                )
