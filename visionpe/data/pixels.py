"""Decoded images as 8-bit RGB that looks like the file: PIL's `convert("RGB")` alone gets high bit depths wrong.

PIL clips 16-bit ("I;16*", "I") and float ("F") pixels to 0..255 instead of scaling them, so a 16-bit grey PNG
becomes near-white; here 16-bit values are scaled by 255 / 65535, float images in [0, 1] by 255 (floats already in
0..255 are kept; other ranges are an error, as their meaning is unknown). The EXIF orientation tag is applied, as a
viewer does. Palette, LA, CMYK and the other 8-bit modes convert correctly through PIL; alpha is dropped.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageOps

__all__ = ["to_rgb", "DECODE_ERRORS"]

# what PIL raises for a file that is not a readable image (UnidentifiedImageError is an OSError)
DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)

SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # PIL opens 16-bit grey PNG/TIFF as one of these


def _to_uint8(a: np.ndarray, mode: str) -> np.ndarray:
    if mode == "F":
        lo, hi = float(np.nanmin(a)), float(np.nanmax(a))
        if not np.isfinite(a).all() or lo < 0 or hi > 255:
            raise ValueError(f"float image with values in [{lo}, {hi}]: expected [0, 1] or [0, 255]")
        scale = 255.0 if hi <= 1.0 else 1.0
        return np.rint(a * scale).astype(np.uint8)
    a = a.astype(np.int64)
    if a.min() < 0 or a.max() > 65535:
        raise ValueError(f"32-bit integer image with values in [{a.min()}, {a.max()}]: expected 16-bit 0..65535")
    return ((a * 255 + 32767) // 65535).astype(np.uint8)  # rounded 16 -> 8 bit


def to_rgb(img: Image.Image) -> Image.Image:
    """A decoded, upright 8-bit RGB copy of `img` (raises OSError / ValueError for a file that does not decode)."""
    img = ImageOps.exif_transpose(img)
    if img.mode in SIXTEEN_BIT or img.mode == "F":
        img = Image.fromarray(_to_uint8(np.asarray(img), img.mode))  # uint8 2D: mode L
    return img.convert("RGB")
