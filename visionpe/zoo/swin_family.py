"""Swin sizes x PE presets, registered with timm as swin_{n,t,s,b}_{pe}."""

from __future__ import annotations

from ..models.swin import SwinTransformer
from .family import Family, same_name
from .swin_weights import checkpoint_filter_fn

SWIN_SIZES = {  # paper dims; n(ano) is for CPU experiments on small images (32 px -> maps 16, 8, 4, 2)
    "n": dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=4, patch_size=2, img_size=32),
    "t": dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7, patch_size=4),
    "s": dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24), window_size=7, patch_size=4),
    "b": dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32), window_size=7, patch_size=4),
}

# every PE on Swin reads window-local coordinates (LieRE's normalised by the window)
SWIN_PES = {
    "rpb": dict(pe="rpb"),  # Swin's relative position bias (the paper's model)
    "rope2d": dict(pe="rope2d", pe_kwargs={"rope2d": {"theta": 50.0}}),  # RoPE-ViT's Swin: axial, theta 50
    "rope2d_mixed": dict(pe="rope2d_mixed"),
    "rope2d_p": dict(pe="rope2d_p", pe_kwargs={"rope2d": {"theta": 50.0}}),  # p-RoPE on that Swin RoPE
    # iRPE contextual on k in place of the bias: with the learned APE as on every family (Swin's own `ape` option, on
    # the patch grid before the first stage), and alone (irpe_k; what swin_*_irpe built before #43)
    **same_name("irpe", "irpe_k"),
    **same_name("lepe", "liere", "comrope_ap", "comrope_ld", "nope", "alibi2d", "fire2d"),
    **same_name("string_cayley", "string_circulant", "rope2d_spiral"),  # STRING, Spiral RoPE
    **same_name("seqpe"),  # SeqPE on the layer's own grid (visionpe.pos.seqpe_grids)
}

SWIN = Family(
    name="swin",
    model_cls=SwinTransformer,
    sizes=SWIN_SIZES,
    pes=SWIN_PES,
    # pool_size: the last stage's map at 224 px (patch 4, three merges); 32 px for size n (patch 2)
    cfg=dict(crop_pct=0.9, classifier="head.fc", license="mit", pool_size=(7, 7)),
    size_cfg={"n": dict(pool_size=(2, 2))},
    filter_fn=checkpoint_filter_fn,
    feature_cfg=dict(out_indices=(0, 1, 2, 3), feature_cls="getter"),
    tiny=dict(embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=4, patch_size=2, img_size=32, num_classes=10),
    test_sizes=(32, 44),
)
