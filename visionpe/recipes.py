"""The YAML recipes that ship with the package (`visionpe/configs/`), found by name from any directory.

`-c quick`, `-c quick.yaml`, `-c configs/quick.yaml` and `-c /abs/path.yaml` all work: a path that exists is used as
it is; otherwise the name is looked up among the packaged recipes (benchmark files under `configs/bench/`).
"""

from __future__ import annotations

import difflib
from pathlib import Path

__all__ = ["RECIPES_DIR", "list_recipes", "resolve_recipe"]

RECIPES_DIR = Path(__file__).resolve().parent / "configs"


def list_recipes(kind: str = "train") -> list[str]:
    """Names of the packaged recipes: 'train' (configs/*.yaml) or 'bench' (configs/bench/*.yaml)."""
    folder = RECIPES_DIR / "bench" if kind == "bench" else RECIPES_DIR
    return sorted(p.stem for p in folder.glob("*.yaml"))


def resolve_recipe(name_or_path: str | Path, kind: str = "train") -> Path:
    """An existing file, else a packaged recipe of that name; FileNotFoundError listing the names otherwise."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    text = path.as_posix()
    for prefix in ("visionpe/configs/", "configs/"):  # the paths the docs used before recipes became package data
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    stem = text.removesuffix(".yaml").removesuffix(".yml")
    if stem.startswith("bench/"):
        kind, stem = "bench", stem[len("bench/") :]
    folder = RECIPES_DIR / "bench" if kind == "bench" else RECIPES_DIR
    candidate = folder / f"{stem}.yaml"
    if "/" not in stem and candidate.is_file():
        return candidate
    names = list_recipes(kind)
    close = difflib.get_close_matches(stem, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise FileNotFoundError(
        f"{kind} recipe {str(name_or_path)!r} is neither a file nor a packaged recipe; {hint}"
        f"packaged {kind} recipes: {', '.join(names)}"
    )
