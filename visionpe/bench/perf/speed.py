"""`visionpe-bench speed`: images/s, peak memory, parameters and FLOPs at a list of resolutions (and clip lengths),
against a baseline and timm's equivalent model measured in the same rounds; `--zoo` for the cards, `--compile` for
torch.compile, `--data` for loader throughput (docs/benchmark.md).

    python -m visionpe.bench speed --models 'vit_s_*' --baseline vit_s_ape --infer --resolutions 224
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import timm
import torch
from timm.optim import create_optimizer_v2
from torch import nn

import visionpe  # noqa: F401  (registers the models)

from ...data import build_dataset, build_train_loader, dataset_num_classes, get_dataset_info
from ...engine.cli import positive_int
from ...engine.config import Config, apply_overrides
from ...engine.setup import to_device
from ...zoo.registry import (
    FAMILIES,
    create_model,
    expand_models,
    family_of,
    list_visionpe_models,
    model_name,
    timm_equivalent,
)
from ..report import check_files, fmt, md_table, write_files
from ..settings import MAX_SIZE_PX, check_device, check_sizes
from .measure import (
    CLOCKS,
    Clock,
    Spread,
    count_flops,
    example_input,
    interleave,
    is_video,
    machine_info,
    model_step,
    paired_ratios,
    peak_memory_mb,
    saved_activation_mb,
    spread,
    spread_word,
    torch_threads,
)
from .speed_report import SpeedRow, format_markdown, markdown_page, scaling, spread_text, timed_text

_DEFAULT_MODELS = ["vit_s_ape", "vit_s_rope2d_mixed", "swin_t_rpb", "cvt_13"]
_COMPILE_MODELS = ["vit_s_rope2d_mixed", "swin_t_rpb"]


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


def _points(models: list[str], resolutions: list[int], frames: list[int] | None) -> list[tuple[int, int | None, list]]:
    """(resolution, frames, models measured there): image models once per resolution, video models per length."""
    video = [m for m in models if is_video(m)]
    image = [m for m in models if m not in video]
    points = []
    for res in resolutions:
        if image or not frames:
            points.append((res, None, image + ([] if frames else video)))
        points += [(res, f, video) for f in frames or [] if video]
    return [p for p in points if p[2]]


def _build_point(names: list[str], res: int, n_frames: int | None, with_timm: bool, log) -> dict:
    """name -> (model, kwargs, ours) for the models measured at one point, timm's equivalents next to ours (timm's
    models fix their size at creation)."""
    built: dict[str, tuple[nn.Module, dict, bool]] = {}
    for name in names:
        pair = timm_equivalent(name) if with_timm and n_frames is None else None
        kwargs = dict(pair[1]) if pair else {}
        ours = name in list_visionpe_models()
        built[name] = (create_model(name, **kwargs) if ours else timm.create_model(name, img_size=res), kwargs, True)
        if pair and pair[0] not in built:
            try:
                built[pair[0]] = (timm.create_model(pair[0], img_size=res), {"img_size": res}, False)
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
            row.gflops = sum(count_flops(model, example_input(name, res, 1, n_frames)).values()) / 1e9
        except Exception as e:  # a model fvcore cannot trace still gets its speed measured
            row.notes.append(f"FLOPs not counted: {type(e).__name__}: {str(e)[:120]}")
    return row


def _time_group(group: dict, rows: dict, baseline: str | None, x, train: bool, clock: Clock, rounds, steps) -> None:
    """Interleave one group of models on the same input; fill images/s and per-round ratios into their rows."""
    rates = interleave({n: model_step(m, x, train) for n, m in group.items()}, clock, rounds, steps)
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


def _peak(row: SpeedRow, train: bool, kwargs: dict, device: str, model: nn.Module) -> float | None:
    """The row's peak memory, or None with a note saying why the probe failed."""
    try:
        return peak_memory_mb(row.model, row.resolution, 1, train, kwargs, row.frames, device, model)
    except RuntimeError as e:
        last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        row.notes.append(f"{'training' if train else 'inference'} memory not measured: {last[:160]}")
        return None


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
        groups: dict[str, dict[str, nn.Module]] = {}  # models that take the same input are interleaved together
        for n, (m, _, _) in built.items():
            x = example_input(n, res, 1, n_frames)
            shapes = sorted((k, tuple(v.shape)) for k, v in x.items()) if isinstance(x, dict) else tuple(x.shape)
            groups.setdefault(repr(shapes), {})[n] = m
        for group in groups.values() if timing else ():
            x = to_device(example_input(next(iter(group)), res, batch, n_frames), device)
            # training first: some PEs cache index tensors, which inference mode would make read-only
            for phase, on, word in ((True, train, "training"), (False, infer, "inference")):
                if on:
                    log(f"  {where}: timing {word} of {', '.join(group)}")
                    _time_group(group, by_name, baseline, x, phase, tick, rounds, steps)
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
        del built  # before the next point's models are built
    return rows


