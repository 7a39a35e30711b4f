"""Published ViT / RoPE-ViT weights load into the matching visionpe model and give the same logits (random weights
stand in for the real checkpoints; nothing is downloaded)."""

import pytest
import timm
import torch
from safetensors.torch import save_file

import visionpe  # noqa: F401
from visionpe.pos import CheckpointMismatch

LS = dict(init_values=1e-5)
PAIRS = [
    ("vit_small_patch16_224", "vit_s_ape", {}),
    ("vit_base_patch16_224", "vit_b_ape", {}),
    ("vit_small_patch16_rope_224", "vit_s_rope2d", LS),
    ("vit_base_patch16_rope_224", "vit_b_rope2d", LS),
    ("vit_small_patch16_rope_mixed_224", "vit_s_rope2d_mixed", LS),
    ("vit_base_patch16_rope_mixed_224", "vit_b_rope2d_mixed", LS),
    ("vit_small_patch16_rope_ape_224", "vit_s_rope2d_ape", dict(LS, no_embed_class=True)),
    ("vit_small_patch16_rope_mixed_ape_224", "vit_s_rope2d_mixed_ape", dict(LS, no_embed_class=True)),
]
SHRINK = dict(depth=2)  # two blocks keep the round trip fast; every block type is still exercised


def _timm_checkpoint(name, tmp_path, **kw):
    ref = timm.create_model(name, **SHRINK, **kw)
    sd = ref.state_dict()
    for k, v in sd.items():  # random LayerScale / head / frequencies so that every tensor matters
        if "gamma" in k or k.startswith("head") or "freqs" in k:
            sd[k] = torch.randn_like(v) * 0.5
    ref.load_state_dict(sd)
    path = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return ref.eval(), path


@pytest.mark.parametrize("timm_name, ours, kwargs", PAIRS)
def test_checkpoint_round_trip_gives_the_same_logits(timm_name, ours, kwargs, tmp_path):
    ref, path = _timm_checkpoint(timm_name, tmp_path)
    model = timm.create_model(ours, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **SHRINK, **kwargs)
    model.eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        # two implementations (other kernels and summation orders) of the same 2 fp32 blocks of width 384-768 plus
        # head: ~sqrt(768) eps ~ 2e-6 relative per op, ~1e-5 at most on the logits; a wrong layer or filter is >> 1e-4
        assert (model(x) - ref(x)).abs().max() < 1e-4
        # at 320 timm's model is rebuilt for the new size (APE resampled by its own filter)
        ref320 = timm.create_model(
            timm_name, img_size=320, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **SHRINK
        ).eval()
        ape = model.pe.encodings["ape"] if "ape" in model.pe.names else None
        if ape is not None and ape.resample == "bicubic":  # RoPE-ViT +APE: naver's plain bicubic, not timm's filter
            ref320.pos_embed.copy_(ape.table((20, 20)))
        x = torch.randn(1, 3, 320, 320)
        assert (model(x) - ref320(x)).abs().max() < 1e-4  # as above, plus the same bicubic resample of the APE


@pytest.mark.parametrize(
    "timm_name, ours, kwargs, fix",
    [
        ("vit_small_patch16_224", "vit_s_rope2d_ape", {}, "has no LayerScale"),  # the tag's cfg adds LayerScale
        ("vit_small_patch16_rope_ape_224", "vit_s_rope2d_ape", dict(no_embed_class=False), "no_embed_class=True"),
        ("vit_small_patch16_rope_mixed_224", "vit_s_rope2d", LS, "rope2d_mixed"),
        ("vit_small_patch16_rope_ape_224", "vit_s_rope2d", {}, "_ape"),
        ("vit_small_patch16_rope_224", "vit_s_rope2d_mixed", LS, "rope2d"),
    ],
)
def test_architecture_mismatch_names_the_option_to_pass(timm_name, ours, kwargs, fix, tmp_path):
    _, path = _timm_checkpoint(timm_name, tmp_path)
    with pytest.raises(CheckpointMismatch, match=fix):
        timm.create_model(ours, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **SHRINK, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(pre_norm=True),  # CLIP-style norm before the blocks (norm_pre)
        dict(final_norm=False),
        dict(global_pool="avgmax"),  # fc_norm after the pool, as timm defaults it for avg / avgmax / max
        dict(global_pool="max", class_token=False),
        dict(global_pool="map"),  # timm's attention pooling (SigLIP's head) over the patch tokens
        dict(global_pool="map", pool_include_prefix=True, reg_tokens=2),  # over the CLS and registers too
        dict(act_layer="silu", norm_layer="rmsnorm", pos_drop_rate=0.1, attn_drop_rate=0.0),  # timm's names
    ],
)
def test_timm_vit_options_build_the_same_model(kwargs, tmp_path):
    """timm's VisionTransformer options build the model timm builds: its weights load and give its logits."""
    ref, path = _timm_checkpoint("vit_small_patch16_224", tmp_path, **kwargs)
    model = timm.create_model(
        "vit_s_ape", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **SHRINK, **kwargs
    ).eval()
    assert [type(m).__name__ for m in (model.norm_pre, model.norm, model.fc_norm)] == [
        type(m).__name__ for m in (ref.norm_pre, ref.norm, ref.fc_norm)
    ]
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert (model(x) - ref(x)).abs().max() < 1e-4  # as in the round trip above
