"""Multimodal encoder sizes x position schemes, registered with timm as mm_{n,t,s,b}_{scheme}."""

from __future__ import annotations

import torch

from ..models.multimodal import MultimodalEncoder
from ..pos.presets import PE_PRESETS
from .family import TOKEN_FEATURES, Family

MM_SIZES = {  # DeiT widths; n(ano) for CPU experiments on small images
    "n": dict(embed_dim=96, depth=4, num_heads=4, patch_size=4, tubelet_size=2, img_size=32),
    "t": dict(embed_dim=192, depth=12, num_heads=3, patch_size=16, tubelet_size=2),
    "s": dict(embed_dim=384, depth=12, num_heads=6, patch_size=16, tubelet_size=2),
    "b": dict(embed_dim=768, depth=12, num_heads=12, patch_size=16, tubelet_size=2),
}

# the language-model base theta = 10000 of the RoPE ladder (the video ViT keeps RoPE-ND's vision default, 100)
MM_PES = {
    scheme: dict(pe=scheme, pe_kwargs={PE_PRESETS[scheme][0][0]: {"theta": 10000.0}})  # the preset's rotary PE kind
    for scheme in ("rope1d", "mrope", "videorope", "vrope", "v2pe", "mrope_interleaved", "hope", "rope1d_p", "mrope_i",
                   "mhrope")
}  # fmt: skip

MM = Family(  # RoFormer's paper (visionpe.papers): 1D RoPE over the text and the visual tokens
    name="mm",
    model_cls=MultimodalEncoder,
    sizes=MM_SIZES,
    pes=MM_PES,
    cfg=dict(crop_pct=1.0, notes=("forward(pixels [B, C, H, W] or [B, C, T, H, W], text_ids=[B, L])",)),
    feature_cfg=TOKEN_FEATURES,
    tiny=dict(embed_dim=32, depth=2, num_heads=2, patch_size=8, img_size=32, vocab_size=32),
)


def example_input(size: int | tuple[int, int], batch: int = 2, frames: int | None = None) -> dict:
    """Random model kwargs (size: H = W or (H, W)): an image (up to 32 px without `frames`) or a clip of `frames`
    (default 4) frames, and 5 text ids."""
    h, w = (size, size) if isinstance(size, int) else size
    shape = (batch, 3, h, w) if max(h, w) <= 32 and not frames else (batch, 3, frames or 4, h, w)
    return {"pixels": torch.randn(shape), "text_ids": torch.randint(0, 32, (batch, 5))}


MM.example_input = example_input  # read by the generic zoo tests and benchmarks
