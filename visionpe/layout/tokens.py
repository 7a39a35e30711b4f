"""Token layouts: where each token sits. Positions are data; encodings are functions of positions.

A backbone turns its input into tokens plus a `TokenLayout`. Positional encodings read the layout and never guess
the grid from the token count. Builders here are plain functions, cached by shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache, wraps

import torch

__all__ = [
    "TokenLayout",
    "image_layout",
    "video_layout",
    "window_layout",
    "cell_centre_layout",
    "shape_cache",
    "is_symbolic",
]


def is_symbolic(value) -> bool:
    """A symbolic size (torch.export / torch.compile with dynamic shapes), possibly inside tuples or dataclasses."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, (tuple, list)):
        return any(is_symbolic(v) for v in value)
    if value is None or isinstance(value, (int, float, bool, str, torch.Tensor)):  # (dynamo sees its sizes as ints)
        return False
    fields = getattr(value, "__dataclass_fields__", None)
    return fields is not None and any(is_symbolic(getattr(value, f)) for f in fields)


def shape_cache(maxsize: int) -> Callable:
    """`functools.lru_cache` for builders keyed by sizes, bypassed while tracing: under torch.compile / torch.export
    the sizes may be symbolic (unhashable), and a traced graph must compute the tensor rather than capture one."""

    def wrap(fn: Callable) -> Callable:
        cached = lru_cache(maxsize=maxsize)(fn)

        @wraps(fn)
        def call(*args):
            if torch.compiler.is_compiling() or any(is_symbolic(a) for a in args):
                return fn(*args)
            return cached(*args)

        call.cache_clear = cached.cache_clear
        call.cache_info = cached.cache_info
        return call

    return wrap


@dataclass(frozen=True, eq=False)
class TokenLayout:
    """Where the tokens of one sequence sit.

    num_prefix: leading tokens without a position (CLS, registers); PEs leave them alone.
    grid: (T, H, W) when the non-prefix tokens form a raster-ordered grid (T = 1 for images), else None.
    pos: float32 [N, S] positions of the N non-prefix tokens; S = 2 (x, y) for images, 3 (t, y, x) for video,
        or the streams a multimodal scheme assigns.
    """

    num_prefix: int
    grid: tuple[int, int, int] | None
    pos: torch.Tensor

    def __post_init__(self):
        if self.pos.ndim != 2:
            raise ValueError(f"TokenLayout.pos must be [N, S], got shape {tuple(self.pos.shape)}")
        if self.grid is not None and self.grid[0] * self.grid[1] * self.grid[2] != self.pos.shape[0]:
            raise ValueError(f"grid {self.grid} does not match {self.pos.shape[0]} positioned tokens")

    @property
    def num_pos(self) -> int:
        """Number of tokens that have a position."""
        return self.pos.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.num_prefix + self.num_pos

    @property
    def hw(self) -> tuple[int, int]:
        """(H, W) of an image grid (T must be 1)."""
        if self.grid is None or self.grid[0] != 1:
            raise ValueError(f"layout has no single-frame grid (grid={self.grid})")
        return self.grid[1], self.grid[2]

    @property
    def streams(self) -> int:
        return self.pos.shape[1]

    def to(self, device: torch.device | str) -> TokenLayout:
        return self if self.pos.device == torch.device(device) else replace(self, pos=self.pos.to(device))

    def with_pos(self, pos: torch.Tensor) -> TokenLayout:
        """Same structure, new positions (e.g. positions rescaled to a training grid)."""
        return replace(self, pos=pos.to(torch.float32))


def _device_key(device) -> str:
    return str(torch.device(device) if device is not None else torch.device("cpu"))


@shape_cache(maxsize=64)
@torch.inference_mode(False)  # cached tensors must also serve autograd after an inference-mode first call
def _image_pos(h: int, w: int, device: str) -> torch.Tensor:
    f32 = dict(dtype=torch.float32, device=device)  # explicit device: also right inside a torch.device context
    y, x = torch.meshgrid(torch.arange(h, **f32), torch.arange(w, **f32), indexing="ij")
    return torch.stack([x.flatten(), y.flatten()], dim=-1)  # [H*W, 2], x varies fastest


def image_layout(h: int, w: int, num_prefix: int = 0, device=None) -> TokenLayout:
    """Raster-ordered H x W patch grid with raw integer coordinates (x = i % W, y = i // W)."""
    if h < 1 or w < 1:
        raise ValueError(f"image grid must be at least 1 x 1, got {h} x {w}")
    return TokenLayout(num_prefix, (1, h, w), _image_pos(h, w, _device_key(device)))


@shape_cache(maxsize=64)
@torch.inference_mode(False)
def _video_pos(t: int, h: int, w: int, device: str) -> torch.Tensor:
    f32 = dict(dtype=torch.float32, device=device)
    tt, yy, xx = torch.meshgrid(torch.arange(t, **f32), torch.arange(h, **f32), torch.arange(w, **f32), indexing="ij")
    return torch.stack([tt.flatten(), yy.flatten(), xx.flatten()], dim=-1)  # [T*H*W, 3]


def video_layout(t: int, h: int, w: int, num_prefix: int = 0, device=None) -> TokenLayout:
    """Raster-ordered T x H x W tubelet grid; streams (t, y, x)."""
    if min(t, h, w) < 1:
        raise ValueError(f"video grid must be at least 1 x 1 x 1, got {t} x {h} x {w}")
    return TokenLayout(num_prefix, (t, h, w), _video_pos(t, h, w, _device_key(device)))


def window_layout(ws_h: int, ws_w: int, device=None) -> TokenLayout:
    """Layout of the tokens inside one attention window: window-local coordinates 0..ws-1 (Swin)."""
    return image_layout(ws_h, ws_w, 0, device)


@shape_cache(maxsize=64)
@torch.inference_mode(False)
def _cell_centre_pos(h: int, w: int, stride: int, device: str) -> torch.Tensor:
    # a stride-s token covers query cells [s*i, s*i + s - 1]; its centre is s*i + (s - 1) / 2
    return _image_pos(h, w, device).mul(stride).add((stride - 1) / 2)


def cell_centre_layout(h: int, w: int, stride: int, num_prefix: int = 0, device=None) -> TokenLayout:
    """Layout of a strided (e.g. CvT's stride-2 key/value) grid in units of the full-resolution query grid."""
    return TokenLayout(num_prefix, (1, h, w), _cell_centre_pos(h, w, stride, _device_key(device)))
