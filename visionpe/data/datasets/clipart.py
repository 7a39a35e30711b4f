"""`clipart`: public-domain vector clip art (Debian's `openclipart-svg` package) drawn at any resolution.

The SVG files sit under `root/<category>/<subcategory>/...`; the top-level category is the class. A scan (`scan`)
reads every file once and decides, with rules that parse but do not render:

- skipped, with a count per reason in the log: an empty file; one that is not well-formed XML, declares entities
  (refused by defusedxml) or has no <svg> root ("unreadable"); an `href` to anything but a fragment of the file
  itself or inline `data:` ("external reference": a linked bitmap or file the package does not ship); a zero-size or
  negative width, height or viewBox ("zero-size canvas"); a canvas wider than MAX_ASPECT:1 or larger than MAX_SIDE
  user units ("absurd canvas"); no drawing element ("nothing to draw"); nothing filled and every stroke thinner
  than HAIRLINE of the canvas side ("hairlines only": invisible at small sizes, e.g. the package's generated
  stars); more than MAX_BYTES or MAX_ELEMENTS ("too complex", slow to render); a file outside a category folder;
- duplicates: files with the same bytes (the package links one drawing under several paths) or the same normalised
  content (the XML without metadata, comments, editor attributes and ids) count once; a drawing found in two
  categories has no single class and is dropped (counted);
- classes: the categories with at least `min_drawings` distinct drawings (150), except `exclude` ("unsorted");
- split: a drawing is in val when its content hash falls in the first `val_percent` (20) of 100 buckets, so the split
  does not depend on file order, machine or the other files, and duplicates (one hash) cannot straddle it.

The scan's result is kept in a small JSON index under `cache_dir` (default ~/.cache/visionpe/clipart), keyed by the
root and a signature of every file's path, size and mtime (a package update or any edit rescans).

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

import hashlib
import io
import json
import math
import os
import re
import signal
import threading
import time
from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..registry import register_dataset
from ..splits import split_kind, split_size

__all__ = [
    "ClipArt", "clipart", "scan", "load_index", "select", "render_svg", "render_svg_rgba", "DEFAULT_ROOT",
    "MIN_DRAWINGS", "EXCLUDE",
]  # fmt: skip

DEFAULT_ROOT = "/usr/share/openclipart/svg"  # where Debian's openclipart-svg puts the drawings
MIN_DRAWINGS = 150  # a category with fewer distinct drawings is not a class
EXCLUDE = ("unsorted",)  # not a category of content
VAL_PERCENT = 20
MAX_BYTES = 4 * 2**20
MAX_ELEMENTS = 50_000
MAX_ASPECT = 8.0
MAX_SIDE = 100_000.0
HAIRLINE = 0.0025  # a drawing of only unfilled lines thinner than this fraction of its side is skipped
SCAN_VERSION = 3  # bump when the rules change: every index is rebuilt
MAX_CONSECUTIVE_FAILURES = 50
# RGB mean / std of the drawings on white (measured over 400 training drawings of the package at 32 px)
MEAN = (0.836, 0.815, 0.790)
STD = (0.279, 0.290, 0.315)
DRAWING_TAGS = {
    "path", "rect", "circle", "ellipse", "line", "polyline", "polygon", "text", "use", "image", "tspan", "textPath",
}  # fmt: skip
# namespaces of editor state and metadata (Inkscape, Sodipodi, Illustrator, Sketch, RDF / Dublin Core / CC)
_EDITOR_NS = ("inkscape", "sodipodi", "adobe", "bohemiancoding", "purl.org/dc", "creativecommons", "resource.org/cc",
              "22-rdf-syntax-ns")  # fmt: skip
_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([a-z%]*)\s*$")
_UNITS = {"": 1.0, "px": 1.0, "pt": 4 / 3, "pc": 16.0, "mm": 96 / 25.4, "cm": 96 / 2.54, "in": 96.0}


class ClipArtMissingError(FileNotFoundError):
    """The drawings' folder is not there."""


def _require_cairosvg():
    try:
        import cairosvg
    except (ImportError, OSError) as e:  # OSError: the cairo library itself is missing
        raise ImportError(
            f"data.name=clipart renders SVG with cairosvg ({type(e).__name__}: {e}); pip install 'visionpe[clipart]' "
            f"(it needs the system cairo library, e.g. apt-get install libcairo2)"
        ) from None
    return cairosvg


# --------------------------------------------------------------------------------------------------------- the scan


def _local(name: str) -> str:
    return name.rsplit("}", 1)[-1]


def _editor(name: str) -> bool:
    """An element or attribute of an editor's or metadata namespace (`{uri}name`)."""
    return name.startswith("{") and any(ns in name[1 : name.find("}")].lower() for ns in _EDITOR_NS)


def _length(value: str | None) -> float | None:
    """A length attribute in px (None: absent or relative, e.g. a percentage)."""
    if value is None:
        return None
    m = _NUMBER.match(value)
    if not m or m.group(2) == "%" or m.group(2) not in _UNITS:
        return None
    return float(m.group(1)) * _UNITS[m.group(2)]


