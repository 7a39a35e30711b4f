"""The `bench:` section of a benchmark file (`visionpe-bench extrapolate`, docs/benchmark.md): its keys, declared with
`setting` and read, converted and range-checked by the config reader like the recipe's sections, and the checks across
them. A benchmark file is a recipe (model, data, aug, optim, train, eval) plus this section; `bench.key=value`
overrides go through the same override code as `train.epochs=2`."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import timm
import torch

from ..data import get_dataset_info
from ..data.native.plan import native_mode
from ..engine.config import Config, ConfigError, apply_overrides, config_from_dict, native_settings, read_yaml, setting
from ..position_modes import ALL_MODES, BENCH_MODES
from ..recipes import resolve_recipe
from ..zoo.registry import create_model

PROTOCOLS = ("upsample", "fov", "frames", "duration", "native", "patch")
MAX_SIZE_PX = 8192  # the largest evaluated or timed image side (bench.resolutions, bench.shapes, speed --resolutions)
MAX_SEED = 2**31 - 1


class BenchConfigError(ConfigError):
    """A benchmark file or override that cannot run; raised before any training starts."""


def parse_size(value) -> tuple[int, int]:
    """28 -> (28, 28); '28x56' or [28, 56] -> (28, 56) (height, width)."""
    parts = str(value).lower().split("x") if isinstance(value, (int, str)) else list(value)
    if not (len(parts) in (1, 2) and all(str(p).strip().isdigit() for p in parts)):
        raise ValueError(f"a size is H or HxW in pixels (e.g. 28 or 28x56), got {value!r}")
    h, w = (int(p) for p in parts * (3 - len(parts)))
    if not (0 < h <= MAX_SIZE_PX and 0 < w <= MAX_SIZE_PX):
        raise ValueError(f"each side must be >= 1 and <= {MAX_SIZE_PX} px, got {value!r}")
    return h, w


def check_sizes(sizes: list[int], key: str) -> None:
    """Image sides in px within 1..MAX_SIZE_PX; a BenchConfigError naming `key` and the range otherwise."""
    bad = [s for s in sizes if not 0 < s <= MAX_SIZE_PX]
    if bad:
        raise BenchConfigError(f"{key} must be >= 1 and <= {MAX_SIZE_PX} px, got {bad[0]}")


def check_device(name: str, key: str) -> torch.device:
    """`name` as a device this machine has; a BenchConfigError naming `key` (and the fix) otherwise."""
    given = f"{key} {name}" if key.startswith("--") else f"{key}={name}"
    cpu = f"{key} cpu" if key.startswith("--") else f"{key}=cpu"
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise BenchConfigError(f"{given}: {e}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchConfigError(f"{given}: CUDA is not available on this machine; use {cpu}")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise BenchConfigError(f"{given}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def parse_aspect(value) -> tuple[int, int]:
    """An aspect ratio W:H as (H, W) in lowest terms: '3:1' (wide) -> (1, 3), '1:2' -> (2, 1)."""
    parts = str(value).split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"an aspect ratio is W:H in whole numbers (e.g. 3:1 wide, 1:3 tall), got {value!r}")
    w, h = (int(p) for p in parts)
    g = math.gcd(w, h)
    return h // g, w // g


@dataclass
class BenchConfig:
    """The benchmark: models, seeds, evaluation points, position modes and where results go."""

    name: str = setting("", "benchmark name (default: the file name); used in output_dir and runs_dir")
    models: list[str] = setting(
        [], "registered models, all trained with the file's recipe, e.g. [vit_n_ape, vit_n_cpe]",
        nonempty="vit_n_ape,vit_n_rope2d", unique=True,
    )  # fmt: skip
    seeds: list[int] = setting(
        [0], "training seeds; tables give the mean and standard deviation over them", nonempty="0,1,2", unique=True,
        ge=0, le=MAX_SEED,
    )  # fmt: skip
    extra_seeds: list[int] = setting(
        [], "seeds added, once every run of bench.seeds is done, for the models of each claim comparison that is "
        "within noise with bench.seeds alone (decided from those seeds only, so a rerun plans the same runs)",
        unique=True, ge=0, le=MAX_SEED,
    )  # fmt: skip
    resolutions: list[int] = setting(
        [], "square evaluation sizes in px (the training resolution is always added)",
        ge=1, le=MAX_SIZE_PX, unique=True,
    )  # fmt: skip
    shapes: list[str] = setting(
        [], f"non-square evaluation sizes HxW, e.g. [28x56], each side at most {MAX_SIZE_PX} px", unique=True,
        parse=parse_size,
    )  # fmt: skip
    position_modes: list[str] = setting(
        list(BENCH_MODES), "test-time position modes: " + ", ".join(ALL_MODES),
        choices=ALL_MODES, nonempty="extrapolate,interpolate", unique=True,
    )  # fmt: skip
    protocols: list[str] = setting(
        ["upsample"],
        "upsample (content scaled with the image), fov (larger canvas, content at its training scale; canvas "
        "datasets), frames (clip lengths of bench.frames at the training frame size, the event stretched over them; "
        "video datasets), duration (clip lengths of bench.frames at the training frame rate; video-shapes), native "
        "(token budgets of bench.tokens and aspect ratios of bench.aspects; recipes with data.native), patch (the "
        "training resolution's pixels at the patch sizes of bench.patch_sizes: more or fewer tokens)",
        choices=PROTOCOLS, nonempty="upsample,fov", unique=True,
    )  # fmt: skip
    tokens: list[int] = setting(
        [], "native protocol: token budgets per image, each image at its own aspect ratio (training's added)",
        ge=1, unique=True,
    )  # fmt: skip
    aspects: list[str] = setting(
        [], "native protocol: aspect ratios W:H at the training budget, every image on a canvas of that shape",
        unique=True, parse=parse_aspect,
    )  # fmt: skip
    patch_sizes: list[int] = setting(
        [], "patch protocol: patch sizes in px, the training resolution's pixels at each (the model's own is added)",
        ge=1, unique=True,
    )  # fmt: skip
    frames: list[int] = setting(
        [],
        "clip lengths evaluated by the frames and duration protocols (the training length is added)",
        ge=1,
        unique=True,
    )
    pretrained: bool = setting(False, "evaluate published/saved weights without training (see bench.checkpoints)")
    checkpoints: dict = setting(
        {},
        "pretrained mode: model -> weights file (timm/official .pth/.safetensors, loaded through the model's "
        "pretrained filter) or a visionpe run directory; models not listed load timm's pretrained weights",
        path=True,
    )
    eval_samples: int = setting(0, "evaluate on the first N images of the validation split (0: all of it)", ge=0)
    base_samples: int | None = setting(
        None,
        "also evaluate the training point on the first N items of the whole validation split (0: all of them, "
        "whatever data.options.num_val keeps for the tables): a base accuracy with a smaller sampling error, reported "
        "in the statistics; null: off",
        ge=0,
    )
    eval_batch_size: int = setting(256, "evaluation batch size", ge=1)
    processes: int = setting(1, "runs trained in parallel, one process each", ge=1)
    threads: int = setting(1, "torch threads per process", ge=1)
    device: str = setting("cpu", "evaluation device (cpu, cuda, cuda:1, ...); training follows train.device")
    model_kwargs: dict = setting(
        {}, "model -> extra constructor kwargs for that model only (e.g. init_values for LayerScale checkpoints)"
    )
    output_dir: str = setting(
        "results/{name}", "tables, plot and per-run results (small files, meant to be kept)", path=True
    )
    runs_dir: str = setting("runs/bench/{name}", "training run directories (checkpoints)", path=True)

    def out(self) -> Path:
        return Path(self.output_dir.replace("{name}", self.name))

    def runs(self) -> Path:
        return Path(self.runs_dir.replace("{name}", self.name))


@dataclass
class BenchFile(Config):
    """A benchmark file as the config reader sees it: the recipe's sections and `bench:`."""

    HELP: ClassVar[str] = "visionpe-bench extrapolate --help"

    bench: BenchConfig = field(default_factory=BenchConfig)


