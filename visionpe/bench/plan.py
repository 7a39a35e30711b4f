"""The extrapolation benchmark's plan: its config (a training recipe plus a `bench:` section), the runs it makes,
and every check that can fail before training starts.

A benchmark file holds the sections of `train.py -c` (model, data, aug, optim, train, eval) and a `bench:` section
(models, seeds, evaluation sizes, position modes, parallelism). `load_bench` reads it with `bench.key=value` and recipe
overrides; `make_plan` turns it into one Job per (model, seed); `validate` checks lists, names, the data, each model at
each size and mode, and results left by another recipe, raising BenchConfigError naming the fix.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path

import timm
import torch
import yaml

from ..data import get_dataset_info
from ..data.loader import dataset_num_classes
from ..engine.checkpoint import atomic_write_text
from ..engine.config import Config, ConfigError, apply_overrides, coerce, config_from_dict, config_to_dict
from ..engine.setup import build_eval_sets, build_model, build_split, resolve_amp
from ..zoo import create_model
from .evalsizes import SizedView, has_position_modes, parse_size, set_position_mode, size_label

__all__ = [
    "BenchConfig",
    "BenchConfigError",
    "Job",
    "Plan",
    "POSITION_MODES",
    "load_bench",
    "make_plan",
    "validate",
    "recipe_of",
    "split_name",
    "read_record",
    "write_record",
]

POSITION_MODES = ("extrapolate", "interpolate")


class BenchConfigError(ConfigError):
    """A benchmark file or override that cannot run; raised before any training starts."""


def _opt(default, help_text: str):
    if isinstance(default, list):
        return field(default_factory=lambda d=default: list(d), metadata={"help": help_text})
    return field(default=default, metadata={"help": help_text})


@dataclass
class BenchConfig:
    """The `bench:` section of a benchmark file."""

    name: str = _opt("", "benchmark name (default: the file name); used in output_dir and runs_dir")
    models: list[str] = _opt([], "registered models, all trained with the file's recipe, e.g. [vit_n_ape, vit_n_cpe]")
    seeds: list[int] = _opt([0], "training seeds; tables give the mean and standard deviation over them")
    resolutions: list[int] = _opt([], "square evaluation sizes in px (the training resolution is always added)")
    shapes: list[str] = _opt([], "non-square evaluation sizes HxW, e.g. [28x56]")
    position_modes: list[str] = _opt(list(POSITION_MODES), "test-time position modes: extrapolate, interpolate")
    eval_samples: int = _opt(0, "evaluate on the first N images of the validation split (0: all of it)")
    eval_batch_size: int = _opt(256, "evaluation batch size")
    processes: int = _opt(1, "runs trained in parallel, one process each")
    threads: int = _opt(1, "torch threads per process")
    output_dir: str = _opt("results/{name}", "tables, plot and per-run results (small files, meant to be kept)")
    runs_dir: str = _opt("runs/bench/{name}", "training run directories (checkpoints)")

    def out(self) -> Path:
        return Path(self.output_dir.replace("{name}", self.name))

    def runs(self) -> Path:
        return Path(self.runs_dir.replace("{name}", self.name))


# ------------------------------------------------------------------------------------------------ config loading


def _bench_types() -> dict[str, typing.Any]:
    return typing.get_type_hints(BenchConfig)


def _bench_from_dict(data: dict, where: str) -> BenchConfig:
    if not isinstance(data, dict):
        raise BenchConfigError(f"the bench section{where} must be a mapping of keys, got {data!r}")
    types = _bench_types()
    values = {}
    for key, value in data.items():
        if key not in types:
            close = difflib.get_close_matches(str(key), list(types), n=1, cutoff=0.0)
            raise BenchConfigError(
                f"unknown key bench.{key}{where}; did you mean bench.{close[0]}? (keys: {', '.join(types)})"
            )
        values[key] = coerce(value, types[key], f"bench.{key}")
    return BenchConfig(**values)


def load_bench(
    path: str | os.PathLike | None, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[BenchConfig, Config]:
    """(bench section, training recipe) from a benchmark file, then `bench.key=value` and recipe overrides."""
    data: dict = {}
    where = ""
    if path is not None:
        from ..recipes import resolve_recipe

        path = resolve_recipe(path, kind="bench")  # a file, or a packaged benchmark name such as "quick"
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise BenchConfigError(f"{path} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise BenchConfigError(f"{path} must be a mapping of sections (bench, model, data, ...)")
        where = f" in {path}"
    data = dict(data)
    bench = _bench_from_dict(data.pop("bench", None) or {}, where)
    cfg = config_from_dict(data, where)
    bench_over = [o for o in overrides if o.split("=", 1)[0].strip().startswith("bench.")]
    if bench_over:
        merged = dataclasses.asdict(bench)
        for item in bench_over:
            if "=" not in item:
                raise BenchConfigError(f"override {item!r} is not key=value (e.g. bench.seeds=0,1)")
            key, raw = item.split("=", 1)
            merged[key.strip().removeprefix("bench.")] = yaml.safe_load(raw) if raw.strip() else []
        bench = _bench_from_dict(merged, " on the command line")
    cfg = apply_overrides(cfg, [o for o in overrides if o not in bench_over])
    if not bench.name:
        bench.name = path.stem if path is not None else "bench"
    return bench, cfg


# ------------------------------------------------------------------------------------------------------- the plan

# keys that name a run or how it is run, not what it learns: left out when runs are compared with the recipe
_NOT_RECIPE = {
    "model": ("name",),
    "data": ("workers", "eval_batch_size"),
    "train": (
        "seed",
        "device",
        "threads",
        "progress",
        "output_dir",
        "run_name",
        "log_every",
        "keep_checkpoints",
        "ckpt_every_steps",
    ),
    "eval": ("resolutions", "every_epochs", "ema"),
}


def recipe_of(cfg: dict | Config) -> dict:
    """The parts of a training config that decide what a run learns (for comparing a run with the benchmark)."""
    d = copy.deepcopy(config_to_dict(cfg) if isinstance(cfg, Config) else cfg)
    for section, keys in _NOT_RECIPE.items():
        for k in keys:
            d.get(section, {}).pop(k, None)
    if d.get("model", {}).get("img_size") is None:
        d["model"]["img_size"] = d.get("data", {}).get("resolution")
    return d


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _differences(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} there, {vb!r} now")
    return out


@dataclass
class Job:
    """One (model, seed): its training config and where its results go."""

    model: str
    seed: int
    cfg: Config
    sizes: list[tuple[int, int]]  # every evaluated size, the base first
    modes: list[str]
    eval_samples: int
    eval_batch_size: int
    threads: int
    record_path: Path

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.train.output_dir) / (self.cfg.train.run_name or "")

    @property
    def label(self) -> str:
        return f"{self.model} seed {self.seed}"

    def eval_key(self) -> dict:
        return dict(split=self.cfg.data.val_split, samples=self.eval_samples)

    def missing(self, record: dict | None) -> list[tuple[str, tuple[int, int]]]:
        """(mode, size) pairs the record lacks."""
        have = set()
        if record and record.get("eval") == self.eval_key():
            have = {(r["mode"], (r["height"], r["width"])) for r in record.get("rows", [])}
        return [(m, s) for m in self.modes for s in self.sizes if (m, s) not in have]


@dataclass
class Plan:
    bench: BenchConfig
    cfg: Config
    jobs: list[Job]
    base: tuple[int, int]
    sizes: list[tuple[int, int]]
    notes: list[str] = field(default_factory=list)  # what validation noticed (e.g. sizes that need padding)


def make_plan(bench: BenchConfig, cfg: Config) -> Plan:
    base = (cfg.data.resolution, cfg.data.resolution)
    sizes = [base]
    for s in [*bench.resolutions, *bench.shapes]:
        try:
            size = parse_size(s)
        except ValueError as e:
            raise BenchConfigError(f"bench.resolutions / bench.shapes: {e}") from None
        if size not in sizes:
            sizes.append(size)
    jobs = []
    for model in bench.models:
        for seed in bench.seeds:
            c = copy.deepcopy(cfg)
            c.model.name = model
            c.train.seed = seed
            c.train.output_dir = str(bench.runs())
            c.train.run_name = f"{model}-s{seed}"
            c.train.threads = bench.threads
            c.train.progress = c.train.progress and bench.processes == 1
            c.eval.resolutions = [cfg.data.resolution]
            c.eval.every_epochs = max(cfg.train.epochs, 1)  # the engine evaluates at the base size once, at the end
            jobs.append(
                Job(
                    model,
                    seed,
                    c,
                    sizes,
                    list(bench.position_modes),
                    bench.eval_samples,
                    bench.eval_batch_size,
                    bench.threads,
                    bench.out() / "evals" / f"{model}-s{seed}.json",
                )
            )
    return Plan(bench, cfg, jobs, base, sizes)


# ------------------------------------------------------------------------------------------------------ validation


def _nonempty(values: list, key: str, example: str) -> None:
    if not values:
        raise BenchConfigError(f"{key} is empty; list at least one, e.g. {key}={example}")


def validate(plan: Plan, check_models: bool = True) -> None:
    """Every check that can fail before training: lists, names, the data, each model at each size and mode, and
    earlier results made with another recipe. Raises BenchConfigError (or the engine's error) naming the fix."""
    b, cfg = plan.bench, plan.cfg
    _nonempty(b.models, "bench.models", "vit_n_ape,vit_n_rope2d")
    _nonempty(b.seeds, "bench.seeds", "0,1,2")
    _nonempty(b.position_modes, "bench.position_modes", "extrapolate,interpolate")
    if not b.resolutions and not b.shapes:
        raise BenchConfigError(
            "bench.resolutions and bench.shapes are both empty; list the sizes to evaluate at, "
            "e.g. bench.resolutions=28,42,56"
        )
    for key, values in (
        ("bench.models", b.models),
        ("bench.seeds", b.seeds),
        ("bench.position_modes", b.position_modes),
    ):
        dups = sorted({str(v) for v in values if values.count(v) > 1})
        if dups:
            raise BenchConfigError(f"{key} lists {', '.join(dups)} more than once")
    bad = [m for m in b.position_modes if m not in POSITION_MODES]
    if bad:
        raise BenchConfigError(f"bench.position_modes: unknown mode(s) {bad}; use {', '.join(POSITION_MODES)}")
    for key in ("processes", "threads", "eval_batch_size"):
        if getattr(b, key) < 1:
            raise BenchConfigError(f"bench.{key} must be at least 1, got {getattr(b, key)}")
    if b.eval_samples < 0:
        raise BenchConfigError(f"bench.eval_samples must be 0 (all) or positive, got {b.eval_samples}")
    if cfg.data.train_resolutions:
        raise BenchConfigError("the benchmark trains at one base resolution; drop data.train_resolutions")
    if cfg.train.epochs < 1:
        raise BenchConfigError(f"train.epochs must be at least 1, got {cfg.train.epochs}")
    for model in b.models:
        if not timm.is_model(model):
            try:
                create_model(model)
            except ValueError as e:
                raise BenchConfigError(f"bench.models: {e}") from None
    info = get_dataset_info(cfg.data.name)
    if info.kind != "image":
        raise BenchConfigError(
            f"the extrapolation benchmark evaluates image classifiers; dataset {cfg.data.name!r} is {info.kind!r}"
        )
    _check_recipes(plan)
    if check_models:
        _check_models(plan, info)


def _check_recipes(plan: Plan) -> None:
    """Results or runs left by a benchmark with another recipe are never mixed in (nor overwritten)."""
    for job in plan.jobs:
        theirs = None
        if job.record_path.is_file():
            theirs, where = read_record(job.record_path).get("recipe"), job.record_path
        elif (job.run_dir / "config.yaml").is_file():
            theirs, where = yaml.safe_load((job.run_dir / "config.yaml").read_text()), job.run_dir
        if theirs is None:
            continue
        diff = _differences(recipe_of(theirs), recipe_of(job.cfg))
        if diff:
            raise BenchConfigError(
                f"{where} was made with another recipe ({'; '.join(diff[:4])}); keep it and write elsewhere with "
                f"bench.name=<new name> (or bench.output_dir=... bench.runs_dir=...), or delete it to redo the run"
            )


@torch.no_grad()
def _check_models(plan: Plan, info) -> None:
    cfg = plan.cfg
    train_set = build_split(cfg, cfg.data.train_split, cfg.data.resolution, training=True)
    num_classes = dataset_num_classes(info, train_set)
    evals = build_eval_sets(cfg, sorted({max(s) for s in plan.sizes}), getattr(train_set, "class_to_idx", None))
    device = torch.device("cpu")
    amp = resolve_amp(cfg.train.amp, device)
    for model_name in plan.bench.models:
        c = copy.deepcopy(plan.jobs[0].cfg)
        c.model.name = model_name
        try:
            model = build_model(c, num_classes, info.in_chans).eval()
        except (TypeError, ValueError, RuntimeError) as e:
            raise BenchConfigError(f"model {model_name!r} cannot be built for {cfg.data.name!r}: {e}") from None
        patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
        patch = patch[0] if isinstance(patch, (tuple, list)) else patch
        padded = [size_label(s) for s in plan.sizes if patch and (s[0] % patch or s[1] % patch)]
        if padded:
            plan.notes.append(
                f"{model_name}: {', '.join(padded)} px are not multiples of its {patch} px patch; the "
                f"model zero-pads them at the bottom/right, which costs accuracy of its own"
            )
        for size in plan.sizes:
            x = SizedView(evals[max(size)], size, 1)[0][0][None]
            for mode in plan.bench.position_modes:
                set_position_mode(model, mode)
                try:
                    with torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None):
                        out = model(x)
                except (RuntimeError, ValueError, TypeError, AssertionError) as e:
                    raise BenchConfigError(
                        f"model {model_name!r} cannot take {size_label(size)} px in {mode} mode: "
                        f"{e}; drop that size from bench.resolutions / bench.shapes"
                    ) from None
                if out.shape != (1, num_classes):
                    raise BenchConfigError(
                        f"model {model_name!r} returned {tuple(out.shape)}, not [1, "
                        f"{num_classes}]; the benchmark evaluates classifiers"
                    )
                if not has_position_modes(model):
                    break


def read_record(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BenchConfigError(f"{path} is unreadable ({e}); delete it and the run is evaluated again") from None


def write_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def split_name(name: str) -> tuple[str, str, str]:
    from ..zoo import FAMILIES, family_of

    try:
        fam = family_of(name)
    except ValueError:
        return name, "", name
    rest = name[len(fam.name) + 1 :]
    size = max((s for s in fam.sizes if rest == s or rest.startswith(s + "_")), key=len, default="")
    pe = rest[len(size) + 1 :] if size else rest
    if not pe:
        pe = FAMILIES[fam.name].pes.get("", {}).get("pe", "default")
    return fam.name, size, pe
