"""The datasets, one module each; importing this package registers every one of them by name (the registry:
visionpe/data/registry.py)."""

from . import (  # noqa: F401
    canvas,
    clipart,
    clipart_scenes,
    fashion_mnist,
    folders,
    image_text,
    native_canvas,
    synthetic_shapes,
    timm_readers,
    video_shapes,
)
