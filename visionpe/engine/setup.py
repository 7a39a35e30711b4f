"""What training and evaluation both build from a config: datasets, the model, mixed precision, and the up-front
checks that turn bad input into a clear error before any work is done."""

from __future__ import annotations

import contextlib

import timm
import torch
from timm.models import get_pretrained_cfg
from torch import nn
from torch.utils.data import Dataset

from .. import data as vdata
from ..attention.backends import check_attn_backend
from ..data.datasets.folders import MAX_CONSECUTIVE_FAILURES
from ..data.loader import KeyedDataset, renders_any_resolution
from ..data.multires import collate_to_resolution
from ..data.registry import check_aug_applies
from ..data.seeding import seeded_rngs
from ..data.streams import first_stream_item, is_stream
from ..zoo.registry import create_model
from .config import Config

__all__ = [
    "resolve_amp",
    "autocast",
    "model_data_defaults",
    "build_split",
    "build_eval_sets",
    "build_model",
    "to_device",
    "run_model",
    "forward_on",
    "check_resolutions",
    "check_labels",
]


def resolve_amp(name: str, device: torch.device) -> torch.dtype | None:
    """train.amp -> the autocast dtype (None: full precision)."""
    if name == "none":
        return None
    if name == "fp16":
        if device.type != "cuda":
            raise ValueError("train.amp=fp16 needs a CUDA device; use train.amp=bf16 (or none) on CPU")
        return torch.float16
    if name == "bf16":
        return torch.bfloat16
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        # on CPUs bf16 autocast pays off with AMX tiles; with AVX512-BF16 alone small models run slower than fp32
        amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        return torch.bfloat16 if amx and torch.ops.mkldnn._is_mkldnn_bf16_supported() else None
    raise ValueError(f"train.amp must be auto, bf16, fp16 or none, got {name!r}")


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def model_data_defaults(cfg: Config) -> dict:
    """Mean/std/interpolation/crop_pct for image folders: the config's, else the model's pretrained cfg."""
    try:
        pcfg = get_pretrained_cfg(cfg.model.name)
        pcfg = pcfg.to_dict() if pcfg is not None else {}
    except (RuntimeError, ValueError):
        pcfg = {}
    a = cfg.aug
    return dict(
        mean=a.mean or list(pcfg.get("mean", (0.485, 0.456, 0.406))),
        std=a.std or list(pcfg.get("std", (0.229, 0.224, 0.225))),
        interpolation=a.interpolation or pcfg.get("interpolation", "bicubic"),
        crop_pct=a.crop_pct if a.crop_pct is not None else pcfg.get("crop_pct", 0.875),
    )


def build_split(cfg: Config, split: str, resolution: int, training: bool, class_map: dict | None = None) -> Dataset:
    """One split of the configured dataset; options it does not name are not passed (see data.build_dataset). A
    segmentation set (pixel labels) is refused: the engine trains classifiers."""
    if vdata.get_dataset_info(cfg.data.name).kind == "segmentation":
        raise ValueError(
            f"dataset {cfg.data.name!r} labels pixels (a segmentation set); train and evaluate it with "
            f"visionpe-bench segment -c <benchmark file> (e.g. clipart-seg)"
        )
    aug = {k: getattr(cfg.aug, k) for k in ("auto_augment", "re_prob", "color_jitter", "scale", "ratio", "hflip")}
    if training:  # an aug option the dataset never applies is an error, not a silent no-op
        timm_loader = (cfg.data.native or {}).get("loader") == "timm"
        check_aug_applies(cfg.data.name, aug, cfg.data.options, timm_loader)
    return vdata.build_dataset(
        cfg.data.name,
        split,
        resolution,
        root=cfg.data.root,
        options=cfg.data.options,
        training=training,
        aug=aug,
        class_map=class_map,
        stream_seed=cfg.train.seed,  # streams (timm's wds/, tfds/ readers): shard shuffle and whole batches
        stream_batch_size=cfg.data.batch_size if training else cfg.data.eval_batch_size or 2 * cfg.data.batch_size,
        **model_data_defaults(cfg),
    )


def build_eval_sets(cfg: Config, resolutions: list[int], class_map: dict | None = None) -> dict[int, Dataset]:
    """The evaluation split at each resolution (one object when the dataset renders any resolution)."""
    first = build_split(cfg, cfg.data.val_split, resolutions[0], False, class_map)
    if renders_any_resolution(first):
        return dict.fromkeys(resolutions, first)
    return {
        r: first if r == resolutions[0] else build_split(cfg, cfg.data.val_split, r, False, class_map)
        for r in resolutions
    }


