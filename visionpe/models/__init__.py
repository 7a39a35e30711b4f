"""Backbone families; importing this module registers every model with timm."""

from . import cvt_zoo, multimodal_zoo, swin_zoo, video_zoo, vit_zoo
from .cvt import ConvolutionalVisionTransformer
from .multimodal import MultimodalEncoder
from .swin import SwinTransformer
from .video_vit import VideoViT
from .vit import VisionTransformer

vit_zoo.register()
video_zoo.register()
multimodal_zoo.register()
swin_zoo.register()
cvt_zoo.register()

__all__ = ["ConvolutionalVisionTransformer", "MultimodalEncoder", "SwinTransformer", "VideoViT", "VisionTransformer"]