# -------------------------------------------------------------------------------------------------------- zoo plan

ZOO_SIZES = {"vit": "s", "swin": "t", "cvt": "13", "vivit": "t", "mm": "t"}  # the size each card times, all PEs


def default_resolution(name: str) -> int:
    """A registered model's default input size (its pretrained cfg's)."""
    return int(timm.get_pretrained_cfg(name).input_size[-1])


def run_zoo(args) -> list[SpeedRow]:
    """`--zoo`: every PE of each family at its ZOO_SIZES size, the baseline (first PE) first; then every other size
    of each family with its first PE (parameters and FLOPs only)."""
    rows: list[SpeedRow] = []
    for fam in FAMILIES.values():
        models = [model_name(fam.name, ZOO_SIZES.get(fam.name, next(iter(fam.sizes))), pe) for pe in fam.pes]
        res = default_resolution(models[0])
        print(f"{fam.name}: {len(models)} models at {res} px")
        rows += measure(models, [res], **_measure_kwargs(args))
    timed = {r.model for r in rows}
    for name in [model_name(fam.name, size, next(iter(fam.pes))) for fam in FAMILIES.values() for size in fam.sizes]:
        if name not in timed:
            res = default_resolution(name)
            print(f"{name}: parameters and FLOPs at {res} px")
            rows.append(_static_row(name, {name: (create_model(name), {}, True)}, res, None, False, True, "cpu"))
    return rows


def _measure_kwargs(args) -> dict:
    same = {k: getattr(args, k) for k in ("batch", "rounds", "steps", "train", "infer", "flops", "device", "clock")}
    return dict(same, memory=args.mode != "time", timing=args.mode != "memory", with_timm=args.timm)


def run_speed(args, machine: dict, settings: dict, t0: float) -> tuple[dict, str]:
    """`speed` (and `speed --zoo`): the rows, their growth with the token count, and their page."""
    kwargs = dict(frames=args.frames, baseline=args.baseline, **_measure_kwargs(args))
    rows = run_zoo(args) if args.zoo else measure(args.models, args.resolutions, **kwargs)
    settings.update(seconds=round(time.perf_counter() - t0, 1))
    data = dict(machine=machine, settings=settings, rows=[asdict(r) for r in rows], scaling=scaling(rows))
    return data, format_markdown(rows, machine, settings)


def write_results(out: Path, data: dict, markdown: str) -> tuple[Path, Path]:
    """out.json and out.md for every kind of speed run; nothing when nothing was measured (a committed file is never
    emptied)."""
    if not data.get("rows"):
        raise ValueError(f"nothing was measured; {out}.json and {out}.md are left as they are")
    return write_files(out, data, markdown)


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


def _compiled(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, float, torch.Tensor]:
    """torch.compile(model), the wall-clock seconds of its first call (tracing + code generation) and its output."""
    compiled = torch.compile(model)
    start = time.perf_counter()
    with torch.inference_mode():
        out = compiled(x)
    return compiled, time.perf_counter() - start, out


