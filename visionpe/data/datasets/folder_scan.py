"""Finding the images of a class-folder split: what is a class, what is an image, and what is skipped.

- Symbolic links are followed (a class folder may link to images elsewhere), and each real folder is read once: a
  link back to a folder already on the walk (a loop) or a second link to the same folder adds nothing.
- Hidden entries (names starting with a dot: `.ipynb_checkpoints`, `.DS_Store`, `._x.jpg`) are skipped, folders and
  files alike, so that a tool's side folder never becomes a class.
- Class names are compared in Unicode NFC form, so a folder named in NFD (as macOS writes some names) matches its
  NFC twin in another split or in a checkpoint's class map.
- The class of an image is the name of the folder that holds it (timm's leaf-name rule); classes are numbered in
  natural sort order, images sorted by path in natural order.
"""

from __future__ import annotations

import os
import unicodedata

from timm.data.readers.img_extensions import get_img_extensions
from timm.data.readers.reader import Reader
from timm.utils.misc import natural_key

__all__ = ["scan_image_folder", "CleanFolderReader", "nfc"]


def nfc(name: str) -> str:
    return unicodedata.normalize("NFC", name)


def _walk(top: str):
    """(folder, file names) for every real folder under `top` once, following links, hidden entries skipped."""
    seen, stack = set(), [top]
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
        except OSError:  # a dangling link
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        entries = [e for e in entries if not e.name.startswith(".")]
        stack += [e.path for e in reversed(entries) if e.is_dir(follow_symlinks=True)]
        yield folder, [e.name for e in entries if not e.is_dir(follow_symlinks=True)]


def scan_image_folder(split_dir: str | os.PathLike, class_to_idx: dict | None = None) -> tuple[list, dict]:
    """([(path, class index)], {class name (NFC): index}); with `class_to_idx`, images of other classes are left
    out (the caller checks for them first)."""
    split_dir = os.fspath(split_dir)
    types = get_img_extensions(as_set=True)
    found = []
    for folder, files in _walk(split_dir):
        label = nfc(os.path.basename(os.path.relpath(folder, split_dir))) if folder != split_dir else ""
        found += [(os.path.join(folder, f), label) for f in files if os.path.splitext(f)[1].lower() in types]
    if class_to_idx is None:
        class_to_idx = {c: i for i, c in enumerate(sorted({lb for _, lb in found}, key=natural_key))}
    else:
        class_to_idx = {nfc(str(c)): i for c, i in class_to_idx.items()}
    samples = [(p, class_to_idx[lb]) for p, lb in found if lb in class_to_idx]
    return sorted(samples, key=lambda s: natural_key(s[0])), class_to_idx


class CleanFolderReader(Reader):
    """A timm Reader over `scan_image_folder` (the interface timm's ImageDataset reads through)."""

    def __init__(self, root: str | os.PathLike, class_map: dict | None = None):
        super().__init__()
        self.root = os.fspath(root)
        self.samples, self.class_to_idx = scan_image_folder(self.root, class_map)
        if not self.samples:
            raise FileNotFoundError(
                f"{self.root} holds no images in class folders (extensions {', '.join(get_img_extensions())}); "
                f"expected {self.root}/<class>/<image>"
            )

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        return open(path, "rb"), target

    def __len__(self) -> int:
        return len(self.samples)

    def _filename(self, index: int, basename: bool = False, absolute: bool = False) -> str:
        path = self.samples[index][0]
        if basename:
            return os.path.basename(path)
        return path if absolute else os.path.relpath(path, self.root)
