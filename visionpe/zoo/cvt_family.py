"""CvT sizes x PE presets, registered with timm as cvt_{n,13,21,w24}[_{pe}] (no suffix: the paper's model, no PE)."""

from __future__ import annotations

from ..models.cvt import ConvolutionalVisionTransformer
from .cvt_weights import checkpoint_filter_fn
from .family import Family, same_name

_NANO_EMBED = dict(patch_size=(3, 3, 3), patch_stride=(2, 2, 2), patch_padding=(1, 1, 1))  # 32 px -> 16, 8, 4

CVT_SIZES = {  # paper dims; n(ano) is for CPU experiments on small images
    "n": dict(embed_dims=(32, 64, 128), num_heads=(1, 2, 4), depths=(1, 1, 3), img_size=32, **_NANO_EMBED),
    "13": dict(embed_dims=(64, 192, 384), num_heads=(1, 3, 6), depths=(1, 2, 10)),
    "21": dict(embed_dims=(64, 192, 384), num_heads=(1, 3, 6), depths=(1, 4, 16)),
    "w24": dict(embed_dims=(192, 768, 1024), num_heads=(3, 12, 16), depths=(2, 2, 20)),
}

# keys / values at their cell centres (LieRE normalised by the query grid); a CPE after the first block of a stage
CVT_PES = {
    "": dict(pe="nope"),  # the paper's models
    "rope2d": dict(pe="rope2d"),
    "rope2d_mixed": dict(pe="rope2d_mixed"),
    "rope2d_p": dict(pe="rope2d_p"),
    # iRPE contextual on k: with the learned APE as on every family (on stage 1's grid), and alone (irpe_k; what
    # cvt_*_irpe built before #43)
    **same_name("irpe", "irpe_k"),
    **same_name("cpe", "liere", "comrope_ap", "comrope_ld", "alibi2d", "fire2d"),
    **same_name("string_cayley", "string_circulant", "rope2d_spiral"),  # STRING, Spiral RoPE
    **same_name("seqpe"),  # SeqPE on the layer's own grid (visionpe.pos.seqpe_grids)
}

ACT_NOTE = (
    "Official CvT weights use QuickGELU (act_layer='quick_gelu', the default); the Hugging Face transformers port "
    "(CvtForImageClassification) uses exact GELU: build with act_layer='gelu' to reproduce its outputs.",
    "Attention scale is dim^-0.5 over the full width (official quirk, kept for weight compatibility).",
)

CVT = Family(
    name="cvt",
    model_cls=ConvolutionalVisionTransformer,
    sizes=CVT_SIZES,
    pes=CVT_PES,
    cfg=dict(first_conv="stages.0.patch_embed.proj", license="mit", notes=ACT_NOTE),
    filter_fn=checkpoint_filter_fn,
    feature_cfg=dict(out_indices=(0, 1, 2), feature_cls="getter"),
    tiny=dict(
        embed_dims=(16, 32, 64), num_heads=(1, 2, 4), depths=(1, 1, 1), img_size=32, num_classes=10, **_NANO_EMBED
    ),
    test_sizes=(32, 44),
)
