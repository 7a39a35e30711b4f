"""`clipart`: public-domain vector clip art (Debian's `openclipart-svg` package) drawn at any resolution.

Which files are drawings, their classes and their split come from the index (`clipart_index.py`: the scan, its
skip reasons, duplicates, classes and the hash split, cached as JSON under `cache_dir`); this module draws them.

Drawings are rendered by cairosvg in the loader workers (never while the dataset is built), on white, RGB, aspect
ratio kept and centred, at the size asked for: a larger size shows finer detail. Renders are cached per (file, size)
in memory and as PNG files under `cache_dir/renders/<size>/`. A file that fails to render (or takes longer than
`render_timeout` CPU seconds, or draws nothing) is skipped when met: replaced by the next drawing in training, left out
in evaluation, and reported through `pop_skipped()` like an unreadable image file.

Training augmentation: random resized crops of the drawing rendered at twice the item size (so a magnified crop
keeps detail) and horizontal flips, from the aug settings (`aug.scale`, `aug.ratio`, `aug.hflip`). `item_scale` < 1
draws the drawing at that fraction of the side on a white canvas (at a random place in training, a fixed one per
item in evaluation). `render_canvas(i, (H, W))` puts the drawing at its training pixel size on a larger canvas (the
benchmark's field-of-view protocol).
"""

from __future__ import annotations

import io
import os
import signal
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..registry import register_dataset
from ..splits import split_kind, split_size
from .clipart_index import (
    DEFAULT_ROOT,
    EXCLUDE,
    MIN_DRAWINGS,
    VAL_PERCENT,
    ClipArtMissingError,
    default_cache_dir,
    examine,
    load_index,
    scan,
    select,
)

__all__ = [
    "ClipArt", "clipart", "scan", "load_index", "select", "render_svg", "render_svg_rgba", "DEFAULT_ROOT",
    "MIN_DRAWINGS", "EXCLUDE", "ClipArtMissingError", "examine",
]  # fmt: skip

MAX_CONSECUTIVE_FAILURES = 50
# RGB mean / std of the drawings on white (measured over 400 training drawings of the package at 32 px)
MEAN = (0.836, 0.815, 0.790)
STD = (0.279, 0.290, 0.315)


def _require_cairosvg():
    try:
        import cairosvg
    except (ImportError, OSError) as e:  # OSError: the cairo library itself is missing
        raise ImportError(
            f"data.name=clipart renders SVG with cairosvg ({type(e).__name__}: {e}); pip install 'visionpe[clipart]' "
            f"(it needs the system cairo library, e.g. apt-get install libcairo2)"
        ) from None
    return cairosvg


# ---------------------------------------------------------------------------------------------------- the renders


class RenderError(RuntimeError):
    """A drawing that does not render (an error, a timeout or nothing drawn)."""