def _canvas(root) -> tuple[float, float] | str:
    """(width, height) of the drawing in user units, or the reason to skip it."""
    box = root.get("viewBox")
    if box is not None:
        try:
            parts = [float(p) for p in re.split(r"[\s,]+", box.strip())]
        except ValueError:
            parts = []
        if len(parts) == 4:
            w, h = parts[2], parts[3]
        else:
            w = h = None
    else:
        w, h = _length(root.get("width")), _length(root.get("height"))
    if w is None or h is None:  # no usable size: cairosvg falls back to its default canvas
        w, h = _length(root.get("width")) or 100.0, _length(root.get("height")) or 100.0
    if not (w > 0 and h > 0):
        return "zero-size canvas"
    if not (math.isfinite(w) and math.isfinite(h)) or max(w, h) > MAX_SIDE or max(w / h, h / w) > MAX_ASPECT:
        return "absurd canvas"
    return w, h


def _paint(el, inherited: dict) -> dict:
    """fill, stroke and stroke-width of `el` from its attributes and style, over those it inherits."""
    out = dict(inherited)
    for k in ("fill", "stroke", "stroke-width"):
        if el.get(k) is not None:
            out[k] = el.get(k).strip()
    for decl in (el.get("style") or "").split(";"):
        k, _, v = decl.partition(":")
        if k.strip() in ("fill", "stroke", "stroke-width"):
            out[k.strip()] = v.strip()
    return out


def _inked(root, min_width: float) -> bool:
    """Whether anything is drawn with a fill or a stroke at least `min_width` wide (a stylesheet, text, an image or
    a `use` count as ink: not judged here)."""
    if any(_local(str(el.tag)) == "style" for el in root.iter() if isinstance(el.tag, str)):
        return True
    stack = [(root, _paint(root, {"fill": "black", "stroke": "none", "stroke-width": "1"}))]
    while stack:
        el, paint = stack.pop()
        tag = _local(el.tag)
        if tag in ("defs", "metadata", "clipPath", "mask", "marker", "pattern", "symbol") or _editor(el.tag):
            continue
        if tag in ("text", "image", "use"):
            return True
        if tag in DRAWING_TAGS:
            if paint["fill"] != "none" and tag != "line":
                return True
            width = _length(paint["stroke-width"])
            if paint["stroke"] != "none" and (width is None or width >= min_width):
                return True
        stack.extend((child, _paint(child, paint)) for child in el if isinstance(child.tag, str))
    return False


def examine(data: bytes) -> dict | str:
    """{'key': normalised content hash, 'aspect': width / height} of one SVG file's bytes, or why it is skipped."""
    if not data.strip():
        return "empty file"
    if len(data) > MAX_BYTES:
        return "too complex"
    from defusedxml import ElementTree  # cairosvg's own XML parser: the same files parse

    try:
        root = ElementTree.fromstring(data)
    except Exception:  # ParseError, EntitiesForbidden, DTDForbidden, encoding errors: all unreadable
        return "unreadable"
    if _local(str(root.tag)) != "svg":
        return "unreadable"
    canvas = _canvas(root)
    if isinstance(canvas, str):
        return canvas
    parts, drawn, count = [], False, 0
    for el in root.iter():
        if not isinstance(el.tag, str):  # comments, processing instructions
            continue
        count += 1
        tag = _local(el.tag)
        if tag in ("metadata", "title", "desc") or _editor(el.tag):
            continue
        drawn = drawn or tag in DRAWING_TAGS
        for k, v in el.attrib.items():
            if _local(k) == "href" and not (v.strip().startswith("#") or v.strip().startswith("data:")):
                return "external reference"
        attrs = sorted((_local(k), v.strip()) for k, v in el.attrib.items() if k != "id" and not _editor(k))
        parts.append((tag, attrs, (el.text or "").strip(), (el.tail or "").strip()))
    if count > MAX_ELEMENTS:
        return "too complex"
    if not drawn:
        return "nothing to draw"
    if not _inked(root, max(canvas) * HAIRLINE):
        return "hairlines only"
    key = hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()
    return {"key": key, "aspect": canvas[0] / canvas[1]}


