"""visionpe: positional encodings as a swappable part of vision, video and multimodal transformers.

`import visionpe` registers every `{family}_{size}_{pe}` model with timm:
`timm.create_model("vit_b_rope2d")`.
"""

from .attention import attend, attn_backend, get_attn_backend, set_attn_backend
from .layout import TokenLayout, image_layout, video_layout
from .zoo import create_model, list_visionpe_models  # importing the zoo registers every model with timm

__version__ = "0.1.0"

__all__ = [
    "TokenLayout",
    "attend",
    "attn_backend",
    "create_model",
    "get_attn_backend",
    "image_layout",
    "list_visionpe_models",
    "set_attn_backend",
    "video_layout",
]
