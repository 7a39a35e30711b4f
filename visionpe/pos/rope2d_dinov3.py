"""DINOv3's RoPE (Simeoni et al. 2025): axial RoPE over patch centres normalised to [-1, 1], rotate-half layout.

For an H x W grid, patch (i, j) sits at h = 2 (i + 0.5) / den_h - 1, w = 2 (j + 0.5) / den_w - 1, with
den = (H, W) (`normalize_coords="separate"`, every released model), (min, min) or (max, max) of H and W.
Periods p_k, k = 0..d/4-1: base^(k / (d/4)) (base 100), or geometric from min_period to max_period. Angles
2 pi * coord / p_k, h-angles first: pair c (channels c and c + d/2) turns with h for c < d/4 and with w above.
Prefix tokens (CLS, registers) are not rotated. The periods are fixed fp32 buffers (kept fp32 under
`model.to(torch.bfloat16)`), not in the state dict (official checkpoints store them; the filter drops them).

Sizes: the coordinates follow the input's own grid (a larger image samples the same box more densely), in the
`extrapolate` and `interpolate` position modes alike, as in the official code. In the `ntk` / `yarn` modes the
coordinates keep the reference grid's spacing (the box grows with the input) and the frequencies are rescaled
(visionpe.pos.rope_scaling). Training-time coordinate augmentation (shift/jitter/rescale_coords; DINOv3 trains with
rescale_coords=2) is drawn afresh for every layer, as the official code draws it for every block. p-RoPE (`p`,
Barbero et al., ICLR 2025) keeps the fraction p of each axis' periods, the shortest; the longest become +inf
(frequency 0: no rotation).
"""

from __future__ import annotations

import math

import torch

from ..layout.tokens import TokenLayout, shape_cache
from .base import PEHost, PosContext, PosEncoding
from .coord_aug import CoordAugment
from .rope_scaling import Ladder, base_ladder, check_yarn_ramp, rope_scaling, scale_frequencies, yarn_temperature
from .rotary import FixedCosSinCache, apply_rotary, check_p_rope, p_rope_keep, scaled_cos_sin

__all__ = ["RoPE2DDinoV3", "dinov3_coords", "dinov3_periods"]

NORMALIZE = ("separate", "min", "max")


def dinov3_periods(
    head_dim: int, base: float | None = 100.0, min_period: float | None = None, max_period: float | None = None
) -> torch.Tensor:
    """The d/4 periods [fp32]: base^(k / (d/4)), or min_period * (max_period / min_period)^(k / (d/4 - 1))."""
    n = head_dim // 4
    if min_period is not None:
        return min_period * (max_period / min_period) ** torch.linspace(0, 1, n, dtype=torch.float32)
    return base ** (torch.arange(n, dtype=torch.float32) / n)


def _denominators(h: int, w: int, normalize: str) -> tuple[int, int]:
    if normalize == "min":
        return (min(h, w),) * 2
    if normalize == "max":
        return (max(h, w),) * 2
    return h, w


@shape_cache(maxsize=64)
@torch.inference_mode(False)
def _coords(h: int, w: int, den_h: float, den_w: float, device: str) -> torch.Tensor:
    ch = (torch.arange(h, dtype=torch.float32) + 0.5) / den_h
    cw = (torch.arange(w, dtype=torch.float32) + 0.5) / den_w
    grid = torch.stack(torch.meshgrid(ch, cw, indexing="ij"), dim=-1).flatten(0, 1)  # [H*W, (h, w)], row-major
    return (2.0 * grid - 1.0).to(device)


def dinov3_coords(
    h: int, w: int, normalize: str = "separate", box: tuple[int, int] | None = None, device=None
) -> torch.Tensor:
    """Patch-centre coordinates [H*W, 2] with columns (h, w), in DINOv3's [-1, 1] box of the grid `box` (default the
    grid itself; a larger grid than the box extends past [-1, 1] with the box's spacing)."""
    den_h, den_w = _denominators(*(box or (h, w)), normalize)
    return _coords(h, w, float(den_h), float(den_w), str(torch.device(device or "cpu")))


