"""Swin's (shifted) windows: how a feature map is cut into windows, and which window tokens may attend each other.

A `WindowPlan` fixes, for one H x W feature map, the window (clamped to the map, as in Swin: a map no larger than
the window is one window and is not shifted), the cyclic shift and the zero padding to whole windows. The map is
padded at the bottom/right first and then rolled by -shift (as the official detection/segmentation backbone does),
so wrapped rows and columns meet padding-free.

Inside a window every token gets window-local coordinates 0..ws-1 (`visionpe.layout.window_layout`). In a shifted
window the tokens come from up to four regions of the map that are not neighbours; the mask (-100 on the logits, as
in Swin) keeps each region to itself, and within a region the window-local offsets equal the offsets on the map, so
relative PEs see true relative positions. Padding tokens form a region of their own: real tokens never attend them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..layout import shape_cache

__all__ = ["WindowPlan", "plan_windows", "window_partition", "window_reverse", "window_mask", "MASK_VALUE"]

MASK_VALUE = -100.0  # Swin's value for pairs in different regions (softmax weight ~ 4e-44)


@dataclass(frozen=True)
class WindowPlan:
    """How an H x W map is windowed: window (wh, ww), shift (sh, sw) and padded size (Hp, Wp)."""

    hw: tuple[int, int]
    window: tuple[int, int]
    shift: tuple[int, int]

    @property
    def padded(self) -> tuple[int, int]:
        return tuple(-(-s // w) * w for s, w in zip(self.hw, self.window))

    @property
    def num_windows(self) -> int:
        (hp, wp), (wh, ww) = self.padded, self.window
        return (hp // wh) * (wp // ww)

    @property
    def window_area(self) -> int:
        return self.window[0] * self.window[1]

    @property
    def needs_mask(self) -> bool:
        return any(self.shift) or self.padded != self.hw

    def partition(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, W, C] -> pad, roll by -shift -> windows [B * nW, wh * ww, C]."""
        (h, w), (hp, wp) = self.hw, self.padded
        if (hp, wp) != (h, w):
            x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
        if any(self.shift):
            x = torch.roll(x, shifts=(-self.shift[0], -self.shift[1]), dims=(1, 2))
        return window_partition(x, self.window)

    def reverse(self, windows: torch.Tensor) -> torch.Tensor:
        """windows [B * nW, wh * ww, C] -> roll back, crop -> [B, H, W, C]."""
        x = window_reverse(windows, self.window, self.padded)
        if any(self.shift):
            x = torch.roll(x, shifts=self.shift, dims=(1, 2))
        (h, w), (hp, wp) = self.hw, self.padded
        if (hp, wp) != (h, w):
            x = x[:, :h, :w].contiguous()
        return x


def plan_windows(hw: tuple[int, int], window: tuple[int, int], shifted: bool) -> WindowPlan:
    """Swin's rule per axis: a map no larger than the window is one window, unshifted; else shift = window // 2."""
    win = tuple(min(s, w) for s, w in zip(hw, window))
    shift = tuple(0 if (not shifted or s <= w) else w // 2 for s, w in zip(hw, window))
    return WindowPlan(tuple(hw), win, shift)


def window_partition(x: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """[B, Hp, Wp, C] -> [B * nW, wh * ww, C], windows in raster order, tokens raster order inside."""
    B, H, W, C = x.shape
    wh, ww = window
    x = x.view(B, H // wh, wh, W // ww, ww, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, wh * ww, C)


def window_reverse(windows: torch.Tensor, window: tuple[int, int], padded: tuple[int, int]) -> torch.Tensor:
    """[B * nW, wh * ww, C] -> [B, Hp, Wp, C]."""
    (wh, ww), (H, W) = window, padded
    C = windows.shape[-1]
    x = windows.view(-1, H // wh, W // ww, wh, ww, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, H, W, C)


def region_ids(plan: WindowPlan) -> torch.Tensor:
    """Region id of every token of the rolled, padded map [Hp, Wp]; tokens may attend only their own region.

    Regions of a shifted map are Swin's 3 x 3 slices [0, Hp - wh), [Hp - wh, Hp - sh), [Hp - sh, Hp) per axis
    (wrapped tokens are apart from the rest); padding is region -1."""
    (h, w), (hp, wp), (sh, sw) = plan.hw, plan.padded, plan.shift

    def axis(n: int, win: int, s: int) -> torch.Tensor:
        ids = torch.zeros(n, dtype=torch.long)
        if s:
            ids[n - win : n - s] = 1
            ids[n - s :] = 2
        return ids

    ids = axis(hp, plan.window[0], sh)[:, None] * 3 + axis(wp, plan.window[1], sw)[None, :]
    valid = torch.zeros(hp, wp, dtype=torch.bool)
    valid[:h, :w] = True
    valid = torch.roll(valid, shifts=(-sh, -sw), dims=(0, 1))  # where the padding went after the roll
    return torch.where(valid, ids, torch.full_like(ids, -1))


@shape_cache(maxsize=32)
def _window_mask(plan: WindowPlan, device: str) -> torch.Tensor:
    ids = window_partition(region_ids(plan)[None, :, :, None], plan.window)[..., 0]  # [nW, N]
    mask = (ids[:, :, None] != ids[:, None, :]).float() * MASK_VALUE
    return mask.to(device)  # [nW, N, N]


def window_mask(plan: WindowPlan, device=None) -> torch.Tensor | None:
    """Additive mask [nW, N, N] (0 within a region, -100 across), or None when no window needs one."""
    if not plan.needs_mask:
        return None
    return _window_mask(plan, str(torch.device(device) if device is not None else torch.device("cpu")))