def build_model(cfg: Config, num_classes: int, in_chans: int) -> nn.Module:
    """`timm.create_model` with the dataset's classes and channels; the reference size is data.resolution."""
    kwargs = dict(cfg.model.kwargs)
    kwargs.setdefault("img_size", cfg.model.img_size or cfg.data.resolution)
    kwargs.setdefault("drop_path_rate", cfg.model.drop_path)  # 0.0 too: Swin's own default is 0.1
    if not timm.is_model(cfg.model.name):
        create_model(cfg.model.name)  # raises the error naming the nearest model names
    try:
        return create_model(cfg.model.name, num_classes=num_classes, in_chans=in_chans, **kwargs)
    except TypeError as e:
        raise ValueError(
            f"model {cfg.model.name!r} rejected its arguments {sorted(kwargs)} ({e}); check model.kwargs"
        ) from None


def to_device(inputs, device: torch.device, non_blocking: bool = False):
    if isinstance(inputs, dict):
        return {k: to_device(v, device, non_blocking) for k, v in inputs.items()}
    if isinstance(inputs, torch.Tensor):
        return inputs.to(device, non_blocking=non_blocking)
    return inputs


def run_model(model: nn.Module, inputs) -> torch.Tensor:
    """model(x) for tensors and native-aspect batches (a NaFlex dict: "patches", ...), model(**x) for dicts of model
    kwargs (video / image-text sets)."""
    return model(**inputs) if isinstance(inputs, dict) and "patches" not in inputs else model(inputs)


def forward_on(model: nn.Module, inputs, device: torch.device, amp: torch.dtype | None) -> torch.Tensor:
    """The model's output for `inputs` moved to `device`, under the run's autocast (`amp`, None: full precision)."""
    with autocast(device, amp):
        return run_model(model, to_device(inputs, device))


def _first_readable(ds: Dataset, res: int) -> tuple:
    """The first item whose input is not None (None: an unreadable file left out of an evaluation split)."""
    if is_stream(ds):  # read by a reader of its own: the stream the loaders read is left unstarted
        item = first_stream_item(ds)
        prepare = getattr(ds, "prepare", None)
        if prepare is not None:
            with seeded_rngs(0):  # the global RNG is left alone
                item = prepare(item, res)
        return item[0], item[1], res, ()
    keyed, tried = KeyedDataset(ds), []
    for i in range(min(len(ds), MAX_CONSECUTIVE_FAILURES)):
        item = keyed[(i, res, 0)]  # seeded: the global RNG is left alone
        if item[0] is not None:
            return item
        tried += item[3]
    where = getattr(ds, "split_dir", type(ds).__name__)
    what = "every file" if len(ds) <= MAX_CONSECUTIVE_FAILURES else f"the first {MAX_CONSECUTIVE_FAILURES} files"
    raise ValueError(f"{what} of {where} is unreadable (e.g. {tried[0] if tried else '?'}); check the files")


@torch.no_grad()
def check_resolutions(
    model: nn.Module, model_name: str, datasets: dict[int, Dataset], device: torch.device, amp: torch.dtype | None
) -> None:
    """One forward pass of one item at every resolution, so that a resolution the model cannot take fails now."""
    check_attn_backend(device)  # a bad VISIONPE_ATTN is about the backend, not about a resolution
    was_training = model.training
    model.eval()
    try:
        for res, ds in sorted(datasets.items()):
            try:  # rendering an item at a huge resolution can itself run out of memory
                batch = collate_to_resolution([_first_readable(ds, res)])
            except MemoryError as e:
                raise _resolution_error(e, model_name, res, device) from None
            try:
                out = forward_on(model, batch.inputs, device, amp)
            except (RuntimeError, ValueError, TypeError, AssertionError, MemoryError) as e:
                raise _resolution_error(e, model_name, res, device) from None
            if out.ndim != 2:
                raise ValueError(
                    f"model {model_name!r} returned shape {tuple(out.shape)}, not [batch, classes]; "
                    f"the engine trains classifiers"
                )
    finally:
        model.train(was_training)


def _resolution_error(e: Exception, model_name: str, res: int, device: torch.device) -> Exception:
    """The one-line error for a resolution that fails its trial forward pass (memory, shape, or the data)."""
    text = str(e)
    if isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower():
        return ValueError(
            f"model {model_name!r} at resolution {res} needs more memory than {device} has; choose smaller "
            f"resolutions (data.resolution, data.train_resolutions, eval.resolutions, --resolutions)"
        )
    return ValueError(
        f"model {model_name!r} cannot take resolution {res}: {e}. Choose resolutions it "
        f"accepts (data.resolution, data.train_resolutions, eval.resolutions)"
    )


def check_labels(targets: torch.Tensor, num_classes: int, dataset: str) -> None:
    """Class ids must lie in 0..num_classes-1 (soft targets, already one-hot, are not checked)."""
    if targets.numel() and not targets.is_floating_point():
        lo, hi = int(targets.min()), int(targets.max())
        if lo < 0 or hi >= num_classes:
            raise ValueError(
                f"dataset {dataset!r} gave label {lo if lo < 0 else hi}, outside its {num_classes} classes "
                f"0..{num_classes - 1}; check the dataset's labels (or its declared number of classes)"
            )