class _Timeout:
    """A deadline in CPU seconds for one render (SIGPROF), only where it can work (the main thread of a process with
    setitimer). CPU time, not wall time: on a loaded machine a drawing takes longer by the clock, and a wall-clock
    deadline would make which drawings are skipped depend on what else the machine runs."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.on = (
            self.seconds > 0 and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
        )

    def _fire(self, *_):
        raise RenderError(f"took more than {self.seconds:g} CPU seconds")

    def __enter__(self):
        if self.on:
            self.previous = signal.signal(signal.SIGPROF, self._fire)
            signal.setitimer(signal.ITIMER_PROF, self.seconds)

    def __exit__(self, *exc):
        if self.on:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, self.previous)


def render_svg_rgba(data: bytes, size: int, timeout: float = 0) -> np.ndarray:
    """SVG bytes drawn on a transparent canvas as uint8 RGBA [size, size, 4] (not premultiplied), aspect ratio kept,
    centred; RenderError if it fails or draws nothing. The alpha says where the drawing is (segmentation labels)."""
    from PIL import Image

    cairosvg = _require_cairosvg()
    try:
        with _Timeout(timeout):
            png = cairosvg.svg2png(bytestring=data, output_width=size, output_height=size)
        img = Image.open(io.BytesIO(png)).convert("RGBA")
    except RenderError:
        raise
    except Exception as e:  # cairosvg raises many kinds (parse, value, cairo errors)
        raise RenderError(f"{type(e).__name__}: {e}") from None
    if img.size != (size, size):
        raise RenderError(f"rendered {img.size[0]} x {img.size[1]} px, not {size} x {size}")
    rgba = np.asarray(img, dtype=np.uint8).copy()
    if not (rgba[..., 3] > 0).any():
        raise RenderError("draws nothing")
    return rgba


def over_white(rgba: np.ndarray) -> np.ndarray:
    """uint8 RGBA (not premultiplied) -> uint8 RGB over white."""
    x = rgba.astype(np.float32) / 255.0
    alpha = x[..., 3:]
    return np.rint((x[..., :3] * alpha + (1.0 - alpha)) * 255).astype(np.uint8)


def render_svg(data: bytes, size: int, timeout: float = 0) -> np.ndarray:
    """SVG bytes drawn on white as uint8 RGB [size, size, 3], aspect ratio kept, centred; RenderError if it fails."""
    return over_white(render_svg_rgba(data, size, timeout))


class ClipArt(Dataset):
    """Items are (image [3, R, R] normalised, class) of the clip-art drawings of one split (see the module doc)."""

    def __init__(
        self,
        root: str | os.PathLike,
        split: str = "train",
        resolution: int = 32,
        augment: bool = False,
        crop_scale: tuple[float, float] | None = (0.08, 1.0),
        crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
        hflip: float = 0.5,
        item_scale: float = 1.0,
        num_samples: int | None = None,
        min_drawings: int = MIN_DRAWINGS,
        exclude=EXCLUDE,
        val_percent: int = VAL_PERCENT,
        max_per_class: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        render_cache: bool = True,
        render_timeout: float = 20.0,
        memory_mb: int = 256,
        seed: int = 0,
        log=print,
    ):
        if not 0 < item_scale <= 1:
            raise ValueError(f"clipart option item_scale must be in (0, 1], got {item_scale}")
        _require_cairosvg()  # before any work: the scan parses with its XML parser, the workers render with it
        self.root = Path(root)
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        index = load_index(self.root, self.cache_dir, log)
        chosen = select(index, min_drawings, exclude, val_percent, max_per_class)
        kind = split_kind(split)
        items = chosen[kind][:num_samples] if num_samples is not None else chosen[kind]
        if not items:
            raise ValueError(f"the clipart {kind} split of {self.root} is empty; raise val_percent or add drawings")
        self.split = kind
        self.classes = tuple(chosen["classes"])
        self.num_classes = len(self.classes)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.paths = [p for p, *_ in items]
        self.labels = [label for _, label, *_ in items]
        self.digests = [d for *_, d in items]
        self.counts, self.skipped_at_scan = chosen["counts"], chosen["skipped"]
        self.duplicates, self.ambiguous, self.small = chosen["duplicates"], chosen["ambiguous"], chosen["small"]
        self.resolution = int(resolution)
        self.augment = augment
        self.crop_scale, self.crop_ratio, self.hflip = crop_scale, tuple(crop_ratio), float(hflip)
        self.item_scale = float(item_scale)
        self.render_cache, self.render_timeout = render_cache, float(render_timeout)
        self.memory_bytes = int(memory_mb) * 2**20
        self.seed = int(seed)
        self._memory: OrderedDict = OrderedDict()
        self._memory_used = 0
        self._skipped: list[str] = []
        self._failed: set[int] = set()
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)
        self.white = ((1.0 - self.mean) / self.std).view(3)

    def summary(self) -> str:
        """The classes with their (train, val) counts and what the scan left out, in one line."""
        classes = ", ".join(f"{c} {t}/{v}" for c, (t, v) in self.counts.items())
        skipped = ", ".join(f"{n} {r}" for r, n in self.skipped_at_scan.items()) or "none"
        small = ", ".join(f"{c} ({n})" for c, n in sorted(self.small.items())) or "none"
        return (
            f"clipart {self.root}: {self.num_classes} classes (train/val drawings): {classes}; skipped files: "
            f"{skipped}; duplicates removed: {self.duplicates}; in several categories (dropped): {self.ambiguous}; "
            f"categories not used: {small}"
        )

    def __len__(self) -> int:
        return len(self.paths)

    # the drawing at one size, cached
    def drawing(self, index: int, size: int, alpha: bool = False) -> np.ndarray:
        """Drawing `index` on white, uint8 RGB [size, size, 3], or with alpha on a transparent canvas, uint8 RGBA
        [size, size, 4]; RenderError if it does not render."""
        key = (index, size, alpha)
        if key in self._memory:
            self._memory.move_to_end(key)
            return self._memory[key]
        digest = self.digests[index]
        disk = self.cache_dir / ("renders-rgba" if alpha else "renders") / str(size) / digest[:2] / f"{digest}.png"
        pixels = self._from_disk(disk, "RGBA" if alpha else "RGB") if self.render_cache else None
        if pixels is None:
            try:
                data = (self.root / self.paths[index]).read_bytes()
            except OSError as e:
                raise RenderError(f"cannot read: {e}") from None
            render = render_svg_rgba if alpha else render_svg
            pixels = render(data, size, self.render_timeout)
            if self.render_cache:
                self._to_disk(disk, pixels)
        self._memory[key] = pixels
        self._memory_used += pixels.nbytes
        while self._memory_used > self.memory_bytes and len(self._memory) > 1:
            self._memory_used -= self._memory.popitem(last=False)[1].nbytes
        return pixels

    @staticmethod
    def _from_disk(path: Path, mode: str = "RGB") -> np.ndarray | None:
        from PIL import Image

        try:
            with Image.open(path) as img:
                return np.asarray(img.convert(mode)).copy()
        except (OSError, ValueError):
            return None

    @staticmethod
    def _to_disk(path: Path, pixels: np.ndarray) -> None:
        from PIL import Image

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            Image.fromarray(pixels).save(tmp, format="PNG")
            os.replace(tmp, path)  # workers writing the same render at once: each replace is whole
        except OSError:
            pass  # a full or read-only cache only costs a render next time

    # items
    def _image(self, index: int, size: int) -> torch.Tensor:
        """The drawing at `size` px as floats [3, size, size] in [0, 1], augmented in training."""
        if self.augment and self.crop_scale:
            from torchvision.transforms import RandomResizedCrop

            source = torch.from_numpy(self.drawing(index, 2 * size)).permute(2, 0, 1).float().div_(255)
            i, j, h, w = RandomResizedCrop.get_params(source, list(self.crop_scale), list(self.crop_ratio))
            x = F.interpolate(
                source[None, :, i : i + h, j : j + w], size=(size, size), mode="bilinear", align_corners=False,
                antialias=size < max(h, w),
            )[0].clamp_(0, 1)  # fmt: skip
        else:
            x = torch.from_numpy(self.drawing(index, size)).permute(2, 0, 1).float().div_(255)
        if self.augment and self.hflip > 0 and torch.rand(()) < self.hflip:
            x = x.flip(-1)
        return x

    def _place(self, index: int, x: torch.Tensor, canvas: tuple[int, int]) -> torch.Tensor:
        """x [3, d, d] on a white canvas: at a random place in training, at one fixed by the item otherwise (the
        same relative place at every canvas size)."""
        H, W = canvas
        d = x.shape[-1]
        if self.augment:
            u, v = torch.rand(2).tolist()
        else:
            u, v = torch.rand(2, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + index)).tolist()
        top, left = round(u * (H - d)), round(v * (W - d))
        out = torch.ones(3, H, W)
        out[:, top : top + d, left : left + d] = x
        return out

    def _normalised(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def _draw(self, index: int, resolution: int) -> torch.Tensor:
        if self.item_scale >= 1:
            return self._normalised(self._image(index, resolution))
        d = max(1, round(resolution * self.item_scale))
        return self._normalised(self._place(index, self._image(index, d), (resolution, resolution)))

    def _with_skips(self, index: int, draw):
        """draw(i) for item `index`; a drawing that does not render is skipped (training: the next one that does;
        evaluation: (None, class))."""
        n = len(self)
        for attempt in range(min(MAX_CONSECUTIVE_FAILURES, n) if self.augment else 1):
            i = (index + attempt) % n
            if i in self._failed and self.augment:
                continue
            try:
                return draw(i), self.labels[i]
            except RenderError as e:
                self._failed.add(i)
                self._skipped.append(f"{self.root / self.paths[i]} ({e})")
        if not self.augment:
            return None, self.labels[index]
        raise ValueError(
            f"{min(MAX_CONSECUTIVE_FAILURES, n)} clip-art drawings in a row from item {index} under {self.root} do "
            f"not render, e.g. {self._skipped[-1] if self._skipped else '(all skipped before)'}; check cairosvg"
        )

    def render(self, index: int, resolution: int):
        """(image [3, R, R], class): the whole drawing at R px (finer detail at a larger R)."""
        return self._with_skips(index, lambda i: self._draw(i, int(resolution)))

    def render_canvas(self, index: int, size: tuple[int, int]):
        """(image [3, H, W], class): the drawing at the size it has in a `resolution` px item, on a white H x W
        canvas (field of view: more positions and background, the drawing's pixel size unchanged)."""
        h, w = (int(s) for s in size)
        d = max(1, round(self.resolution * self.item_scale))
        if h < d or w < d:
            raise ValueError(f"a {h} x {w} px canvas cannot hold the {d} px drawing; use sizes of at least {d} px")
        return self._with_skips(index, lambda i: self._normalised(self._place(i, self._image(i, d), (h, w))))

    # the field-of-view and upsample protocols: render(i, R) draws the same picture at R px (not a canvas)
    renders_detail = True

    def __getitem__(self, index: int):
        return self.render(index, self.resolution)

    def pop_skipped(self) -> list[str]:
        """Drawings skipped since the last call (per process; the loader reports them with each batch)."""
        skipped, self._skipped = self._skipped, []
        return skipped


def clipart_augmentation(options: dict, aug: dict) -> str:
    """clipart's training augmentation in words."""
    if not options.get("augment", True):
        parts = []
    else:
        parts = [f"flips (p={aug.get('hflip', 0.5)})"] if aug.get("hflip", 0.5) else []
        if options.get("crop", "rrc") == "rrc":
            ratio = [round(r, 2) for r in aug.get("ratio") or (3 / 4, 4 / 3)]
            parts.insert(0, f"random resized crops (area {list(aug.get('scale') or (0.08, 1.0))}, aspect {ratio})")
    scale = float(options.get("item_scale", 1.0))
    if scale < 1:
        parts.insert(0, f"the drawing at {scale:g} of the side at a random place on white")
    return " and ".join(parts) or "none"


_LOGGED: set = set()


@register_dataset("clipart", num_classes=None, in_chans=3, kind="image", augmentation=clipart_augmentation)
def clipart(
    split: str = "train",
    resolution: int = 32,
    root: str | None = None,
    training: bool = False,
    augment: bool = True,
    crop: str = "rrc",
    aug: dict | None = None,
    num_train: int | None = None,
    num_val: int | None = None,
    min_drawings: int = MIN_DRAWINGS,
    exclude: list[str] | tuple[str, ...] = EXCLUDE,
    val_percent: int = VAL_PERCENT,
    max_per_class: int | None = None,
    item_scale: float = 1.0,
    cache_dir: str | None = None,
    render_cache: bool = True,
    render_timeout: float = 20.0,
) -> ClipArt:
    """Openclipart's public-domain SVG drawings (Debian's openclipart-svg), one class per top-level category with
    at least min_drawings distinct drawings, rendered on white at any resolution (3 channels). num_train / num_val
    keep the first items of a split."""
    if crop not in ("rrc", "none"):
        raise ValueError(f"clipart option crop must be 'rrc' (random resized crop) or 'none', got {crop!r}")
    aug = aug or {}
    ds = ClipArt(
        root or DEFAULT_ROOT,
        split,
        resolution,
        augment=augment and training,
        crop_scale=tuple(aug.get("scale") or (0.08, 1.0)) if crop == "rrc" else None,
        crop_ratio=tuple(aug.get("ratio") or (3 / 4, 4 / 3)),
        hflip=aug.get("hflip", 0.5),
        item_scale=item_scale,
        num_samples=split_size(split, None, num_train, num_val),
        min_drawings=min_drawings,
        exclude=tuple(exclude or ()),
        val_percent=val_percent,
        max_per_class=max_per_class,
        cache_dir=cache_dir,
        render_cache=render_cache,
        render_timeout=render_timeout,
    )
    if str(ds.root) not in _LOGGED:  # once per process and root
        _LOGGED.add(str(ds.root))
        print(ds.summary())
    return ds
