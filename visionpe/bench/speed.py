"""`visionpe-bench speed`: images/s, peak memory, parameters and FLOPs at a list of resolutions (and clip lengths),
against a baseline and timm's equivalent model measured in the same rounds; `--zoo` for the cards, `--compile` for
torch.compile, `--data` for loader throughput (docs/benchmark.md).

    python -m visionpe.bench speed --models 'vit_s_*' --baseline vit_s_ape --infer --resolutions 224
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import timm
import torch
from timm.optim import create_optimizer_v2
from torch import nn

import visionpe  # noqa: F401  (registers the models)

from ..data import build_dataset, build_train_loader, get_dataset_info
from ..data.loader import dataset_num_classes
from ..engine.checkpoint import atomic_write_text
from ..engine.config import Config, apply_overrides
from ..zoo import FAMILIES, create_model, family_of, list_visionpe_models, model_name
from .measure import (
    CLOCKS,
    Clock,
    Spread,
    count_flops,
    example_input,
    interleave,
    is_video,
    machine_description,
    machine_info,
    model_step,
    paired_ratios,
    peak_memory_mb,
    saved_activation_mb,
    spread,
    torch_threads,
)
from .report import fmt, md_table

_VIT_SIZES = {"t": "tiny", "s": "small", "b": "base", "l": "large"}
_LS = dict(init_values=1e-5)  # timm's RoPE-ViT ports are DeiT-III models (LayerScale)


def _equivalents() -> dict[str, tuple[str, dict]]:
    """ours -> (timm's model, kwargs that give ours the same architecture), for the pairs timm has."""
    pairs = {}
    for s, word in _VIT_SIZES.items():
        pairs[f"vit_{s}_ape"] = (f"vit_{word}_patch16_224", {})
        pairs[f"vit_{s}_rope2d"] = (f"vit_{word}_patch16_rope_224", _LS)
        pairs[f"vit_{s}_rope2d_mixed"] = (f"vit_{word}_patch16_rope_mixed_224", _LS)
        pairs[f"vit_{s}_rope2d_ape"] = (f"vit_{word}_patch16_rope_ape_224", dict(_LS, no_embed_class=True))
        pairs[f"vit_{s}_rope2d_mixed_ape"] = (f"vit_{word}_patch16_rope_mixed_ape_224", dict(_LS, no_embed_class=True))
    for s, word in (("t", "tiny"), ("s", "small"), ("b", "base")):
        pairs[f"swin_{s}_rpb"] = (f"swin_{word}_patch4_window7_224", {})
    return {ours: ref for ours, ref in pairs.items() if timm.is_model(ref[0])}


TIMM_EQUIVALENTS = _equivalents()


def timm_equivalent(name: str) -> tuple[str, dict] | None:
    """(timm model, kwargs for ours) when timm has the same architecture, else None (e.g. cvt_13)."""
    return TIMM_EQUIVALENTS.get(name)


def expand_models(patterns: list[str]) -> list[str]:
    """Model names with glob patterns ('vit_s_*') expanded over the registered visionpe models, order kept."""
    names: list[str] = []
    for p in patterns:
        if any(c in p for c in "*?["):
            hits = fnmatch.filter(list_visionpe_models(), p)
            if not hits:
                raise ValueError(f"--models pattern {p!r} matches no registered visionpe model")
            names += hits
        elif timm.is_model(p):
            names.append(p)
        else:
            create_model(p)  # raises, naming the nearest model names
    return list(dict.fromkeys(names))


@dataclass
class SpeedRow:
    model: str
    resolution: int
    reference: str | None = None  # timm's equivalent measured in the same run, or None
    tokens: int = 0
    params_m: float = 0.0
    gflops: float | None = None
    infer_ips: float | None = None  # images (clips) per second, median of the rounds
    train_ips: float | None = None
    infer_mem_mb: float | None = None  # peak memory of one step of one item beyond the weights
    train_mem_mb: float | None = None
    notes: list[str] = field(default_factory=list)
    frames: int | None = None  # clip length (video models)
    baseline: str | None = None  # the model the ratios below are against (measured in the same rounds)
    infer_spread: dict | None = None  # Spread of images/s over the rounds
    train_spread: dict | None = None
    infer_vs_base: dict | None = None  # Spread of the per-round ratio against the baseline
    train_vs_base: dict | None = None
    infer_vs_timm: dict | None = None  # Spread of the per-round ratio against timm's equivalent
    train_vs_timm: dict | None = None
    saved_act_mb: float | None = None  # activations autograd keeps for backward (one item)


# ------------------------------------------------------------------------------------------------------ models


class _Kwargs(nn.Module):
    """Positional tensors -> model(**kwargs), so fvcore can trace models that take dicts (multimodal)."""

    def __init__(self, model: nn.Module, keys: list[str]):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *args):
        return self.model(**dict(zip(self.keys, args)))