def _svg_files(root: Path) -> list[tuple[str, int, int]]:
    """(path relative to root, size, mtime_ns) of every .svg file under root, sorted; links to files are followed."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if name.lower().endswith(".svg") and not name.startswith("."):
                path = Path(folder) / name
                try:
                    st = path.stat()
                except OSError:  # a dangling link
                    out.append((path.relative_to(root).as_posix(), -1, 0))
                    continue
                out.append((path.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns))
    return sorted(out)


def _signature(root: Path, files: list) -> str:
    h = hashlib.sha256(f"{SCAN_VERSION}|{root.resolve()}".encode())
    for rel, size, mtime in files:
        h.update(f"|{rel}|{size}|{mtime}".encode())
    return h.hexdigest()


def scan(root: str | os.PathLike, files: list | None = None) -> dict:
    """Examine every .svg under root: {'files': [[path, category, byte hash, content key, aspect], ...],
    'skipped': {reason: [path, ...]}}."""
    root = Path(root)
    kept, skipped = [], {}
    for rel, size, _ in files if files is not None else _svg_files(root):
        if "/" not in rel:
            skipped.setdefault("outside category folders", []).append(rel)
            continue
        try:
            data = (root / rel).read_bytes() if size >= 0 else None
        except OSError:
            data = None
        found = "unreadable" if data is None else examine(data)
        if isinstance(found, str):
            skipped.setdefault(found, []).append(rel)
            continue
        digest = hashlib.sha256(data).hexdigest()
        kept.append([rel, rel.split("/", 1)[0], digest, found["key"], round(found["aspect"], 6)])
    return {"files": kept, "skipped": skipped}


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "visionpe" / "clipart"


def load_index(root: str | os.PathLike, cache_dir: str | os.PathLike | None = None, log=print) -> dict:
    """The scan of root, from the JSON index under cache_dir when its signature matches, else scanned and saved."""
    root = Path(root)
    if not root.is_dir():
        raise ClipArtMissingError(
            f"clip-art folder {root} does not exist; apt-get install openclipart-svg (drawings land in "
            f"{DEFAULT_ROOT}), or set data.root to a folder of SVG files in category folders"
        )
    files = _svg_files(root)
    if not files:
        raise ClipArtMissingError(
            f"no .svg files under {root}; set data.root to a folder of SVG files in category folders "
            f"(<root>/<category>/.../<name>.svg), or apt-get install openclipart-svg"
        )
    signature = _signature(root, files)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    where = cache / f"index-{hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]}.json"
    try:
        index = json.loads(where.read_text())
        if index.get("signature") == signature:
            return index
    except (OSError, ValueError):
        pass
    start = time.perf_counter()
    index = {"root": str(root.resolve()), "signature": signature, **scan(root, files)}
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = where.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index))
        os.replace(tmp, where)
    except OSError as e:  # a read-only cache only costs a rescan next time
        log(f"clipart: could not save the scan index to {where} ({e}); the next build scans again")
    took = time.perf_counter() - start
    log(f"clipart: scanned {len(files)} files under {root} in {took:.1f} s; index saved to {where}")
    return index


def select(
    index: dict,
    min_drawings: int = MIN_DRAWINGS,
    exclude=EXCLUDE,
    val_percent: int = VAL_PERCENT,
    max_per_class: int | None = None,
) -> dict:
    """Classes, the items of each split and what was left out, from a scan: {'classes': [...], 'train': [(path,
    label, key, aspect, digest), ...], 'val': [...], 'counts': {class: (train, val)}, 'skipped': {reason: n},
    'duplicates': n, 'ambiguous': n, 'small': {category: n}}. Items are ordered by content hash (a mix of classes:
    the first n of a split are a fair subset)."""
    if not 0 < val_percent < 100:
        raise ValueError(f"clipart option val_percent must be between 1 and 99, got {val_percent}")
    byte_key: dict[str, str] = {}  # same bytes: one drawing whatever the normalised key says
    groups: dict[str, list] = {}
    for rel, category, digest, key, aspect in index["files"]:
        key = byte_key.setdefault(digest, key)
        groups.setdefault(key, []).append((rel, category, digest, aspect))
    drawings: dict[str, list] = {}
    ambiguous = 0
    for key, members in groups.items():
        if len({m[1] for m in members}) > 1:
            ambiguous += 1
            continue
        rel, category, digest, aspect = min(members)
        drawings.setdefault(category, []).append((rel, key, aspect, digest))
    excluded = set(exclude or ())
    small = {c: len(d) for c, d in drawings.items() if len(d) < min_drawings or c in excluded}
    classes = sorted(c for c in drawings if c not in small)
    if not classes:
        found = ", ".join(f"{c} ({n})" for c, n in sorted(small.items())) or "none"
        raise ValueError(
            f"no category of {index.get('root')} has {min_drawings} distinct drawings (found {found}); lower "
            f"data.options.min_drawings or point data.root at a larger tree"
        )
    splits: dict[str, list] = {"train": [], "val": []}
    counts = {}
    for label, category in enumerate(classes):
        items = sorted(drawings[category], key=lambda d: hashlib.sha256(f"cap:{d[1]}".encode()).hexdigest())
        if max_per_class:
            items = items[:max_per_class]
        n = Counter()
        for rel, key, aspect, digest in items:
            kind = "val" if int(key[:8], 16) % 100 < val_percent else "train"
            splits[kind].append((rel, label, key, aspect, digest))
            n[kind] += 1
        counts[category] = (n["train"], n["val"])
    for kind in splits:
        splits[kind].sort(key=lambda item: item[2])
    return {
        "classes": classes,
        **splits,
        "counts": counts,
        "skipped": {r: len(p) for r, p in sorted(index["skipped"].items())},
        "duplicates": len(index["files"]) - len(groups),
        "ambiguous": ambiguous,
        "small": small,
    }


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
