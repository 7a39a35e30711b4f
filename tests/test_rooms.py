"""The rooms of visionpe: each package's front door re-exports what its modules export, the public paths the docs
name keep working, and no two modules share a name that says too little (two `attention.py`)."""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "visionpe"

FRONT_DOORS = {
    "visionpe.attention": ["backends", "inputs", "masks", "rows"],
    "visionpe.layout": ["tokens", "batch"],
    "visionpe.zoo": ["registry"],
}


@pytest.mark.parametrize("package", sorted(FRONT_DOORS))
def test_a_room_re_exports_its_modules(package):
    front = importlib.import_module(package)
    for module in FRONT_DOORS[package]:
        inner = importlib.import_module(f"{package}.{module}")
        for name in inner.__all__:
            assert getattr(front, name) is getattr(inner, name), f"{package}.{name}"
            assert name in front.__all__, f"{package}.__all__ lacks {name}"


def test_the_public_paths_work():
    import visionpe
    from visionpe.attention import attend, attn_backend, get_attn_backend, set_attn_backend
    from visionpe.layout import TokenLayout, image_layout, pack_images, patchify_clip, video_layout
    from visionpe.zoo import create_model, family_of, list_visionpe_models

    assert visionpe.attend is attend and visionpe.attn_backend is attn_backend
    assert visionpe.get_attn_backend is get_attn_backend and visionpe.set_attn_backend is set_attn_backend
    assert visionpe.TokenLayout is TokenLayout and visionpe.image_layout is image_layout
    assert visionpe.video_layout is video_layout and callable(pack_images) and callable(patchify_clip)
    assert visionpe.create_model is create_model and visionpe.list_visionpe_models is list_visionpe_models
    assert family_of("vit_n_rope2d").name == "vit"


def test_no_two_attention_modules():
    """Module names say what they hold: one attention package, the layer is attention_layer."""
    stems = Counter(p.stem for p in PACKAGE.rglob("*.py") if p.stem != "__init__")
    assert stems["attention"] == 0 and stems["attention_layer"] == 1


@pytest.mark.parametrize("room", ["attention", "layout", "zoo", "data/datasets", "data/native"])
def test_each_room_is_a_package_with_a_docstring(room):
    init = PACKAGE / room / "__init__.py"
    assert init.exists() and init.read_text().startswith('"""')
