"""Video ViT sizes x PE presets, registered with timm as vivit_{n,t,s,b}_{pe}."""

from __future__ import annotations

import torch

from ..models.video_vit import VideoViT
from .family import TOKEN_FEATURES, Family, same_name

VIDEO_SIZES = {  # DeiT widths; tubelets 2 x 16 x 16 over 16 frames (VideoMAE); n(ano) for CPU experiments
    "n": dict(embed_dim=96, depth=4, num_heads=4, patch_size=4, tubelet_size=2, img_size=32, num_frames=8),
    "t": dict(embed_dim=192, depth=12, num_heads=3, patch_size=16, tubelet_size=2, num_frames=16),
    "s": dict(embed_dim=384, depth=12, num_heads=6, patch_size=16, tubelet_size=2, num_frames=16),
    "b": dict(embed_dim=768, depth=12, num_heads=12, patch_size=16, tubelet_size=2, num_frames=16),
}

VIDEO_PES = {
    "ape": dict(pe="ape_st"),  # separable space + time, resampled
    **same_name(
        "rope3d",
        "mrope",
        "videorope",
        "vrope",
        "v2pe",
        "mrope_interleaved",
        "hope",
        "nope",
        "rope3d_p",
        "mrope_i",
        "mhrope",
    ),
    # learned rotations over (t, y, x)
    **{name: dict(pe=name, pe_kwargs={"lie_rope": {"num_axes": 3}}) for name in ("liere", "comrope_ap", "comrope_ld")},
}

VIDEO = Family(  # ViViT's paper (visionpe.papers)
    name="vivit",
    model_cls=VideoViT,
    sizes=VIDEO_SIZES,
    pes=VIDEO_PES,
    cfg=dict(num_classes=400, crop_pct=1.0, notes=("clips [B, C, T, H, W]; reference clip 16 frames (8 for size n)",)),
    feature_cfg=TOKEN_FEATURES,
    tiny=dict(embed_dim=32, depth=2, num_heads=2, patch_size=8, img_size=32, num_frames=4),
)


def example_input(size: int | tuple[int, int], batch: int = 2, frames: int | None = None) -> torch.Tensor:
    """A random clip batch [B, 3, T, H, W] (size: H = W or (H, W)); T = `frames`, by default growing with the size
    (32 px: 4 frames, 48 px: 5 frames, which pads to whole tubelets)."""
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn(batch, 3, frames or 2 + max(h, w) // 16, h, w)


VIDEO.example_input = example_input  # read by the generic zoo tests and benchmarks
