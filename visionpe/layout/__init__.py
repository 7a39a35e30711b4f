"""Layouts: where each token sits. `TokenLayout` and its builders for one image, clip or window (tokens.py);
native-resolution batches, padded or packed, their input dict and `BatchLayout`, where each image of a batch
sits (batch.py).
"""

from .batch import (
    NATIVE_KEYS,
    BatchLayout,
    ImageGroup,
    check_native,
    is_native_batch,
    native_layout,
    pack_images,
    patchify_clip,
    regrid_layout,
)
from .tokens import TokenLayout, cell_centre_layout, image_layout, is_symbolic, shape_cache, video_layout, window_layout

__all__ = [
    "BatchLayout",
    "ImageGroup",
    "NATIVE_KEYS",
    "TokenLayout",
    "cell_centre_layout",
    "check_native",
    "image_layout",
    "is_native_batch",
    "is_symbolic",
    "native_layout",
    "pack_images",
    "patchify_clip",
    "regrid_layout",
    "shape_cache",
    "video_layout",
    "window_layout",
]