def _build(name: str, kwargs: dict, resolution: int, ours: bool) -> nn.Module:
    if ours:
        return create_model(name, **kwargs)
    return timm.create_model(name, img_size=resolution, **kwargs)  # timm's models fix their size at creation


def _tokens(model: nn.Module, resolution: int, frames: int | None = None) -> int:
    """Patch tokens of the first stage at this size (prefix tokens left out; all frames of a clip)."""
    embed = getattr(model, "patch_embed", None)
    if frames is not None and hasattr(embed, "token_grid"):
        return math.prod(embed.token_grid(frames, resolution, resolution))
    patch = getattr(embed, "patch_size", None)
    if patch is None:
        info = getattr(model, "feature_info", None) or [{"reduction": 4}]
        patch = info[0]["reduction"] if isinstance(info, list) else info.reduction(0)
    p = patch[0] if isinstance(patch, (tuple, list)) else int(patch)
    return math.ceil(resolution / p) ** 2


def _flops(model: nn.Module, x) -> float:
    if isinstance(x, dict):
        return count_flops(_Kwargs(model, list(x)), tuple(x.values())) / 1e9
    return count_flops(model, x[:1]) / 1e9


def _signature(x) -> str:
    if isinstance(x, dict):
        return repr(sorted((k, tuple(v.shape)) for k, v in x.items()))
    return repr(tuple(x.shape))


def _to(x, device: str):
    return {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)


# ----------------------------------------------------------------------------------------------------- measure


def _points(models: list[str], resolutions: list[int], frames: list[int] | None) -> list[tuple[int, int | None, list]]:
    """(resolution, frames, models measured there): image models once per resolution, video models per length."""
    video = [m for m in models if is_video(m)]
    image = [m for m in models if m not in video]
    points = []
    for res in resolutions:
        if image or not frames:
            points.append((res, None, image + ([] if frames else video)))
        for f in frames or []:
            if video:
                points.append((res, f, video))
    return [p for p in points if p[2]]


def _time_group(group: dict, rows: dict, baseline: str | None, x, train: bool, clock: Clock, rounds, steps) -> None:
    """Interleave one group of models on the same input; fill images/s and per-round ratios into their rows."""
    tasks = {n: model_step(m, x, train) for n, m in group.items()}
    rates = interleave(tasks, clock, rounds, steps)
    base = baseline if baseline in group else next(iter(group))
    vs_base = paired_ratios(rates, base)
    key = "train" if train else "infer"
    for n, v in rates.items():
        row = rows[n]
        row.baseline = base
        s = spread(v)
        setattr(row, f"{key}_ips", s.median)
        setattr(row, f"{key}_spread", s.as_dict())
        setattr(row, f"{key}_vs_base", spread(vs_base[n]).as_dict())
        if row.reference in rates:
            setattr(row, f"{key}_vs_timm", spread(paired_ratios(rates, row.reference)[n]).as_dict())


def _build_point(names: list[str], res: int, n_frames: int | None, with_timm: bool, log) -> dict:
    """name -> (model, kwargs, ours) for the models measured at one point, timm's equivalents next to ours."""
    built: dict[str, tuple[nn.Module, dict, bool]] = {}
    for name in names:
        pair = timm_equivalent(name) if with_timm and n_frames is None else None
        kwargs = dict(pair[1]) if pair else {}
        built[name] = (_build(name, kwargs, res, name in list_visionpe_models()), kwargs, True)
        if pair and pair[0] not in built:
            try:
                built[pair[0]] = (_build(pair[0], {}, res, False), {"img_size": res}, False)
            except Exception as e:  # a timm model that cannot take this size: measure ours alone
                log(f"  {pair[0]} cannot be built at {res} px ({e}); measuring {name} alone")
    return built


def _static_row(name: str, built: dict, res: int, n_frames, with_timm: bool, flops: bool, device: str) -> SpeedRow:
    """A model's row before timing: parameters, tokens, GFLOPs (the model is moved to `device`)."""
    model, kwargs, ours = built[name]
    model.to(device)
    pair = timm_equivalent(name) if ours and with_timm else None
    ref = pair[0] if pair and pair[0] in built else None
    params = sum(p.numel() for p in model.parameters()) / 1e6
    row = SpeedRow(name, res, ref, _tokens(model, res, n_frames), params, frames=n_frames)
    if ours and kwargs:
        row.notes.append(f"built with {kwargs} to match {pair[0]}")
    if flops:
        try:
            row.gflops = _flops(model, example_input(name, res, 1, n_frames))
        except Exception as e:  # a model fvcore cannot trace still gets its speed measured
            row.notes.append(f"FLOPs not counted: {type(e).__name__}: {str(e)[:120]}")
    return row