def _compile_row(name: str, resolution: int, settings: dict, with_timm: bool, log) -> CompileRow:
    """Eager and compiled inference of one model (and of timm's with the same weights), interleaved."""
    pair = timm_equivalent(name) if with_timm else None
    ref = timm.create_model(pair[0], img_size=resolution).eval() if pair else None
    ours = create_model(name, **(pair[1] if pair else {})).eval()
    if ref is not None:  # timm's weights, through the family's converter
        ours.load_state_dict(family_of(name).filter_fn(ref.state_dict(), ours))
    x = example_input(name, resolution, settings["batch"])
    row = CompileRow(name, resolution, pair[0] if pair else None)
    with torch.inference_mode():
        eager_out = ours(x)
        row.max_diff_timm = None if ref is None else (eager_out - ref(x)).abs().max().item()
    torch._dynamo.reset()
    log(f"  {resolution} px: compiling {name}")
    compiled, row.compile_s, out = _compiled(ours, x)
    row.max_diff_compiled = (out - eager_out).abs().max().item()
    tasks = {"ours": model_step(ours, x, False), "ours+compile": model_step(compiled, x, False)}
    if ref is not None:
        log(f"  {resolution} px: compiling {pair[0]}")
        ref_compiled, row.ref_compile_s, _ = _compiled(ref, x)
        tasks.update(timm=model_step(ref, x, False), **{"timm+compile": model_step(ref_compiled, x, False)})
    log(f"  {resolution} px: timing {', '.join(tasks)} ({settings['rounds']} interleaved rounds)")
    rates = interleave(tasks, Clock(settings["clock"], "cpu"), settings["rounds"], settings["steps"])

    def time_ratio(a: str, b: str) -> dict:  # per-round time of a over time of b
        return spread(paired_ratios(rates, a)[b]).as_dict()

    row.eager_ips, row.compiled_ips = spread(rates["ours"]).median, spread(rates["ours+compile"]).median
    row.compiled_vs_eager = time_ratio("ours+compile", "ours")
    if ref is not None:
        row.ref_compiled_vs_eager = time_ratio("timm+compile", "timm")
        row.ours_vs_timm_eager = time_ratio("ours", "timm")
        row.ours_vs_timm_compiled = time_ratio("ours+compile", "timm+compile")
        row.notes.append(f"built with {pair[1] or 'defaults'} and loaded with {pair[0]}'s weights")
    torch._dynamo.reset()
    return row


def format_compile_markdown(rows: list[CompileRow], machine: dict, settings: dict) -> str:
    intro = (
        f"{timed_text(machine, settings, 'inference, batch {batch}, {resolution} px')}; load average "
        f"{settings['load']}. `torch.compile` with its defaults (inductor). Ratios are of time per image, taken per "
        f"round and given as median [{spread_word(settings['rounds'])}]: below 1 is faster. timm's model is loaded "
        "with the same weights as ours. Compile time is the wall-clock time of the first call (machine shared, so "
        "only indicative)."
    )
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
    notes = [f"- {r.model}: {n}" for r in rows for n in r.notes]
    title = f"torch.compile: compiled vs eager, ours vs timm ({machine['date']})"
    return markdown_page(title, intro, md_table(heads, "llrrrrrrrrr", table), notes and ["Notes:", *notes])


def run_compile(args, machine: dict, settings: dict, t0: float) -> tuple[dict, str]:
    """`speed --compile`, at the first resolution (written under results/compile, not results/speed, whose files the
    model cards read as speed rows)."""
    res = args.resolutions[0]
    rows = [_compile_row(name, res, settings, args.timm, print) for name in args.models]
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    settings.update(seconds=round(time.perf_counter() - t0, 1), resolution=res, load=load)
    data = dict(machine=machine, settings=settings, rows=[asdict(r) for r in rows])
    return data, format_compile_markdown(rows, machine, settings)


# ----------------------------------------------------------------------------------------------------- data throughput

