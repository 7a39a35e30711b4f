"""The wheel a user gets from `pip install .`: the package, its recipes as package data, and the console scripts."""

import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from visionpe.recipes import RECIPES_DIR, list_recipes, resolve_recipe

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {
    "visionpe-train": "visionpe.engine.cli:train_main",
    "visionpe-eval": "visionpe.engine.cli:eval_main",
    "visionpe-bench": "visionpe.bench.__main__:main",
    "visionpe-export": "visionpe.engine.export:export_main",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    # build from a copy, so that the build leaves no build/ or egg-info folder in the checkout
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "visionpe", src / "visionpe", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("visionpe-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def _dist_info(zf: zipfile.ZipFile, name: str) -> str:
    (entry,) = [n for n in zf.namelist() if n.endswith(f".dist-info/{name}")]
    return zf.read(entry).decode()


def test_wheel_holds_the_package_and_every_recipe(wheel):
    names = set(wheel.namelist())
    recipes = sorted(p.relative_to(REPO).as_posix() for p in RECIPES_DIR.rglob("*.yaml"))
    assert len(recipes) >= 8 and "visionpe/configs/quick.yaml" in recipes
    assert set(recipes) <= names, sorted(set(recipes) - names)
    modules = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "visionpe").rglob("*.py"))
    assert set(modules) <= names, sorted(set(modules) - names)
    assert not [n for n in names if n.startswith(("tests/", "results/", "runs/", "configs/"))]


def test_wheel_declares_the_console_scripts(wheel):
    entry_points = configparser.ConfigParser()
    entry_points.read_string(_dist_info(wheel, "entry_points.txt"))
    assert dict(entry_points["console_scripts"]) == SCRIPTS
    for target in SCRIPTS.values():  # each names a function that exists
        module, func = target.split(":")
        assert callable(getattr(__import__(module, fromlist=[func]), func))


def test_wheel_metadata_declares_the_imported_dependencies(wheel):
    meta = _dist_info(wheel, "METADATA")
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    core = {r.split(">")[0].split("=")[0].strip().lower() for r in requires if "extra ==" not in r}
    assert {"torch", "torchvision", "timm", "numpy", "pillow", "pyyaml", "safetensors", "tqdm"} <= core
    assert not core & {"matplotlib", "fvcore"}  # benchmark-only: the [bench] extra
    bench = [r for r in requires if 'extra == "bench"' in r]
    assert any(r.startswith("matplotlib") for r in bench) and any(r.startswith("fvcore") for r in bench)
    assert "License-File: LICENSE" in meta or any(n.endswith("LICENSE") for n in wheel.namelist())


def test_recipes_resolve_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_recipe("quick") == RECIPES_DIR / "quick.yaml"
    assert resolve_recipe("configs/quick.yaml") == RECIPES_DIR / "quick.yaml"  # the path the docs used to give
    assert resolve_recipe("quick", kind="bench") == RECIPES_DIR / "bench" / "quick.yaml"
    assert resolve_recipe("configs/bench/fashion-mnist.yaml") == RECIPES_DIR / "bench" / "fashion-mnist.yaml"
    own = tmp_path / "quick.yaml"  # a file the user has wins over the packaged recipe of the same name
    own.write_text("model: {name: vit_n_ape}\n")
    assert resolve_recipe("quick.yaml") == Path("quick.yaml")
    with pytest.raises(FileNotFoundError, match="did you mean 'quick'"):
        resolve_recipe("quik")
    assert "quick" in list_recipes() and "fashion-mnist" in list_recipes("bench")


def test_console_script_functions_find_packaged_recipes(tmp_path, monkeypatch, capsys):
    from visionpe.engine.cli import train_main

    monkeypatch.chdir(tmp_path)
    assert train_main(["-c", "no_such_recipe"]) == 2  # a clear error, not a traceback
    assert "packaged train recipes: " in capsys.readouterr().err
