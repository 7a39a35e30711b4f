"""What a backbone family declares for the zoo: its size table, the PE presets it offers and its own pretrained-cfg
fields. The rest of its pretrained cfg is common (`base_cfg`), from its paper's row in visionpe.papers (the row that
names the family) or from its size table (a size with an `img_size` is evaluated at that size, uncropped).

Every `*_family.py` here declares one `Family` and lists it in `FAMILIES`; visionpe.zoo registers them with timm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from ..papers import family_paper

__all__ = ["FAMILIES", "Family", "TOKEN_FEATURES", "base_cfg", "image_input", "same_name"]

# features of token models (video, multimodal) come as [B, N, C]: timm's Format has no 'NCTHW'
TOKEN_FEATURES = dict(out_indices=3, feature_cls="getter", output_fmt="NLC")


def image_input(size: int | tuple[int, int], batch: int = 2, frames: int | None = None) -> torch.Tensor:
    """Random images [B, 3, H, W] (size: H = W or (H, W)); image families take no clip length."""
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn(batch, 3, h, w)


@dataclass
class Family:
    """One backbone family: how to build it and which names it registers."""

    name: str  # e.g. "vit"
    model_cls: type
    sizes: dict[str, dict]  # size -> model kwargs (dims, depth, heads, ...)
    pes: dict[str, dict]  # name suffix -> model kwargs (pe preset and anything it implies); "" means no suffix
    cfg: dict = field(default_factory=dict)  # own pretrained-cfg fields; after construction the family's whole cfg
    module: str = ""  # module timm lists the models under; default: the model class's
    size_cfg: dict[str, dict] = field(default_factory=dict)  # per-size cfg overrides (input size: from `img_size`)
    pe_cfg: dict[str, dict] = field(default_factory=dict)  # per-PE cfg overrides (the paper comes from the preset)
    filter_fn: Callable | None = None  # checkpoint filter (published weights -> our names)
    feature_cfg: dict = field(default_factory=lambda: dict(out_indices=3, feature_cls="getter"))
    tiny: dict = field(default_factory=dict)  # kwargs for a tiny instance (tests, smoke runs)
    test_sizes: tuple[int, int] = (32, 48)  # two input resolutions a tiny instance must run at
    example_input: Callable = image_input  # (size, batch, frames=None) -> a random input (tests, benchmarks)

    def __post_init__(self):
        self.module = self.module or self.model_cls.__module__
        self.cfg = base_cfg(**(family_paper(self.name).family_cfg() | self.cfg))
        for size, kwargs in self.sizes.items():
            if "img_size" in kwargs:
                own = dict(input_size=(3, kwargs["img_size"], kwargs["img_size"]), crop_pct=1.0)
                self.size_cfg[size] = own | self.size_cfg.get(size, {})


FAMILIES: dict[str, Family] = {}  # name -> Family, in registration order (filled by visionpe.models)


def base_cfg(**kwargs) -> dict:
    """A timm pretrained cfg with our defaults: any input size, bicubic, ImageNet mean/std, no weights url."""
    cfg = dict(
        url="",
        num_classes=1000,
        input_size=(3, 224, 224),
        pool_size=None,
        crop_pct=0.875,
        interpolation="bicubic",
        fixed_input_size=False,
        mean=IMAGENET_DEFAULT_MEAN,
        std=IMAGENET_DEFAULT_STD,
        first_conv="patch_embed.proj",
        classifier="head",
        license="apache-2.0",
    )
    cfg.update(kwargs)
    return cfg


def same_name(*presets: str) -> dict[str, dict]:
    """PE table entries whose model-name suffix is the preset's name: {"rope2d": {"pe": "rope2d"}, ...}."""
    return {name: dict(pe=name) for name in presets}