_NATIVE_SIZE = {"fashion-mnist": 28}  # datasets measured at their own size when no --resolutions are given


def _batches(dataset, batch: int, resolutions: list[int], workers: int):
    """Endless training batches (a new epoch when one ends)."""
    loader = build_train_loader(dataset, batch, resolutions, seed=0, workers=workers)
    for epoch in itertools.count():
        loader.batch_sampler.set_epoch(epoch)
        yield from loader


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


def _data_sizes(name: str, resolutions: list[int] | None) -> list[int]:
    """The measured size first, then the multi-size loader's sizes (default: native, 0.7x and 1.3x of it)."""
    if resolutions:
        return resolutions
    if name not in _NATIVE_SIZE:
        raise ValueError(f"give the size to measure {name!r} at with --resolutions (e.g. --resolutions 32)")
    size = _NATIVE_SIZE[name]
    return [size, round(size * 0.7), round(size * 1.3)]


def measure_data(name: str, models: list[str], settings: dict, workers: list[int], root, resolutions, options) -> dict:
    """Images/s of each loader setting, training step and loop, with per-round ratios against the first step.
    `resolutions`: see _data_sizes; `options` go to the dataset factory (e.g. num_train, item)."""
    info = get_dataset_info(name)
    if info.kind != "image":
        raise ValueError(f"--data measures image datasets; {name!r} is a {info.kind} dataset")
    resolutions = _data_sizes(name, resolutions)
    size, chans, batch = resolutions[0], info.in_chans, settings["batch"]
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
    for model in models:
        trainer = _trainer(model, size, chans, classes)
        tasks[f"step {model}"] = lambda s=trainer: s(x, y)
    for w in workers:
        it, s = _batches(ds, batch, [size], w), _trainer(models[0], size, chans, classes)
        tasks[f"loop {models[0]}, {w} worker(s)"] = lambda it=it, s=s: (lambda b: s(b.inputs, b.targets))(next(it))
    rates = interleave(tasks, Clock("wall"), settings["rounds"], settings["steps"], warmup=2)
    baseline = f"step {models[0]}"
    ratios = paired_ratios(rates, baseline)
    rows = [dict(task=n, ips=spread(v).as_dict(), vs_base=spread(ratios[n]).as_dict()) for n, v in rates.items()]
    return dict(
        dataset=name, options=options or {}, images=len(ds), batch=batch, workers=workers, baseline=baseline, rows=rows
    )


def run_data(args, machine: dict, settings: dict, t0: float) -> tuple[dict, str]:
    """`speed --data`."""
    options = apply_overrides(Config(), [f"data.options.{item}" for item in args.data_options]).data.options
    result = measure_data(args.data, args.models, settings, args.workers, args.root, args.resolutions, options)
    settings.update(seconds=round(time.perf_counter() - t0, 1), clock="wall")
    opts = f" ({', '.join(f'{k}={v}' for k, v in options.items())})" if options else ""
    intro = (
        f"{machine['cpu']}, {machine['threads']} torch threads, batch {result['batch']}, {settings['rounds']} "
        f"interleaved rounds of {settings['steps']} batches, wall-clock seconds. Ratios per round against "
        f"{result['baseline']}: median [spread]."
    )
    table = [[r["task"], Spread(**r["ips"]).text(".0f"), Spread(**r["vs_base"]).text(".2f")] for r in result["rows"]]
    title = f"Loader vs training step: {result['dataset']}{opts} ({machine['date']})"
    markdown = markdown_page(title, intro, md_table(["task", "images/s", f"vs {result['baseline']}"], "lrr", table))
    return dict(machine=machine, settings=settings, **result), markdown


