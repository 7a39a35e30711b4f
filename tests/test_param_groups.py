"""Fine-tuning parameter groups through timm's optimizer factory: with layer decay every per-layer PE parameter (it
lives in its block, `<block>.attn.pos.<kind>.*`) gets the lr scale of its block, the model-level PE (`pe.*`: APE,
FIRE's stage MLPs) and the class token the stem's; no_weight_decay lists exact parameter names (no wildcards)."""

from __future__ import annotations

import re

import pytest
import timm
import torch
from timm.optim import create_optimizer_v2

import visionpe  # noqa: F401  (registers the models)

DECAY = 0.5  # each group's lr scale is DECAY x the next one's: blocks, stem and head all differ


def _groups(model: torch.nn.Module) -> dict[str, tuple[float, float]]:
    """parameter name -> (lr_scale, weight_decay) from the optimizer timm builds."""
    opt = create_optimizer_v2(model, "adamw", lr=1.0, weight_decay=0.05, layer_decay=DECAY)
    by_id = {id(p): (g["lr_scale"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}
    return {n: by_id[id(p)] for n, p in model.named_parameters()}


def _stem_param(model: torch.nn.Module) -> str:
    return "patch_embed.proj.weight" if hasattr(model, "patch_embed") else "stages.0.patch_embed.proj.weight"


CASES = [
    ("vit_n_rope2d_mixed", set()),
    ("vit_n_irpe", {"pe.encodings.ape.pos_embed", "cls_token"}),
    ("vit_n_lepe", {"cls_token"}),
    ("vit_n_cpe", {"cls_token"}),
    ("swin_n_rpb", set()),
    ("swin_n_rope2d_mixed", set()),
    ("cvt_n_irpe_k", set()),
    ("swin_n_irpe", {"pe.encodings.ape.pos_embed"}),  # iRPE per layer, its APE model-level (the stem)
    ("cvt_n_cpe", set()),
    ("swin_n_fire2d", {"pe.encodings.fire2d.stages.0.c"}),  # one MLP per stage, model-level: the stem
    ("cvt_n_comrope_ld", set()),
]


@pytest.mark.parametrize("name, shared", CASES)
def test_per_layer_pe_parameters_get_their_blocks_lr_scale(name, shared):
    model = timm.create_model(name)
    groups = _groups(model)
    scale = {n: g[0] for n, g in groups.items()}
    stem = scale[_stem_param(model)]
    per_layer = {n: n.split(".attn.pos.")[0] + "." for n in scale if ".attn.pos." in n}  # name -> its block
    if name != "swin_n_fire2d":  # FIRE's parameters serve a whole stage
        assert per_layer, f"{name}: no per-layer PE parameters found"
    block_scales = {}
    for n, block in per_layer.items():
        own = {scale[b] for b in scale if b.startswith(block) and ".attn.pos." not in b}
        assert len(own) == 1, f"{name}: block {block} spans several groups {own}"
        assert scale[n] == own.pop(), f"{name}: {n} has lr scale {scale[n]}, its block {block} another"
        block_scales[block] = scale[n]
    if per_layer:  # the blocks' scales really differ from the stem and from each other
        assert stem < min(block_scales.values()) and len(set(block_scales.values())) == len(block_scales)
    for n in shared:
        assert scale[n] == stem, f"{name}: shared {n} should be in the stem group"
    for n in (n for n in scale if n.startswith("pe.")):
        assert scale[n] == stem, f"{name}: model-level {n} is not in the stem"


@pytest.mark.parametrize("name", ["vit_n_irpe", "swin_n_rpb", "cvt_n_irpe", "vit_n_rope2d_mixed_ape"])
def test_no_weight_decay_is_exact_and_applied(name):
    model = timm.create_model(name)
    nwd = model.no_weight_decay()
    params = dict(model.named_parameters())
    assert not [n for n in nwd if any(c in n for c in "*?[")], "wildcards need timm >= 1.0.21"
    pe_tables = [n for n in params if re.search(r"irpe\.|pos_embed|rope2d\.freqs", n)]
    assert pe_tables and set(pe_tables) <= nwd
    groups = _groups(model)
    for n in pe_tables:
        assert groups[n][1] == 0.0, f"{name}: {n} is weight-decayed"
    assert groups[_stem_param(model)][1] == 0.05  # a matrix that is not listed keeps its decay


def test_a_stage_shared_pe_stays_model_level_in_the_stem_group():
    model = timm.create_model("swin_n_fire2d")  # FIRE: one MLP per stage, for every block of the stage
    scale = {n: g[0] for n, g in _groups(model).items()}
    for s in range(len(model.stage_starts)):
        assert scale[f"pe.encodings.fire2d.stages.{s}.c"] == scale[_stem_param(model)]
        assert scale[f"pe.encodings.fire2d.stages.{s}.c"] < scale[f"layers.{s}.blocks.0.norm1.weight"]
