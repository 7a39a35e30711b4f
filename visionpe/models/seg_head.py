"""A linear segmentation head on any timm backbone with `forward_intermediates`: the last block's patch tokens as a
map (NCHW), a 1x1 convolution to class logits, upsampled bilinearly to the input's pixels (visionpe-bench segment)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LinearSegmenter"]


class LinearSegmenter(nn.Module):
    """backbone -> last block's tokens [B, C, h, w] (normalised) -> 1x1 conv -> logits [B, K, H, W] at the input's
    size. Position modes pass through to the backbone, so the benchmark's protocols treat it as the backbone."""

    def __init__(self, backbone: nn.Module, num_classes: int, probe_size: tuple[int, int] = (32, 32)):
        super().__init__()
        if not callable(getattr(backbone, "forward_intermediates", None)):
            raise ValueError(f"{type(backbone).__name__} has no forward_intermediates; the segmentation head reads it")
        self.backbone = backbone
        with torch.no_grad():  # the feature width, from one small input
            was = backbone.training
            backbone.eval()
            chans = self.features(torch.zeros(1, self.in_chans, *probe_size)).shape[1]
            backbone.train(was)
        self.head = nn.Conv2d(chans, num_classes, 1)

    @property
    def in_chans(self) -> int:
        embed = getattr(self.backbone, "patch_embed", None)
        proj = getattr(embed, "proj", None)
        return int(getattr(proj, "in_channels", None) or getattr(self.backbone, "in_chans", 3))

    # the backbone's test-time position modes (visionpe.bench.protocols reads and sets these)
    @property
    def position_modes(self):
        return getattr(self.backbone, "position_modes", None)

    @property
    def position_mode(self) -> str | None:
        return getattr(self.backbone, "position_mode", None)

    @position_mode.setter
    def position_mode(self, mode: str) -> None:
        self.backbone.position_mode = mode

    def no_weight_decay(self) -> set[str]:
        """The backbone's parameters kept out of weight decay (timm's optimizer factory reads this)."""
        own = getattr(self.backbone, "no_weight_decay", None)
        return {f"backbone.{name}" for name in (own() if callable(own) else ())}

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's tokens as a map [B, C, h, w]."""
        (out,) = self.backbone.forward_intermediates(
            x, indices=1, norm=True, output_fmt="NCHW", intermediates_only=True
        )
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        logits = self.head(self.features(x))
        gh, gw = logits.shape[-2:]
        # each token covers stride px (an input not a multiple of the patch is padded at the bottom/right): upsample
        # the grid to the padded size, then keep the input's pixels
        stride = max(math.ceil(h / gh), math.ceil(w / gw))
        logits = F.interpolate(logits, size=(gh * stride, gw * stride), mode="bilinear", align_corners=False)
        return logits[..., :h, :w]
