"""Backbone families; importing this module registers every model with timm."""

from . import vit_zoo
from .vit import VisionTransformer

vit_zoo.register()

__all__ = ["VisionTransformer"]
