"""Backbone families: the architectures (their sizes, PE variants and published weights: visionpe.zoo)."""

from .cvt import ConvolutionalVisionTransformer
from .multimodal import MultimodalEncoder
from .swin import SwinTransformer
from .video_vit import VideoViT
from .vit import VisionTransformer

__all__ = [
    "ConvolutionalVisionTransformer",
    "MultimodalEncoder",
    "SwinTransformer",
    "VideoViT",
    "VisionTransformer",
]
