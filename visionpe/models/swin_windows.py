"""Swin's (shifted) windows: how a feature map is cut into windows, and which window tokens may attend each other.

A `WindowPlan` fixes, for one H x W feature map, the window (clamped to the map, as in Swin: a map no larger than
the window is one window and is not shifted), the cyclic shift and the zero padding to whole windows. The map is
padded at the bottom/right first and then rolled by -shift (as the official detection/segmentation backbone does),
so wrapped rows and columns meet padding-free.

Inside a window every token gets window-local coordinates 0..ws-1 (`visionpe.layout.window_layout`). In a shifted
window the tokens come from up to four regions of the map that are not neighbours; the mask (-100 on the logits, as
in Swin) keeps each region to itself, and within a region the window-local offsets equal the offsets on the map, so
relative PEs see true relative positions. Padding tokens form a region of their own: real tokens never attend them.

Symbolic sizes (torch.export with dynamic H and W, torch.compile with dynamic shapes): the windows per axis are
computed once per map (ceil(H / wh)) and every view is written with them, so the padded size is the product
windows x window and no view needs to divide symbolic expressions (which made sympy take minutes per view). A branch
that cannot be decided without a guard on the sizes (pad or not, mask or not) takes its general form (pad by a
possibly zero amount, an all-zero mask), so the traced graph serves every size; the crop back is a negative pad
and the windows return to the map by a view of their contiguous layout, since a slice or a merging reshape would
ask for facts about the symbolic sizes that torch cannot prove (h <= Hp, nh % (nh * wh) != 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..layout.tokens import is_symbolic, shape_cache

__all__ = ["WindowPlan", "plan_windows", "window_partition", "window_reverse", "window_mask", "MASK_VALUE"]

MASK_VALUE = -100.0  # Swin's value for pairs in different regions (softmax weight ~ 4e-44)


@dataclass(frozen=True)
class WindowPlan:
    """How an H x W map is windowed: window (wh, ww), shift (sh, sw) and padded size (Hp, Wp)."""

    hw: tuple[int, int]
    window: tuple[int, int]
    shift: tuple[int, int]

    @property
    def counts(self) -> tuple[int, int]:
        """Windows per axis: ceil(H / wh), ceil(W / ww)."""
        return tuple((s + w - 1) // w for s, w in zip(self.hw, self.window))

    @property
    def padded(self) -> tuple[int, int]:
        return tuple(n * w for n, w in zip(self.counts, self.window))

    @property
    def num_windows(self) -> int:
        nh, nw = self.counts
        return nh * nw

    @property
    def window_area(self) -> int:
        return self.window[0] * self.window[1]

    @property
    def needs_padding(self) -> bool:
        """The map is not whole windows; True also when symbolic sizes leave it open (pad by a possibly zero
        amount rather than guard the traced graph on divisibility)."""
        return not all(_known_equal(p, s) for p, s in zip(self.padded, self.hw))

    @property
    def needs_mask(self) -> bool:
        return any(self.shift) or self.needs_padding

    def partition(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, W, C] -> pad, roll by -shift -> windows [B * nW, wh * ww, C]."""
        (h, w), (hp, wp) = self.hw, self.padded
        if self.needs_padding:
            x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
        if any(self.shift):
            x = torch.roll(x, shifts=(-self.shift[0], -self.shift[1]), dims=(1, 2))
        return window_partition(x, self.window, self.counts)

    def reverse(self, windows: torch.Tensor, batch: int | None = None) -> torch.Tensor:
        """windows [B * nW, wh * ww, C] -> roll back, crop -> [B, H, W, C] (`batch` B spares a division)."""
        x = window_reverse(windows, self.window, self.padded, self.counts, batch)
        if any(self.shift):
            x = torch.roll(x, shifts=self.shift, dims=(1, 2))
        h, w = self.hw
        if self.needs_padding:  # a negative pad crops (a slice would guard on h <= Hp, unprovable symbolically)
            x = F.pad(x, (0, 0, 0, w - self.padded[1], 0, h - self.padded[0]))
        return x


def _known_equal(a, b) -> bool:
    """a == b where it is decided: ints, symbolic sizes torch proves equal without a guard, or sizes torch.jit.trace
    records as tensors (fvcore's FLOP counter traces at one size), read as the value they hold."""
    equal = a == b
    return bool(equal) if isinstance(equal, torch.Tensor) else statically_known_true(equal)