def measure(
    models: list[str],
    resolutions: list[int],
    batch: int = 4,
    rounds: int = 3,
    steps: int = 2,
    train: bool = True,
    memory: bool = True,
    with_timm: bool = True,
    flops: bool = True,
    device: str = "cpu",
    clock: str = "wall",
    log=print,
    *,
    infer: bool = True,
    timing: bool = True,
    frames: list[int] | None = None,
    baseline: str | None = None,
) -> list[SpeedRow]:
    """One SpeedRow per (model, resolution[, frames]), timm's equivalents included (their `reference` is None).
    clock='cpu' times CPU seconds of the calling thread (use with one torch thread on a shared machine)."""
    tick = Clock(clock, device)
    models = expand_models(models)
    if baseline is not None and baseline not in models:
        models = [baseline, *models]
    rows: list[SpeedRow] = []
    for res, n_frames, names in _points(models, resolutions, frames):
        where = f"{res} px" + (f", {n_frames} frames" if n_frames else "")
        built = _build_point(names, res, n_frames, with_timm, log)
        by_name = {name: _static_row(name, built, res, n_frames, with_timm, flops, device) for name in built}
        rows += by_name.values()
        if timing:
            groups: dict[str, dict[str, nn.Module]] = {}  # models that take the same input are interleaved together
            for n, (m, _, _) in built.items():
                groups.setdefault(_signature(example_input(n, res, 1, n_frames)), {})[n] = m
            for group in groups.values():
                x = _to(example_input(next(iter(group)), res, batch, n_frames), device)
                if train:  # training first: some PEs cache index tensors, which inference mode would make read-only
                    log(f"  {where}: timing training of {', '.join(group)}")
                    _time_group(group, by_name, baseline, x, True, tick, rounds, steps)
                if infer:
                    log(f"  {where}: timing inference of {', '.join(group)}")
                    _time_group(group, by_name, baseline, x, False, tick, rounds, steps)
        if memory:
            for name, (model, kwargs, _) in built.items():
                log(f"  {where}: peak memory of {name}")
                row = by_name[name]
                row.baseline = row.baseline or (baseline if baseline in built else next(iter(built)))
                row.infer_mem_mb = _peak(row, False, kwargs, device, model) if infer else None
                row.train_mem_mb = _peak(row, True, kwargs, device, model) if train else None
                if train and n_frames is not None:
                    row.saved_act_mb = saved_activation_mb(model.cpu(), example_input(name, res, 1, n_frames))
        for model, _, _ in built.values():
            model.cpu()
        del built
    return rows


def _peak(row: SpeedRow, train: bool, kwargs: dict, device: str, model: nn.Module) -> float | None:
    """The row's peak memory, or None with a note saying why the probe failed."""
    try:
        return peak_memory_mb(row.model, row.resolution, 1, train, kwargs, row.frames, device, model)
    except RuntimeError as e:
        last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        row.notes.append(f"{'training' if train else 'inference'} memory not measured: {last[:160]}")
        return None


# -------------------------------------------------------------------------------------------------------- zoo plan

ZOO_SIZES = {"vit": "s", "swin": "t", "cvt": "13", "vivit": "t", "mm": "t"}  # the size each card times, all PEs


def zoo_plan() -> list[tuple[str, list[str]]]:
    """(family, models): every PE of the family's representative size, the baseline (first PE) first."""
    plan = []
    for fam in FAMILIES.values():
        size = ZOO_SIZES.get(fam.name, next(iter(fam.sizes)))
        plan.append((fam.name, [model_name(fam.name, size, pe) for pe in fam.pes]))
    return plan


def zoo_sizes_plan() -> list[str]:
    """Every size of each family with its baseline PE (parameters and FLOPs only)."""
    return [model_name(fam.name, size, next(iter(fam.pes))) for fam in FAMILIES.values() for size in fam.sizes]


def _default_resolution(name: str) -> int:
    return int(timm.get_pretrained_cfg(name).input_size[-1])


def run_zoo(args) -> list[SpeedRow]:
    rows: list[SpeedRow] = []
    for fam, models in zoo_plan():
        res = _default_resolution(models[0])
        print(f"{fam}: {len(models)} models at {res} px")
        rows += measure(models, [res], **_measure_kwargs(args))
    timed = {r.model for r in rows}
    for name in zoo_sizes_plan():
        if name in timed:
            continue
        res = _default_resolution(name)
        print(f"{name}: parameters and FLOPs at {res} px")
        rows.append(_static_row(name, {name: (create_model(name), {}, True)}, res, None, False, True, "cpu"))
    return rows


