"""The clip-art index: which SVG files of a drawings' folder are drawings, which count once, their classes and their
split, all decided by rules that parse but do not render (the dataset, `clipart.py`, draws them).

The SVG files sit under `root/<category>/<subcategory>/...`; the top-level category is the class. A scan (`scan`)
reads every file once and decides:

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
root and a signature of every file's path, size and mtime (a package update or any edit rescans); `select` turns it
into classes and splits.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections import Counter
from pathlib import Path

__all__ = [
    "scan", "load_index", "select", "examine", "default_cache_dir", "ClipArtMissingError", "DEFAULT_ROOT",
    "MIN_DRAWINGS", "EXCLUDE", "VAL_PERCENT",
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


# ------------------------------------------------------------------------------------ the index, classes and split


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