def plan_windows(hw: tuple[int, int], window: tuple[int, int], shifted: bool) -> WindowPlan:
    """Swin's rule per axis: a map no larger than the window is one window, unshifted; else shift = window // 2."""
    fits = [s <= w for s, w in zip(hw, window)]  # (a plain comparison: torch.export decides it from the size range)
    win = tuple(s if f else w for s, w, f in zip(hw, window, fits))
    shift = tuple(0 if (not shifted or f) else w // 2 for w, f in zip(window, fits))
    return WindowPlan(tuple(hw), win, shift)


def window_partition(x: torch.Tensor, window: tuple[int, int], counts: tuple[int, int] | None = None) -> torch.Tensor:
    """[B, Hp, Wp, C] -> [B * nW, wh * ww, C], windows in raster order, tokens raster order inside.
    counts: windows per axis (Hp / wh, Wp / ww), when known (no division of symbolic sizes)."""
    B, H, W, C = x.shape
    wh, ww = window
    nh, nw = counts if counts is not None else (H // wh, W // ww)
    x = x.view(B, nh, wh, nw, ww, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(B * nh * nw, wh * ww, C)


def window_reverse(
    windows: torch.Tensor,
    window: tuple[int, int],
    padded: tuple[int, int],
    counts: tuple[int, int] | None = None,
    batch: int | None = None,
) -> torch.Tensor:
    """[B * nW, wh * ww, C] -> [B, Hp, Wp, C]; counts as in window_partition, batch B when known."""
    (wh, ww), (H, W) = window, padded
    nh, nw = counts if counts is not None else (H // wh, W // ww)
    C = windows.shape[-1]
    B = batch if batch is not None else -1
    x = windows.view(B, nh, nw, wh, ww, C).permute(0, 1, 3, 2, 4, 5)
    hp, wp = nh * wh, nw * ww
    if not is_symbolic((nh, nw)):
        return x.reshape(B, hp, wp, C)
    # Merging (nh, wh) -> Hp by reshape would guard on nh % (nh * wh) != 0, which torch cannot decide for a symbolic
    # nh; the contiguous [B, nh, wh, nw, ww, C] tensor already has the [B, Hp, Wp, C] layout, so view it directly.
    x = x.contiguous()
    return x.as_strided((x.shape[0], hp, wp, C), (hp * wp * C, wp * C, C, 1))


def region_ids(plan: WindowPlan) -> torch.Tensor:
    """Region id of every token of the rolled, padded map [Hp, Wp]; tokens may attend only their own region.

    Regions of a shifted map are Swin's 3 x 3 slices [0, Hp - wh), [Hp - wh, Hp - sh), [Hp - sh, Hp) per axis
    (wrapped tokens are apart from the rest); padding is region -1."""
    (h, w), (hp, wp), (sh, sw) = plan.hw, plan.padded, plan.shift

    def axis(n: int, win: int, s: int) -> torch.Tensor:  # 0 on [0, n - win), 1 on [n - win, n - s), 2 on [n - s, n)
        r = torch.arange(n)
        return (r >= n - win).long() + (r >= n - s).long() if s else torch.zeros_like(r)

    ids = axis(hp, plan.window[0], sh)[:, None] * 3 + axis(wp, plan.window[1], sw)[None, :]
    valid = (torch.arange(hp) < h)[:, None] & (torch.arange(wp) < w)[None, :]
    valid = torch.roll(valid, shifts=(-sh, -sw), dims=(0, 1))  # where the padding went after the roll
    return torch.where(valid, ids, torch.full_like(ids, -1))


@shape_cache(maxsize=32)
def _window_mask(plan: WindowPlan, device: str) -> torch.Tensor:
    ids = window_partition(region_ids(plan)[None, :, :, None], plan.window, plan.counts)[..., 0]  # [nW, N]
    mask = (ids[:, :, None] != ids[:, None, :]).float() * MASK_VALUE
    return mask.to(device)  # [nW, N, N]


def window_mask(plan: WindowPlan, device=None) -> torch.Tensor | None:
    """Additive mask [nW, N, N] (0 within a region, -100 across), or None when no window needs one."""
    if not plan.needs_mask:
        return None
    return _window_mask(plan, str(torch.device(device) if device is not None else torch.device("cpu")))