def _measure_kwargs(args) -> dict:
    same = {k: getattr(args, k) for k in ("batch", "rounds", "steps", "train", "infer", "flops", "device", "clock")}
    return dict(same, memory=args.mode != "time", timing=args.mode != "memory", with_timm=args.timm)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="visionpe-bench speed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = ap.add_argument
    add("--models", nargs="+", help="names or glob patterns (default: vit_s_ape vit_s_rope2d_mixed swin_t_rpb cvt_13)")
    add("--baseline", help="the model every ratio is against (default: the first listed)")
    add("--resolutions", nargs="+", type=int, help="image sizes (default 224; with --data: the dataset's own)")
    add("--frames", nargs="+", type=int, help="clip lengths of video models")
    add("--mode", choices=("time", "memory", "both"), default="both")
    phase = ap.add_mutually_exclusive_group()
    phase.add_argument("--train", dest="phase", action="store_const", const="train", help="training steps only")
    phase.add_argument("--infer", dest="phase", action="store_const", const="infer", help="inference only")
    phase.add_argument("--no-train", dest="phase", action="store_const", const="infer", help=argparse.SUPPRESS)
    add("--no-memory", dest="mode", action="store_const", const="time", help=argparse.SUPPRESS)
    add("--zoo", action="store_true", help="every PE of one size per family, and every size's FLOPs (for the cards)")
    add("--compile", action="store_true", help="torch.compile vs eager, compiled ours vs timm, at the first size")
    add("--data", help="image dataset name: training loader vs training step in images/s (default models vit_n_*)")
    add("--data-options", nargs="+", default=[], metavar="KEY=VALUE", help="dataset options with --data")
    add("--workers", type=int, nargs="+", default=[0, 1], help="loader worker counts (with --data)")
    add("--root", help="dataset folder (with --data)")
    add("--batch", type=int, help="batch size (default 4; 1 with --compile; 128 with --data)")
    add("--rounds", type=int, default=3)
    add("--steps", type=int, default=2)
    add("--clock", choices=CLOCKS, help="cpu: CPU seconds of one thread (default on CPU); wall: wall-clock")
    add("--threads", type=int, help="torch threads (default: 1 with --clock cpu)")
    add("--no-timm", dest="timm", action="store_false", help="do not measure timm's equivalents")
    add("--no-flops", dest="flops", action="store_false", help="skip FLOP counting (slow at large sizes)")
    add("--device", default="cpu")
    add("--out", help="output path without suffix (default results/speed/{speed,zoo,data}); .json and .md")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    args.train, args.infer = args.phase in (None, "train"), args.phase in (None, "infer")
    args.clock = args.clock or ("wall" if args.data else Clock.default(args.device))
    args.batch = args.batch or (128 if args.data else 1 if args.compile else 4)
    if args.clock == "cpu" and not args.device.startswith("cpu"):
        ap.error(f"--clock cpu counts CPU work; use --clock wall on {args.device}")
    if args.resolutions is None and not args.data:
        args.resolutions = [224]
    if args.resolutions is not None and (not args.resolutions or any(r <= 0 for r in args.resolutions)):
        ap.error(f"--resolutions takes positive pixel sizes, got {args.resolutions}")
    if args.frames is not None and any(f <= 0 for f in args.frames):
        ap.error(f"--frames takes positive clip lengths, got {args.frames}")
    if args.batch <= 0 or args.rounds <= 0 or args.steps <= 0:
        ap.error("--batch, --rounds and --steps must be positive")
    try:
        default = ["vit_n_*"] if args.data else _COMPILE_MODELS if args.compile else _DEFAULT_MODELS
        models = expand_models(args.models or default)
        if args.baseline:
            expand_models([args.baseline])
    except ValueError as e:
        ap.error(str(e).splitlines()[0])
    t0 = time.perf_counter()
    with torch_threads(args.threads or (1 if args.clock == "cpu" else None)):
        machine = machine_info(args.device)
        settings = dict(
            batch=args.batch, rounds=args.rounds, steps=args.steps, clock=args.clock, zoo=args.zoo, mode=args.mode
        )
        if args.compile:
            json_path, md_path = run_compile(args, models, machine, settings, t0)
        elif args.data:
            options = _data_options(ap, args.data_options)
            result = measure_data(
                args.data,
                models,
                args.batch,
                args.rounds,
                args.steps,
                args.workers,
                args.root,
                args.resolutions,
                options,
            )
            settings.update(seconds=round(time.perf_counter() - t0, 1), clock="wall")
            json_path, md_path = write_data_results(result, Path(args.out or "results/speed/data"), machine, settings)
        else:
            if args.zoo:
                rows = run_zoo(args)
            else:
                kw = _measure_kwargs(args)
                rows = measure(models, args.resolutions, frames=args.frames, baseline=args.baseline, **kw)
            settings.update(seconds=round(time.perf_counter() - t0, 1))
            out = Path(args.out or ("results/speed/zoo" if args.zoo else "results/speed/speed"))
            json_path, md_path = write_results(rows, out, machine, settings)
    print(md_path.read_text())
    print(f"wrote {json_path} and {md_path}")
    return 0


