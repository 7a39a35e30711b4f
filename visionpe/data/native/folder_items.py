"""Native-aspect items of an image folder: sizes from file headers, and an image drawn at the size a key names.

- `header_size(path)`: the image's (h, w) as it looks (EXIF rotation applied), read from the header: no decoding.
- `NativeFolderTransform(kwargs, training)(image, (H, W))`: a PIL image -> a normalised tensor [C, H, W].
  Training: a random crop (`crop_box`) whose aspect ratio is the drawn size's W / H times a factor drawn
  log-uniformly in aug.ratio, of aug.scale of the image's area at a random place, resized to (H, W); then the flips
  (aug.hflip, aug.vflip) and the colour transforms of the folder's square route (timm's colour jitter or
  auto-augment, then normalisation and random erasing), so both routes augment alike but for the crop's shape.
  As timm's NaFlex crop, the crop's aspect is the image's own times the ratio factor; the drawn size keeps the
  image's aspect (the packer fixes it before loading), so the crop is stretched by that factor, as a square
  RandomResizedCrop stretches its crop to the square. aug.ratio=[1, 1] keeps every crop's shape.
  Evaluation: the whole image resized to (H, W), normalised.
Every draw comes from Python's `random` and torch's global RNG, which the native loader seeds per key.
"""

from __future__ import annotations

import math
import os
import random

import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform
from timm.data.transforms import str_to_pil_interp
from torchvision.transforms import functional as TF

from ..pixels import DECODE_ERRORS

__all__ = ["header_size", "crop_box", "NativeFolderTransform", "UnreadableImageError", "CROP_ATTEMPTS"]

ORIENTATION = 0x0112  # the EXIF orientation tag
SWAPS_SIDES = (5, 6, 7, 8)  # orientations that turn the image by 90 degrees
CROP_ATTEMPTS = 10  # random crops tried before the centred fallback


class UnreadableImageError(ValueError):
    """A file of an image folder that does not read or decode; its message is one line naming the file, also when a
    loader worker raised it (torch re-raises it in the main process with the worker's traceback as the message)."""

    def __init__(self, message: str):
        if message.startswith(f"Caught {type(self).__name__}"):
            message = message.rstrip().rsplit(f"{type(self).__name__}: ", 1)[-1] + " (in a data loader worker)"
        super().__init__(message)


def header_size(path: str | os.PathLike) -> tuple[int, int]:
    """(h, w) of the image at `path` upright, from its header; an unreadable file is a one-line error naming it."""
    try:
        with Image.open(path) as img:
            w, h = img.size
            # the base class's getexif reads what the header holds (PNG's own would decode the file to look further)
            orientation = Image.Image.getexif(img).get(ORIENTATION, 1)
    except DECODE_ERRORS as e:
        why = f"{type(e).__name__}: {e}"
        raise UnreadableImageError(f"cannot read image {path} ({why}); remove or replace the file") from None
    return (w, h) if orientation in SWAPS_SIDES else (h, w)


def crop_box(
    size: tuple[int, int], aspect: float, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a random crop of an image of `size` (h, w): area a fraction in `scale` of the
    image's, aspect W / H `aspect` times a factor drawn log-uniformly in `ratio`; after CROP_ATTEMPTS crops that do
    not fit, the largest centred crop of aspect `aspect`."""
    h, w = size
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(CROP_ATTEMPTS):
        area = h * w * random.uniform(scale[0], scale[1])
        a = aspect * math.exp(random.uniform(lo, hi))
        ch, cw = round(math.sqrt(area / a)), round(math.sqrt(area * a))
        if 1 <= ch <= h and 1 <= cw <= w:
            return random.randint(0, h - ch), random.randint(0, w - cw), ch, cw
    if w / h > aspect:  # the image is wider than the crop: full height
        ch, cw = h, max(1, min(w, round(h * aspect)))
    else:
        ch, cw = max(1, min(h, round(w / aspect))), w
    return (h - ch) // 2, (w - cw) // 2, ch, cw


class NativeFolderTransform:
    """A PIL image -> [C, H, W] at a size given per call, with the options of the folder's timm transforms
    (`transform_kwargs` in folders.py: mean, std, interpolation, scale, ratio, hflip, vflip, colour options)."""

    def __init__(self, kwargs: dict, training: bool):
        self.kwargs, self.training = dict(kwargs), training
        self.mean = tuple(self.kwargs.get("mean") or IMAGENET_DEFAULT_MEAN)
        self.std = tuple(self.kwargs.get("std") or IMAGENET_DEFAULT_STD)
        self.scale = tuple(self.kwargs.get("scale") or (0.08, 1.0))
        self.ratio = tuple(self.kwargs.get("ratio") or (3 / 4, 4 / 3))
        if not (0 < self.scale[0] <= self.scale[1] <= 1) or not (0 < self.ratio[0] <= self.ratio[1]):
            raise ValueError(
                f"aug.scale must be 0 < lo <= hi <= 1 and aug.ratio 0 < lo <= hi, got {self.scale} and {self.ratio}"
            )
        self.hflip, self.vflip = float(self.kwargs.get("hflip", 0.5)), float(self.kwargs.get("vflip", 0.0))
        self.interpolation = self.kwargs.get("interpolation") or "bicubic"
        self._colour: dict[int, tuple] = {}  # shorter side -> timm's (colour, final) transforms

    def _resample(self):
        if self.interpolation == "random":
            return random.choice((Image.Resampling.BILINEAR, Image.Resampling.BICUBIC))
        return str_to_pil_interp(self.interpolation)

    def colour(self, side: int) -> tuple:
        """timm's colour and final (tensor, normalise, erase) transforms of the square route at `side` px."""
        if side not in self._colour:
            _, colour, final = create_transform((3, side, side), is_training=True, separate=True, **self.kwargs)
            self._colour[side] = colour, final
        return self._colour[side]

    def __call__(self, img: Image.Image, size: tuple[int, int]) -> torch.Tensor:
        H, W = int(size[0]), int(size[1])
        if not self.training:
            out = img.resize((W, H), self._resample())
            return TF.normalize(TF.to_tensor(out), self.mean, self.std)
        top, left, ch, cw = crop_box((img.height, img.width), W / H, self.scale, self.ratio)
        out = img.resize((W, H), self._resample(), box=(left, top, left + cw, top + ch))
        if random.random() < self.hflip:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if random.random() < self.vflip:
            out = out.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
        colour, final = self.colour(min(H, W))
        return final(colour(out))