# ------------------------------------------------------------------------------------------------------- the command


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="visionpe-bench speed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = ap.add_argument
    add("--models", nargs="+", help="names or glob patterns (default: vit_s_ape vit_s_rope2d_mixed swin_t_rpb cvt_13)")
    add("--baseline", help="the model every ratio is against (default: the first listed)")
    add("--resolutions", nargs="+", type=positive_int,
        help=f"image sizes, at most {MAX_SIZE_PX} px (default 224; with --data: the dataset's own)")  # fmt: skip
    add("--frames", nargs="+", type=positive_int, help="clip lengths of video models")
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
    add("--batch", type=positive_int, help="batch size (default 4; 1 with --compile; 128 with --data)")
    add("--rounds", type=positive_int, default=3)
    add("--steps", type=positive_int, default=2)
    add("--clock", choices=CLOCKS, help="cpu: CPU seconds of one thread (default on CPU); wall: wall-clock")
    add("--threads", type=int, help="torch threads (default: 1 with --clock cpu)")
    add("--no-timm", dest="timm", action="store_false", help="do not measure timm's equivalents")
    add("--no-flops", dest="flops", action="store_false", help="skip FLOP counting (slow at large sizes)")
    add("--device", default="cpu", help="cpu, cuda or cuda:N (checked before anything is measured)")
    add("--out", help="output path without suffix (default results/speed/{speed,zoo,data}); .json and .md")
    return ap


def _checked_args(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed flags with their defaults filled in (defaults depend on --data and --compile); bad ones exit, or
    raise a one-line BenchConfigError / DestinationError (the device, the sizes, the output files)."""
    args = ap.parse_args(argv)
    check_device(args.device, "--device")
    check_sizes(args.resolutions or [], "--resolutions")
    args.train, args.infer = args.phase in (None, "train"), args.phase in (None, "infer")
    args.clock = args.clock or ("wall" if args.data or not args.device.startswith("cpu") else "cpu")
    args.batch = args.batch or (128 if args.data else 1 if args.compile else 4)
    if args.clock == "cpu" and not args.device.startswith("cpu"):
        ap.error(f"--clock cpu counts CPU work; use --clock wall on {args.device}")
    if args.resolutions is None and not args.data:
        args.resolutions = [224]
    bad = [item for item in args.data_options if not item.partition("=")[0].strip() or "=" not in item]
    if bad:
        ap.error(f"--data-options takes KEY=VALUE words, got {bad[0]!r}")
    try:
        default = ["vit_n_*"] if args.data else _COMPILE_MODELS if args.compile else _DEFAULT_MODELS
        args.models = expand_models(args.models or default)
        if args.baseline:
            expand_models([args.baseline])
    except ValueError as e:
        ap.error(str(e).splitlines()[0])
    return args


_RUNS = {  # kind of run -> (runner, default output path without suffix)
    "speed": (run_speed, "results/speed/speed"),
    "zoo": (run_speed, "results/speed/zoo"),
    "compile": (run_compile, "results/compile/compile"),
    "data": (run_data, "results/speed/data"),
}


def _out_of_memory(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text


def main(argv: list[str] | None = None) -> int:
    args = _checked_args(_parser(), argv)
    t0 = time.perf_counter()
    run, default_out = _RUNS["compile" if args.compile else "data" if args.data else "zoo" if args.zoo else "speed"]
    out = Path(args.out or default_out)
    check_files(out)  # before the measurement, which a bad --out would otherwise lose
    with torch_threads(args.threads or (1 if args.clock == "cpu" else None)):
        machine = machine_info(args.device)
        settings = {k: getattr(args, k) for k in ("batch", "rounds", "steps", "clock", "zoo", "mode")}
        try:
            data, markdown = run(args, machine, settings, t0)
        except (MemoryError, RuntimeError) as e:
            if not _out_of_memory(e):
                raise
            raise ValueError(
                f"out of memory on {args.device} at --resolutions {args.resolutions} (--batch {args.batch}); "
                f"choose smaller sizes or batch"
            ) from None
    print(markdown)  # first: a disk that fills up now loses the files, not the numbers
    json_path, md_path = write_results(out, data, markdown)
    print(f"wrote {json_path} and {md_path}")
    return 0