def _data_options(ap: argparse.ArgumentParser, items: list[str]) -> dict:
    """`KEY=VALUE` words as a config's data.options (values read as YAML: numbers, booleans, lists)."""
    bad = [item for item in items if not item.partition("=")[0].strip() or "=" not in item]
    if bad:
        ap.error(f"--data-options takes KEY=VALUE words, got {bad[0]!r}")
    return apply_overrides(Config(), [f"data.options.{item}" for item in items]).data.options


_DEFAULT_MODELS = ["vit_s_ape", "vit_s_rope2d_mixed", "swin_t_rpb", "cvt_13"]
_COMPILE_MODELS = ["vit_s_rope2d_mixed", "swin_t_rpb"]


# ---------------------------------------------------------------------------------------------------------- the report


def spread_text(d: dict | None) -> str:
    return "-" if not d else Spread(**d).text()


def memory_ratio_text(r: SpeedRow, base: SpeedRow | None) -> str:
    parts = []
    for key in ("infer_mem_mb", "train_mem_mb"):
        a, b = getattr(r, key), base and getattr(base, key)
        parts.append(f"{a / b:.2f}" if a and b else "-")
    return " / ".join(parts)


def growth_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope k of log y = k log x + c."""
    return statistics.linear_regression([math.log(x) for x in xs], [math.log(y) for y in ys]).slope


def scaling(rows: list[SpeedRow]) -> dict[str, dict]:
    """Per model with two or more token counts: exponents a, b of time per item ~ N^a and memory ~ N^b (fit)."""
    out = {}
    for name in dict.fromkeys(r.model for r in rows):
        rs = sorted((r for r in rows if r.model == name and r.tokens), key=lambda r: r.tokens)
        if len(rs) < 2 or rs[0].tokens == rs[-1].tokens:
            continue
        entry: dict = dict(tokens=[rs[0].tokens, rs[-1].tokens])
        timed = [r for r in rs if r.infer_ips or r.train_ips]
        if len({r.tokens for r in timed}) >= 2:
            key = "infer_ips" if all(r.infer_ips for r in timed) else "train_ips"
            entry["time_exp"] = growth_exponent([r.tokens for r in timed], [1 / getattr(r, key) for r in timed])
        mem_key = "infer_mem_mb" if any(r.infer_mem_mb for r in rs) else "train_mem_mb"
        for key, label in ((mem_key, "memory_exp"), ("saved_act_mb", "activation_exp")):
            mem = [r for r in rs if getattr(r, key)]
            if len({r.tokens for r in mem}) >= 2:
                entry[label] = growth_exponent([r.tokens for r in mem], [getattr(r, key) for r in mem])
        if len(entry) > 1:
            out[name] = entry
    return out


def _clock_text(settings: dict) -> str:
    return Clock(settings.get("clock", "wall")).describe() if settings.get("clock") in CLOCKS else "wall-clock seconds"


def format_markdown(rows: list[SpeedRow], machine: dict, settings: dict) -> str:
    rounds = settings["rounds"]
    spread_word = "interquartile range" if rounds >= 4 else "min-max"
    lines = [
        f"# Speed, memory and FLOPs ({machine['date']})",
        "",
        f"Measured on {machine_description(machine)}; batch {settings['batch']}, {rounds} interleaved rounds of "
        f"{settings['steps']} steps, timed in {_clock_text(settings)}. Images/s (clips/s for video) are medians "
        f"over the rounds; ratios are taken per round against the baseline and against timm's equivalent model "
        f"(same architecture) measured in the same rounds, given as median [{spread_word}]. GFLOPs are fvcore "
        f"MACs per item with attention counted; memory is the peak of one step of one item beyond the weights "
        f"(infer / train).",
        "",
    ]
    by = {(r.model, r.resolution, r.frames): r for r in rows}
    table = [
        [r.model, r.resolution, r.frames or "-", r.tokens, f"{r.params_m:.2f}", fmt(r.gflops, ".3f"),
         fmt(r.infer_ips, ".1f"), fmt(r.train_ips, ".1f"), fmt(r.infer_mem_mb, ".0f"), fmt(r.train_mem_mb, ".0f"),
         r.baseline or "-", spread_text(r.infer_vs_base), spread_text(r.train_vs_base),
         memory_ratio_text(r, by.get((r.baseline, r.resolution, r.frames)) if r.baseline else None),
         spread_text(r.infer_vs_timm), spread_text(r.train_vs_timm)]
        for r in rows
    ]  # fmt: skip
    heads = ["model", "px", "frames", "tokens", "params (M)", "GFLOPs", "infer img/s", "train img/s", "infer MiB",
             "train MiB", "baseline", "infer vs base", "train vs base", "memory vs base", "infer vs timm",
             "train vs timm"]  # fmt: skip
    lines += md_table(heads, "lrrrrrrrrrlrrrrr", table)
    if any(r.saved_act_mb for r in rows):
        lines += ["", "Activations autograd saves for backward (one clip, MiB):", ""]
        lines += [f"- {r.model} @ {r.frames} x {r.resolution}: {r.saved_act_mb:.0f}" for r in rows if r.saved_act_mb]
    grow = scaling(rows)
    if grow:
        lines += ["", "Growth with the number of tokens N (least-squares power-law fit over the sizes measured):", ""]
        table = [[name, f"{g['tokens'][0]} -> {g['tokens'][1]}",
                  *(f"{g[k]:.2f}" if k in g else "-" for k in ("time_exp", "memory_exp", "activation_exp"))]
                 for name, g in grow.items()]  # fmt: skip
        heads = ["model", "N", "time per item ~ N^a", "memory ~ N^b", "saved activations ~ N^c"]
        lines += md_table(heads, "llrrr", table)
    notes = [f"- {r.model} @ {r.resolution}: {n}" for r in rows for n in r.notes]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def _write_pair(out: Path, data: dict, markdown: str) -> tuple[Path, Path]:
    """out.json and out.md, atomically; nothing when nothing was measured (a committed file is never emptied)."""
    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    if not data.get("rows"):
        raise ValueError(f"nothing was measured; {json_path} and {md_path} are left as they are")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(json_path, json.dumps(data, indent=1) + "\n")
    atomic_write_text(md_path, markdown)
    return json_path, md_path


def write_results(rows: list[SpeedRow], out: Path, machine: dict, settings: dict) -> tuple[Path, Path]:
    data = dict(machine=machine, settings=settings, rows=[asdict(r) for r in rows], scaling=scaling(rows))
    return _write_pair(out, data, format_markdown(rows, machine, settings))


# ------------------------------------------------------------------------------------------------------- torch.compile


@dataclass
class CompileRow:
    model: str
    resolution: int
    reference: str | None = None  # timm's model with the same weights, or None
    compile_s: float = 0.0  # wall-clock seconds of the first compiled call (tracing + code generation)
    ref_compile_s: float | None = None
    eager_ips: float = 0.0  # images/s, median over the rounds
    compiled_ips: float = 0.0
    compiled_vs_eager: dict = field(default_factory=dict)  # Spread of per-round time ratios compiled / eager
    ref_compiled_vs_eager: dict | None = None
    ours_vs_timm_eager: dict | None = None  # Spread of per-round time ratios ours / timm's, both eager
    ours_vs_timm_compiled: dict | None = None  # ... both compiled
    max_diff_compiled: float = 0.0  # max |compiled - eager| of our logits
    max_diff_timm: float | None = None  # max |ours - timm's| of the eager logits (same weights)
    notes: list[str] = field(default_factory=list)


def _same_weights(name: str, kwargs: dict, ref: nn.Module) -> nn.Module:
    """Our model built to timm's architecture and loaded with timm's weights through the family's converter."""
    ours = create_model(name, **kwargs)
    state = family_of(name).filter_fn(ref.state_dict(), ours)
    ours.load_state_dict(state)
    return ours


