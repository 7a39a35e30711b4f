"""Fine-tuning parameter groups through timm's optimizer factory: with layer decay every per-layer PE parameter gets
the lr scale of its block, shared PE parameters (APE, class token) the stem's, RoPE-Mixed's all-layer tensor the top
scale (as timm's eva); no_weight_decay lists exact parameter names (no wildcards)."""

from __future__ import annotations

import re

import pytest
import timm
import torch
from timm.optim import create_optimizer_v2

import visionpe  # noqa: F401  (registers the models)
from visionpe.pos import EVERY_LAYER

DECAY = 0.5  # each group's lr scale is DECAY x the next one's: blocks, stem and head all differ


def _groups(model: torch.nn.Module) -> dict[str, tuple[float, float]]:
    """parameter name -> (lr_scale, weight_decay) from the optimizer timm builds."""
    opt = create_optimizer_v2(model, "adamw", lr=1.0, weight_decay=0.05, layer_decay=DECAY)
    by_id = {id(p): (g["lr_scale"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}
    return {n: by_id[id(p)] for n, p in model.named_parameters()}


def _block_prefix(model: torch.nn.Module, i: int) -> str:
    """Name prefix of global block i's own parameters."""
    if hasattr(model, "blocks"):
        return f"blocks.{i}."
    s = max(j for j, start in enumerate(model.stage_starts) if start <= i)
    return f"{'layers' if hasattr(model, 'layers') else 'stages'}.{s}.blocks.{i - model.stage_starts[s]}."


def _stem_param(model: torch.nn.Module) -> str:
    return "patch_embed.proj.weight" if hasattr(model, "patch_embed") else "stages.0.patch_embed.proj.weight"


CASES = [
    ("vit_n_rope2d_mixed", set()),
    ("vit_n_irpe", {"pe.encodings.ape.pos_embed", "cls_token"}),
    ("vit_n_lepe", {"cls_token"}),
    ("vit_n_cpe", {"cls_token"}),
    ("swin_n_rpb", set()),
    ("swin_n_rope2d_mixed", set()),
    ("cvt_n_irpe", set()),
    ("cvt_n_cpe", set()),
    ("swin_n_fire2d", set()),  # one MLP per stage: the group of the stage's first block
    ("cvt_n_comrope_ld", set()),
]


@pytest.mark.parametrize("name, shared", CASES)
def test_per_layer_pe_parameters_get_their_blocks_lr_scale(name, shared):
    model = timm.create_model(name)
    groups = _groups(model)
    scale = {n: g[0] for n, g in groups.items()}
    stem = scale[_stem_param(model)]
    layer = {n: model.pe.layer_of(n[len("pe.") :]) for n in scale if n.startswith("pe.")}
    per_layer = {n: i for n, i in layer.items() if i is not None and i != EVERY_LAYER}
    if name != "vit_n_rope2d_mixed":  # the one model here whose PE keeps all layers in a single tensor
        assert per_layer, f"{name}: no per-layer PE parameters found"
    block_scales = []
    for n, i in per_layer.items():
        own = {scale[b] for b in scale if b.startswith(_block_prefix(model, i))}
        assert len(own) == 1, f"{name}: block {i} spans several groups {own}"
        assert scale[n] == own.pop(), f"{name}: {n} has lr scale {scale[n]}, its block {i} another"
        block_scales.append(scale[n])
    if per_layer:  # the blocks' scales really differ from the stem and from each other
        assert stem < min(block_scales) and len(set(block_scales)) == len(set(per_layer.values()))
    for n in shared:
        assert scale[n] == stem, f"{name}: shared {n} should be in the stem group"
    for n in (n for n in scale if n.startswith("pe.") and n not in per_layer):
        if layer[n] == EVERY_LAYER:  # RoPE-Mixed, all layers in one tensor: top group, as timm's eva
            assert scale[n] == 1.0 and scale[n] > max(scale[b] for b in scale if b.startswith("blocks."))
        else:
            assert scale[n] == stem, f"{name}: {n} is neither per-layer nor in the stem"


@pytest.mark.parametrize("name", ["vit_n_irpe", "swin_n_rpb", "cvt_n_irpe", "vit_n_rope2d_mixed_ape"])
def test_no_weight_decay_is_exact_and_applied(name):
    model = timm.create_model(name)
    nwd = model.no_weight_decay()
    params = dict(model.named_parameters())
    assert not [n for n in nwd if any(c in n for c in "*?[")], "wildcards need timm >= 1.0.21"
    pe_tables = [n for n in params if re.search(r"tables\.|pos_embed|rope2d\.freqs", n)]
    assert pe_tables and set(pe_tables) <= nwd
    groups = _groups(model)
    for n in pe_tables:
        assert groups[n][1] == 0.0, f"{name}: {n} is weight-decayed"
    assert groups[_stem_param(model)][1] == 0.05  # a matrix that is not listed keeps its decay


def test_a_stage_shared_pe_goes_with_its_stages_first_block():
    model = timm.create_model("swin_n_fire2d")  # FIRE: one MLP per stage, for every block of the stage
    scale = {n: g[0] for n, g in _groups(model).items()}
    for s, start in enumerate(model.stage_starts):
        assert model.pe.layer_of(f"encodings.fire2d.stages.{s}.c") == start
        assert scale[f"pe.encodings.fire2d.stages.{s}.c"] == scale[f"layers.{s}.blocks.0.norm1.weight"]
