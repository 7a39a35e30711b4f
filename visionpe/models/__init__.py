"""Backbone families: the models and, per family, its sizes and PE presets (`FAMILIES`, registered by visionpe.zoo)."""

from .cvt import ConvolutionalVisionTransformer
from .cvt_zoo import CVT
from .family import FAMILIES, Family
from .multimodal import MultimodalEncoder
from .multimodal_zoo import MM
from .swin import SwinTransformer
from .swin_zoo import SWIN
from .video_vit import VideoViT
from .video_zoo import VIDEO
from .vit import VisionTransformer
from .vit_zoo import VIT

FAMILIES.update({family.name: family for family in (VIT, VIDEO, MM, SWIN, CVT)})

__all__ = [
    "FAMILIES",
    "ConvolutionalVisionTransformer",
    "Family",
    "MultimodalEncoder",
    "SwinTransformer",
    "VideoViT",
    "VisionTransformer",
]