def _first_call(model: nn.Module, x: torch.Tensor) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    with torch.inference_mode():
        out = model(x)
    return time.perf_counter() - start, out


def _time_ratios(rates: dict[str, list[float]], a: str, b: str) -> dict:
    """Per-round time of `a` over time of `b` (= rate of b / rate of a)."""
    return spread([rb / ra for ra, rb in zip(rates[a], rates[b])]).as_dict()


def measure_compiled(
    models: list[str],
    resolution: int = 224,
    batch: int = 1,
    rounds: int = 5,
    steps: int = 2,
    clock: str = "cpu",
    with_timm: bool = True,
    log=print,
) -> list[CompileRow]:
    """One CompileRow per model: eager and compiled inference (and timm's, same weights) interleaved."""
    tick = Clock(clock, "cpu")
    rows = []
    for name in models:
        pair = timm_equivalent(name) if with_timm else None
        ref = timm.create_model(pair[0], img_size=resolution).eval() if pair else None
        ours = (_same_weights(name, pair[1], ref) if pair else create_model(name)).eval()
        x = example_input(name, resolution, batch)
        row = CompileRow(name, resolution, pair[0] if pair else None)
        with torch.inference_mode():
            eager_out = ours(x)
        if ref is not None:
            with torch.inference_mode():
                row.max_diff_timm = (eager_out - ref(x)).abs().max().item()
        torch._dynamo.reset()
        log(f"  {resolution} px: compiling {name}")
        compiled = torch.compile(ours)
        row.compile_s, out = _first_call(compiled, x)
        row.max_diff_compiled = (out - eager_out).abs().max().item()
        tasks = {"ours": model_step(ours, x, False), "ours+compile": model_step(compiled, x, False)}
        if ref is not None:
            log(f"  {resolution} px: compiling {pair[0]}")
            ref_compiled = torch.compile(ref)
            row.ref_compile_s, _ = _first_call(ref_compiled, x)
            tasks.update(timm=model_step(ref, x, False), **{"timm+compile": model_step(ref_compiled, x, False)})
        log(f"  {resolution} px: timing {', '.join(tasks)} ({rounds} interleaved rounds)")
        rates = interleave(tasks, tick, rounds, steps)
        row.eager_ips, row.compiled_ips = spread(rates["ours"]).median, spread(rates["ours+compile"]).median
        row.compiled_vs_eager = _time_ratios(rates, "ours+compile", "ours")
        if ref is not None:
            row.ref_compiled_vs_eager = _time_ratios(rates, "timm+compile", "timm")
            row.ours_vs_timm_eager = _time_ratios(rates, "ours", "timm")
            row.ours_vs_timm_compiled = _time_ratios(rates, "ours+compile", "timm+compile")
            row.notes.append(f"built with {pair[1] or 'defaults'} and loaded with {pair[0]}'s weights")
        rows.append(row)
        del compiled, ours, ref
        torch._dynamo.reset()
    return rows


