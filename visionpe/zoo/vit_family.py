"""ViT sizes x PE presets, registered with timm as vit_{n,t,s,b,l}_{pe}."""

from __future__ import annotations

from ..models.vit import VisionTransformer
from .family import Family, same_name
from .vit_weights import checkpoint_filter_fn

VIT_SIZES = {  # DeiT dims; n(ano) is for CPU experiments on small images
    "n": dict(embed_dim=96, depth=4, num_heads=4, patch_size=4, img_size=32),
    "t": dict(embed_dim=192, depth=12, num_heads=3, patch_size=16),
    "s": dict(embed_dim=384, depth=12, num_heads=6, patch_size=16),
    "b": dict(embed_dim=768, depth=12, num_heads=12, patch_size=16),
    "l": dict(embed_dim=1024, depth=24, num_heads=16, patch_size=16),
}

# DINOv3's ViT around its RoPE: 4 registers, LayerScale 1e-5, q/v-only qkv bias, LayerNorm eps 1e-5, no APE; the
# final norm before average pooling over the patches, as timm's port (global_pool="token" for DINOv3's CLS)
DINOV3_ARCH = dict(reg_tokens=4, init_values=1e-5, qkv_bias="qv", norm_eps=1e-5, global_pool="avg", fc_norm=False)

# cpe_gap: CPVT-GAP's average pooling, fuzzy_atm: ViTAR's token merger (model options of the presets)
VIT_PES = {
    **same_name("ape", "sincos", "nope", "rope2d", "rope2d_mixed", "rope2d_ape", "rope2d_mixed_ape", "rope2d_p"),
    **same_name("irpe", "irpe_bias", "irpe_qkv", "cpe", "cpe_gap", "lepe", "fuzzy", "fuzzy_atm"),
    "rope2d_dinov3": dict(pe="rope2d_dinov3", **DINOV3_ARCH),  # DINOv3's ViT (timm's vit_*_patch16_dinov3)
    # the same model trained as DINOv3 trains it: coordinates rescaled by a log-uniform factor in [1/2, 2] per layer
    # (training only; in eval it equals rope2d_dinov3)
    "rope2d_dinov3_aug": dict(pe="rope2d_dinov3", pe_kwargs=dict(rescale_coords=2.0), **DINOV3_ARCH),
    **same_name("liere", "comrope_ap", "comrope_ld", "alibi2d", "fire2d"),
    **same_name("lookhere", "lookhere_90", "lookhere_45"),  # LH-180, LH-90, LH-45
    **same_name("string_cayley", "string_circulant", "rope2d_spiral", "rope2d_spiral_ape"),  # STRING, Spiral RoPE
    **same_name("lff", "ape_radio"),  # learnable Fourier features, RADIO's cropped APE
    **same_name("seqpe"),  # SeqPE: digit sequences through a small transformer, q * pe_q and k * pe_k
}

VIT = Family(  # DeiT's paper (visionpe.papers)
    name="vit",
    model_cls=VisionTransformer,
    sizes=VIT_SIZES,
    pes=VIT_PES,
    filter_fn=checkpoint_filter_fn,
    tiny=dict(embed_dim=32, depth=2, num_heads=2, patch_size=8, img_size=32, num_classes=10),
    test_sizes=(32, 40),
)