def check_bench(b: BenchConfig, cfg: Config) -> None:
    """The checks across bench keys and the recipe's (each key's own range is checked when it is read)."""
    if bool({"frames", "duration"} & set(b.protocols)) != bool(b.frames):
        raise BenchConfigError(
            "the frames / duration protocols and bench.frames go together: list clip lengths (bench.frames=4,16,32) "
            "with bench.protocols including frames or duration, or neither"
        )
    if ("native" in b.protocols) != bool(b.tokens or b.aspects):
        raise BenchConfigError(
            "the native protocol and bench.tokens / bench.aspects go together: list budgets (bench.tokens=144,256) "
            "or aspect ratios (bench.aspects=1:3,3:1) with bench.protocols including native, or neither"
        )
    both = sorted(set(b.seeds) & set(b.extra_seeds))
    if both:
        raise BenchConfigError(f"bench.extra_seeds repeats bench.seeds {both}; list seeds that are not in bench.seeds")
    if b.extra_seeds and (b.pretrained or len(b.seeds) < 2):
        raise BenchConfigError(
            "bench.extra_seeds extends comparisons that are within noise, which needs trained runs with at least two "
            "bench.seeds; drop bench.extra_seeds or list more bench.seeds"
        )
    if ("patch" in b.protocols) != bool(b.patch_sizes):
        raise BenchConfigError(
            "the patch protocol and bench.patch_sizes go together: list patch sizes (bench.patch_sizes=2,8) with "
            "bench.protocols including patch, or neither"
        )
    if b.patch_sizes and max(b.patch_sizes) > cfg.data.resolution:
        raise BenchConfigError(
            f"bench.patch_sizes={','.join(map(str, b.patch_sizes))}: patches larger than the {cfg.data.resolution} px "
            "training images leave no token; list patch sizes up to data.resolution"
        )
    for key in ("checkpoints", "model_kwargs"):
        unknown = sorted(set(getattr(b, key)) - set(b.models))
        if unknown:
            raise BenchConfigError(f"bench.{key} names model(s) {unknown} that are not in bench.models")
    if b.checkpoints and not b.pretrained:
        raise BenchConfigError("bench.checkpoints are evaluated without training; add bench.pretrained=true")
    if not b.resolutions and not b.shapes and not {"frames", "duration", "native"} & set(b.protocols):
        raise BenchConfigError(
            "bench.resolutions and bench.shapes are both empty; list the sizes to evaluate at, "
            "e.g. bench.resolutions=28,42,56"
        )
    check_device(b.device, "bench.device")
    for model, source in b.checkpoints.items():
        if not Path(source).exists():
            raise BenchConfigError(f"bench.checkpoints.{model}: {source} does not exist")
        trained = run_model_name(Path(source)) if Path(source).is_dir() else None
        if trained is not None and trained != model:  # a weights file's model is compared when it is loaded
            raise BenchConfigError(
                f"bench.checkpoints.{model}: {source} is a run of model {trained!r}, not {model!r}; list it as "
                f"bench.checkpoints.{trained} (with {trained} in bench.models)"
            )
    _check_recipe(b, cfg)