class RoPE2DDinoV3(PosEncoding):
    """DINOv3 RoPE on q and k of every layer; options as in the official module (base or min/max_period,
    normalize_coords, shift/jitter/rescale_coords), yarn_ramp: the `yarn` mode's ramp (visionpe.pos.rope_scaling),
    and p: p-RoPE's kept fraction of each axis' periods (1: all).
    The official checkpoints' `rope_embed.periods` are fixed (the options rebuild them) and dropped."""

    positive_options = ("base", "min_period", "max_period")
    checkpoint_buffers = {"vit": r"^rope_embed\."}

    def __init__(
        self,
        host: PEHost,
        base: float | None = None,
        min_period: float | None = None,
        max_period: float | None = None,
        normalize_coords: str = "separate",
        shift_coords: float | None = None,
        jitter_coords: float | None = None,
        rescale_coords: float | None = None,
        yarn_ramp: str = "reference",
        p: float = 1.0,
    ):
        super().__init__(host)
        self.yarn_ramp = check_yarn_ramp(yarn_ramp)
        self.p = check_p_rope(p)
        if (min_period is None) != (max_period is None):
            raise ValueError("give both min_period and max_period (or neither, for the base form)")
        if min_period is not None and base is not None:
            raise ValueError("base and min_period/max_period are exclusive: give one form of the periods")
        if min_period is not None and not 0 < min_period <= max_period:
            raise ValueError(f"need 0 < min_period <= max_period, got {min_period} and {max_period}")
        if normalize_coords not in NORMALIZE:
            raise ValueError(f"normalize_coords must be one of {NORMALIZE}, got {normalize_coords!r}")
        self.base = None if min_period is not None else float(100.0 if base is None else base)
        self.min_period, self.max_period = min_period, max_period
        self.normalize_coords = normalize_coords
        self.coord_aug = CoordAugment(shift_coords, jitter_coords, rescale_coords)
        self.head_dims = sorted({spec.head_dim for spec in host.layers})
        for d in self.head_dims:
            if d % 4:
                raise ValueError(f"DINOv3 RoPE needs head dims divisible by 4, got {d}")
            self.register_buffer(self._name(d), self._periods(d), persistent=False)
        self._cos_sin_cache = FixedCosSinCache()

    @staticmethod
    def _name(d: int) -> str:
        return f"periods_{d}"

    def _periods(self, d: int, device=None) -> torch.Tensor:
        periods = dinov3_periods(d, self.base, self.min_period, self.max_period)
        if self.p < 1.0:  # p-RoPE: the longest periods of the axis' ladder dropped (frequency 2 pi / inf = 0)
            periods = periods.masked_fill(~p_rope_keep([0] * (d // 4), self.p), math.inf)
        return periods.to(device)

    def periods(self, head_dim: int) -> torch.Tensor:
        return getattr(self, self._name(head_dim))

    def ladder(self, head_dim: int) -> Ladder:
        """The ladder of the frequencies 2 pi / p_k (yarn's reference ramp)."""
        n = head_dim // 4
        if self.base is not None:
            return base_ladder(self.base, n, first=2 * math.pi)
        spread = math.log(self.max_period / self.min_period)
        return Ladder(2 * math.pi / self.min_period, spread / (n - 1) if n > 1 and spread > 0 else 1.0, n)

    def init_non_persistent_buffers(self) -> None:
        """Refill the periods (e.g. after building on the meta device and `to_empty`)."""
        for d in self.head_dims:
            buf = self.periods(d)
            buf.copy_(self._periods(d, buf.device))

    def _apply(self, fn, *args, **kwargs):
        super()._apply(fn, *args, **kwargs)
        for d in self.head_dims:  # a cast to a low precision (model.to(bfloat16)): the periods stay fp32
            buf = self.periods(d)
            if buf.dtype != torch.float32 and buf.is_floating_point():
                self.register_buffer(self._name(d), self._periods(d, buf.device), persistent=False)
        return self

    def frequencies(self, head_dim: int) -> torch.Tensor:
        """F [2 (h, w), d/2]: 2 pi / periods on the h half of the pairs, then on the w half."""
        f = 2 * math.pi / self.periods(head_dim)
        zero = torch.zeros_like(f)
        return torch.stack([torch.cat([f, zero]), torch.cat([zero, f])])

    @staticmethod
    def _hw(layout: TokenLayout) -> tuple[int, int]:
        if layout.grid is None or layout.grid[0] != 1 or layout.streams != 2:
            raise ValueError(f"DINOv3 RoPE needs an image grid layout, got grid={layout.grid}")
        return layout.hw

    def _coords(self, layout: TokenLayout, box=None) -> torch.Tensor:
        return dinov3_coords(*self._hw(layout), self.normalize_coords, box, layout.pos.device)

    def _cos_sin(self, i: int, layout: TokenLayout, scaling=None, box=None, drawn=None):
        """box: the grid whose [-1, 1] box the coordinates fill (None: the layout's own grid); drawn: the coordinates
        under this layer's coordinate augmentation (training; never cached), else None."""
        d, ref = self.host.layers[i].head_dim, tuple(self.host.grid)
        den = _denominators(*ref, self.normalize_coords)
        extents = (2.0 * ref[0] / den[0], 2.0 * ref[1] / den[1])  # the training box, in coordinate units
        freqs = scale_frequencies(self.frequencies(d), scaling, d, extents, ladder=self.ladder(d))
        gain = yarn_temperature(scaling)
        if drawn is not None:
            return scaled_cos_sin(drawn, freqs, layout.num_prefix, half=True, gain=gain)
        return self._cos_sin_cache(layout, freqs, tag=scaling, half=True, gain=gain, pos=self._coords(layout, box))

    def context(self, i, layout, kv_layout=None, own=None):
        (h, w), ref = self._hw(layout), tuple(self.host.grid)
        scaling = rope_scaling(self.position_mode, (h, w), ref, self.yarn_ramp)
        box = ref if scaling is not None else None  # ntk / yarn: the training spacing
        layouts, boxes = [layout], [box]
        if kv_layout is not None:  # keys on another grid (CvT's stride-2 cells): the same box, in the queries' frame
            kh, kw = self._hw(kv_layout)
            layouts.append(kv_layout)
            boxes.append(None if box is None else (box[0] * kh / h, box[1] * kw / w))
        drawn = [None] * len(layouts)
        if self.coord_aug.active and self.training:  # a fresh draw for this layer, the same for queries and keys
            drawn = self.coord_aug.jointly([self._coords(lay, b) for lay, b in zip(layouts, boxes)], True)
        cos_q, sin_q = self._cos_sin(i, layout, scaling, box, drawn[0])
        cos_k, sin_k = (cos_q, sin_q) if kv_layout is None else self._cos_sin(i, kv_layout, scaling, boxes[1], drawn[1])

        def rotate(q, k):
            return apply_rotary(q, cos_q, sin_q, half=True), apply_rotary(k, cos_k, sin_k, half=True)

        return PosContext(rotate=rotate)