def format_compile_markdown(rows: list[CompileRow], machine: dict, settings: dict) -> str:
    word = "interquartile range" if settings["rounds"] >= 4 else "min-max"
    lines = [
        f"# torch.compile: compiled vs eager, ours vs timm ({machine['date']})",
        "",
        f"Measured on {machine_description(machine)}; inference, batch {settings['batch']}, "
        f"{settings['resolution']} px, {settings['rounds']} interleaved rounds of {settings['steps']} steps, timed "
        f"in {Clock(settings['clock']).describe()}; load average {settings['load']}. `torch.compile` with its "
        f"defaults (inductor). Ratios are of time per image, taken per round and given as median [{word}]: below 1 "
        "is faster. timm's model is loaded with the same weights as ours. Compile time is the wall-clock time of "
        "the first call (machine shared, so only indicative).",
        "",
    ]
    table = [
        [r.model, r.reference or "-", f"{r.eager_ips:.2f}", f"{r.compiled_ips:.2f}", spread_text(r.compiled_vs_eager),
         spread_text(r.ref_compiled_vs_eager), spread_text(r.ours_vs_timm_eager),
         spread_text(r.ours_vs_timm_compiled), f"{r.compile_s:.0f} / " + fmt(r.ref_compile_s, ".0f"),
         f"{r.max_diff_compiled:.1e}", fmt(r.max_diff_timm, ".1e")]
        for r in rows
    ]  # fmt: skip
    heads = ["model", "timm model", "eager img/s", "compiled img/s", "compiled / eager", "timm compiled / eager",
             "ours / timm, eager", "ours / timm, compiled", "compile s (ours / timm)", "max diff compiled-eager",
             "max diff ours-timm"]  # fmt: skip
    lines += md_table(heads, "llrrrrrrrrr", table)
    notes = [f"- {r.model}: {n}" for r in rows for n in r.notes]
    return "\n".join(lines + (["", "Notes:", *notes] if notes else [])) + "\n"


def write_compile_results(rows: list[CompileRow], out: Path, machine: dict, settings: dict) -> tuple[Path, Path]:
    data = dict(machine=machine, settings=settings, rows=[asdict(r) for r in rows])
    return _write_pair(out, data, format_compile_markdown(rows, machine, settings))