def run_model_name(run_dir: Path) -> str | None:
    """The model a visionpe run directory trained (its config.yaml's model.name); None without a config.yaml."""
    if not (run_dir / "config.yaml").is_file():
        return None
    data = read_yaml(run_dir / "config.yaml")
    model = data.get("model") if isinstance(data, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return str(name) if name else None


def _check_recipe(b: BenchConfig, cfg: Config) -> None:
    """The models' names, the recipe and its dataset against the protocols."""
    if cfg.data.train_resolutions:
        raise BenchConfigError("the benchmark trains at one base resolution; drop data.train_resolutions")
    for model in (m for m in b.models if not timm.is_model(m)):
        try:
            create_model(model)
        except ValueError as e:
            raise BenchConfigError(f"bench.models: {e}") from None
    name = cfg.data.name
    kind, native = get_dataset_info(name).kind, native_settings(cfg)
    if kind not in ("image", "video", "image_text", "segmentation"):
        raise BenchConfigError(
            f"the extrapolation benchmark evaluates image, video and image-text classifiers; dataset {name!r} is "
            f"{kind!r}"
        )
    if kind == "segmentation" and not set(b.protocols) <= {"upsample", "fov"}:
        raise BenchConfigError(
            f"segmentation sets (visionpe-bench segment) are evaluated upsampled and by field of view "
            f"(bench.protocols=upsample,fov), got {b.protocols}"
        )
    if kind == "image_text" and b.protocols != ["upsample"]:
        raise BenchConfigError(
            f"image-text datasets are evaluated with more visual tokens (bench.protocols=upsample), got {b.protocols}"
        )
    for clip_protocol in {"frames", "duration"} & set(b.protocols):
        if kind != "video":
            raise BenchConfigError(
                f"the {clip_protocol} protocol evaluates clip lengths; dataset {name!r} is not a video"
            )
    mode = native.mode if native is not None else None
    if "native" in b.protocols and (kind != "image" or (native is not None and not native_mode(mode).patches)):
        raise BenchConfigError(
            f"the native protocol evaluates image models on native-aspect batches (data.native.mode packed or "
            f"padded); got dataset {name!r} ({kind}), mode {mode}"
        )
    if "fov" in b.protocols and kind not in ("image", "segmentation"):
        raise BenchConfigError(f"the fov protocol places images on canvases; dataset {name!r} is a video")


def load_bench(
    path: str | os.PathLike | None, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[BenchConfig, Config]:
    """(bench section, training recipe) of a benchmark file (or a packaged benchmark name such as "quick"), then the
    `key=value` overrides (bench.* and recipe keys alike), checked."""
    data, where = None, ""
    if path is not None:
        path = resolve_recipe(path, kind="bench")
        data, where = read_yaml(path), f" in {path}"  # duplicate keys refused, the file named in every error
    try:
        both = apply_overrides(config_from_dict(data, where, BenchFile), overrides)
    except ConfigError as e:
        raise BenchConfigError(str(e)) from None
    both.bench.name = both.bench.name or (path.stem if path is not None else "bench")
    cfg = Config(**{f.name: getattr(both, f.name) for f in dataclasses.fields(Config)})
    check_bench(both.bench, cfg)
    return both.bench, cfg