def run_compile(args, models: list[str], machine: dict, settings: dict, t0: float) -> tuple[Path, Path]:
    """`speed --compile`: measure at the first resolution and write results/compile/compile.{json,md} (not under
    results/speed, whose files the model cards read as speed rows)."""
    res = args.resolutions[0]
    rows = measure_compiled(models, res, args.batch, args.rounds, args.steps, args.clock, args.timm)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    settings.update(seconds=round(time.perf_counter() - t0, 1), resolution=res, load=load)
    return write_compile_results(rows, Path(args.out or "results/compile/compile"), machine, settings)


# ----------------------------------------------------------------------------------------------------- data throughput

_NATIVE_SIZE = {"fashion-mnist": 28}  # datasets measured at their own size when no --resolutions are given


def _batches(dataset, batch: int, resolutions: list[int], workers: int):
    """Endless training batches (a new epoch when one ends)."""
    loader = build_train_loader(dataset, batch, resolutions, seed=0, workers=workers)
    epoch = 0
    while True:
        loader.batch_sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _trainer(name: str, size: int, chans: int, classes: int) -> Callable:
    model = timm.create_model(name, num_classes=classes, in_chans=chans, img_size=size)
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)

    def step(x, y) -> int:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return len(y)

    return step


def measure_data(
    dataset_name: str,
    models: list[str],
    batch: int,
    rounds: int,
    steps: int,
    workers: list[int],
    root: str | None,
    resolutions: list[int] | None = None,
    options: dict | None = None,
) -> dict:
    """Images/s of each loader setting, training step and loop, with per-round ratios against the first step.
    `resolutions`: the first is the measured size, all of them the multi-size loader's (default: the dataset's
    native size and 0.7x / 1.3x of it); `options` go to the dataset factory (e.g. num_train, item)."""
    info = get_dataset_info(dataset_name)
    if info.kind != "image":
        raise ValueError(f"--data measures image datasets; {dataset_name!r} is a {info.kind} dataset")
    if not resolutions:
        if dataset_name not in _NATIVE_SIZE:
            raise ValueError(f"give the size to measure {dataset_name!r} at with --resolutions (e.g. --resolutions 32)")
        size = _NATIVE_SIZE[dataset_name]
        resolutions = [size, round(size * 0.7), round(size * 1.3)]
    size, chans = resolutions[0], info.in_chans
    ds = build_dataset(info, "train", size, root=root, options=options, training=True)
    classes = dataset_num_classes(info, ds)
    sizes = [(f"{size}px", [size])]
    if len(resolutions) > 1:
        sizes.append((f"sizes {'/'.join(map(str, resolutions))}", resolutions))
    tasks: dict[str, Callable[[], int]] = {}
    for w in workers:
        for label, res in sizes:
            it = _batches(ds, batch, res, w)
            tasks[f"loader {label}, {w} worker(s)"] = lambda it=it: len(next(it).targets)
    x, y = torch.randn(batch, chans, size, size), torch.randint(0, classes, (batch,))
    for name in models:
        trainer = _trainer(name, size, chans, classes)
        tasks[f"step {name}"] = lambda s=trainer: s(x, y)
    for w in workers:
        it, s = _batches(ds, batch, [size], w), _trainer(models[0], size, chans, classes)
        tasks[f"loop {models[0]}, {w} worker(s)"] = lambda it=it, s=s: (lambda b: s(b.inputs, b.targets))(next(it))
    rates = interleave(tasks, Clock("wall"), rounds, steps, warmup=2)
    baseline = f"step {models[0]}"
    ratios = paired_ratios(rates, baseline)
    rows = [dict(task=n, ips=spread(v).as_dict(), vs_base=spread(ratios[n]).as_dict()) for n, v in rates.items()]
    return dict(
        dataset=dataset_name,
        options=options or {},
        images=len(ds),
        batch=batch,
        workers=workers,
        baseline=baseline,
        rows=rows,
    )


def _options_text(options: dict | None) -> str:
    return f" ({', '.join(f'{k}={v}' for k, v in options.items())})" if options else ""


def write_data_results(result: dict, out: Path, machine: dict, settings: dict) -> tuple[Path, Path]:
    lines = [
        f"# Loader vs training step: {result['dataset']}{_options_text(result.get('options'))} ({machine['date']})",
        "",
        f"{machine['cpu']}, {machine['threads']} torch threads, batch {result['batch']}, {settings['rounds']} "
        f"interleaved rounds of {settings['steps']} batches, wall-clock seconds. Ratios per round against "
        f"{result['baseline']}: median [spread].",
        "",
    ]
    table = [[r["task"], Spread(**r["ips"]).text(".0f"), Spread(**r["vs_base"]).text(".2f")] for r in result["rows"]]
    lines += md_table(["task", "images/s", f"vs {result['baseline']}"], "lrr", table)
    return _write_pair(out, dict(machine=machine, settings=settings, **result), "\n".join(lines) + "\n")
