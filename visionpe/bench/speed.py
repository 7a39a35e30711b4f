"""Speed, memory, parameters and FLOPs of models at a list of resolutions, against timm's equivalent models.

    python -m visionpe.bench speed --models vit_s_ape swin_t_rpb cvt_13 --resolutions 224 384
    python -m visionpe.bench speed --zoo          # what the model cards report (results/speed/zoo.json)

Per model and resolution: parameters, GFLOPs (fvcore MACs with attention counted, see flops.py), inference and
training images/s (all models of a resolution interleaved in one run, median of the rounds), peak memory of one step
(a fresh process per measurement on CPU). timm's equivalent model (same architecture, e.g. vit_s_ape and
vit_small_patch16_224) is measured in the same run, and every figure is also given as a ratio against it and against
the first model listed. With two or more resolutions, the growth of time and memory with the token count is fitted
as a power law (time ~ N^a). Results go to a JSON file and a Markdown table next to it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import timm
import torch
from torch import nn

import visionpe  # noqa: F401  (registers the models)

from ..zoo import FAMILIES, create_model, family_of, list_visionpe_models, model_name
from .flops import count_flops
from .timing import interleaved_throughput, peak_memory_mb

__all__ = ["TIMM_EQUIVALENTS", "timm_equivalent", "machine_info", "SpeedRow", "measure", "zoo_plan", "main"]

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
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


def machine_info(device: str = "cpu") -> dict:
    """What the figures were measured on (no host names)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    info = dict(
        cpu=cpu,
        cores=os.cpu_count(),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        timm=timm.__version__,
        device=device,
        date=time.strftime("%Y-%m-%d"),
    )
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


@dataclass
class SpeedRow:
    model: str
    resolution: int
    reference: str | None = None  # timm's equivalent measured in the same run, or None for a timm model itself
    tokens: int = 0
    params_m: float = 0.0
    gflops: float | None = None
    infer_ips: float | None = None  # images per second
    train_ips: float | None = None
    infer_mem_mb: float | None = None  # peak memory of one step beyond the weights
    train_mem_mb: float | None = None
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------------ models


class _Kwargs(nn.Module):
    """Positional tensors -> model(**kwargs), so fvcore can trace models that take dicts (multimodal)."""

    def __init__(self, model: nn.Module, keys: list[str]):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *args):
        return self.model(**dict(zip(self.keys, args)))


def _example(name: str, resolution: int, batch: int, in_chans: int = 3):
    if name in list_visionpe_models():
        fam = family_of(name)
        make = getattr(fam, "example_input", None)
        if make is not None:
            return make(resolution, batch)
    return torch.randn(batch, in_chans, resolution, resolution)


def _build(name: str, kwargs: dict, resolution: int, ours: bool) -> nn.Module:
    if ours:
        return create_model(name, **kwargs)
    return timm.create_model(name, img_size=resolution, **kwargs)  # timm's models fix their size at creation


def _tokens(model: nn.Module, resolution: int) -> int:
    """Patch tokens of the first stage at this resolution (prefix tokens left out)."""
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if patch is None:
        info = getattr(model, "feature_info", None) or [{"reduction": 4}]
        patch = info[0]["reduction"] if isinstance(info, list) else info.reduction(0)
    p = patch[0] if isinstance(patch, (tuple, list)) else int(patch)
    return math.ceil(resolution / p) ** 2


def _flops(model: nn.Module, x) -> float:
    if isinstance(x, dict):
        return count_flops(_Kwargs(model, list(x)), tuple(x.values())) / 1e9
    return count_flops(model, x[:1]) / 1e9


# ----------------------------------------------------------------------------------------------------- measure


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
) -> list[SpeedRow]:
    """One SpeedRow per (model, resolution), timm's equivalents included (their `reference` is None).
    clock='cpu' times CPU seconds of this process (use with one torch thread on a shared machine)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    tick = CLOCKS[clock]
    for name in models:
        if not timm.is_model(name):
            create_model(name)  # raises, naming the nearest model names
    rows: list[SpeedRow] = []
    for res in resolutions:
        built: dict[str, tuple[nn.Module, dict, bool]] = {}
        for name in models:
            pair = timm_equivalent(name) if with_timm else None
            kwargs = dict(pair[1]) if pair else {}
            built[name] = (_build(name, kwargs, res, True), kwargs, True)
            if pair and pair[0] not in built:
                try:
                    built[pair[0]] = (_build(pair[0], {}, res, False), {"img_size": res}, False)
                except Exception as e:  # a timm model that cannot take this size: measure ours alone
                    log(f"  {pair[0]} cannot be built at {res} px ({e}); measuring {name} alone")
        by_name = {}
        for name, (model, _, ours) in built.items():
            model.to(device)
            pair = timm_equivalent(name) if ours and with_timm else None
            ref = pair[0] if pair and pair[0] in built else None
            row = SpeedRow(name, res, ref, _tokens(model, res), sum(p.numel() for p in model.parameters()) / 1e6)
            if ours and built[name][1]:
                row.notes.append(f"built with {built[name][1]} to match {pair[0]}")
            x = _example(name, res, 1)
            if flops:
                try:
                    row.gflops = _flops(model, x)
                except Exception as e:  # a model fvcore cannot trace still gets its speed measured
                    row.notes.append(f"FLOPs not counted: {type(e).__name__}: {str(e)[:120]}")
            by_name[name] = row
            rows.append(row)
        groups: dict[str, dict[str, nn.Module]] = {}  # models that take the same input are interleaved together
        for n, (m, _, _) in built.items():
            groups.setdefault(_signature(_example(n, res, 1)), {})[n] = m
        for group in groups.values():
            first = next(iter(group))
            make = lambda f=first, r=res: _to(_example(f, r, batch), device)  # noqa: E731
            if train:  # training first: some PEs cache index tensors, which inference mode would make read-only
                log(f"  {res} px: timing training of {', '.join(group)}")
                for n, v in interleaved_throughput(group, make, True, rounds, steps, tick).items():
                    by_name[n].train_ips = v
            log(f"  {res} px: timing inference of {', '.join(group)}")
            for n, v in interleaved_throughput(group, make, False, rounds, steps, tick).items():
                by_name[n].infer_ips = v
        if memory:
            for name, (model, kwargs, _) in built.items():
                log(f"  {res} px: peak memory of {name}")
                by_name[name].infer_mem_mb = _peak(name, res, False, kwargs, device, model)
                if train:
                    by_name[name].train_mem_mb = _peak(name, res, True, kwargs, device, model)
        for model, _, _ in built.values():
            model.cpu()
        del built, groups
    return rows


def _signature(x) -> str:
    if isinstance(x, dict):
        return repr(sorted((k, tuple(v.shape)) for k, v in x.items()))
    return repr(tuple(x.shape))


def _to(x, device: str):
    return {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)


def _peak(name: str, res: int, train: bool, kwargs: dict, device: str, model: nn.Module) -> float | None:
    if device.startswith("cuda"):
        model.to(device).train(train)
        x = _to(_example(name, res, 1), device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        if train:
            out = model(**x) if isinstance(x, dict) else model(x)
            out.float().square().mean().backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.inference_mode():
                model(**x) if isinstance(x, dict) else model(x)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    try:
        return peak_memory_mb(name, res, 1, train, kwargs)
    except RuntimeError:
        return None


# -------------------------------------------------------------------------------------------------------- report


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def scaling(rows: list[SpeedRow]) -> dict[str, dict]:
    """Per model with two or more resolutions: exponents a, b of time per image ~ N^a and memory ~ N^b."""
    out = {}
    for name in dict.fromkeys(r.model for r in rows):
        rs = sorted((r for r in rows if r.model == name and r.infer_ips), key=lambda r: r.tokens)
        if len(rs) < 2 or rs[0].tokens == rs[-1].tokens:
            continue
        span = math.log(rs[-1].tokens / rs[0].tokens)
        entry = dict(tokens=[rs[0].tokens, rs[-1].tokens], time_exp=math.log(rs[0].infer_ips / rs[-1].infer_ips) / span)
        if rs[0].infer_mem_mb and rs[-1].infer_mem_mb:
            entry["memory_exp"] = math.log(rs[-1].infer_mem_mb / rs[0].infer_mem_mb) / span
        out[name] = entry
    return out


def _clock_text(settings: dict) -> str:
    if settings.get("clock") == "cpu":
        return "timed in CPU seconds of one thread (robust to other work on a shared machine)"
    return "timed in wall-clock seconds"


def format_markdown(rows: list[SpeedRow], machine: dict, settings: dict) -> str:
    first = rows[0].model if rows else None
    lines = [
        f"# Speed, memory and FLOPs ({machine['date']})",
        "",
        f"Measured on {machine_description(machine)}; batch {settings['batch']}, median of {settings['rounds']} "
        f"interleaved rounds of {settings['steps']} steps, {_clock_text(settings)}. Ratios are against timm's "
        f"equivalent model (same "
        f"architecture) measured in the same run, and against the first model listed ({first}). GFLOPs are "
        f"fvcore MACs per image with attention counted; memory is the peak of one step of one image beyond the "
        f"weights.",
        "",
        "| model | px | tokens | params (M) | GFLOPs | infer img/s | train img/s | infer MiB | train MiB | "
        "infer vs timm | train vs timm | infer vs first | train vs first |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r.model, r.resolution): r for r in rows}
    for r in rows:
        ref = by.get((r.reference, r.resolution)) if r.reference else None
        base = by.get((first, r.resolution))
        lines.append(
            f"| {r.model} | {r.resolution} | {r.tokens} | {r.params_m:.2f} | {_fmt(r.gflops, '.3f')} | "
            f"{_fmt(r.infer_ips)} | {_fmt(r.train_ips)} | {_fmt(r.infer_mem_mb, '.0f')} | "
            f"{_fmt(r.train_mem_mb, '.0f')} | {_ratio(r.infer_ips, ref and ref.infer_ips)} | "
            f"{_ratio(r.train_ips, ref and ref.train_ips)} | {_ratio(r.infer_ips, base and base.infer_ips)} | "
            f"{_ratio(r.train_ips, base and base.train_ips)} |"
        )
    grow = scaling(rows)
    if grow:
        lines += [
            "",
            "Growth with the number of tokens N (power-law fit between the smallest and largest size):",
            "",
            "| model | N | time per image ~ N^a | memory ~ N^b |",
            "|---|---|---:|---:|",
        ]
        for name, g in grow.items():
            mem = f"{g['memory_exp']:.2f}" if "memory_exp" in g else "-"
            lines.append(f"| {name} | {g['tokens'][0]} -> {g['tokens'][1]} | {g['time_exp']:.2f} | {mem} |")
    notes = [f"- {r.model} @ {r.resolution}: {n}" for r in rows for n in r.notes]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def machine_description(machine: dict) -> str:
    where = machine.get("gpu") or f"{machine['cpu']} ({machine['cores']} cores, {machine['threads']} torch threads)"
    return f"{where}, torch {machine['torch']}, timm {machine['timm']}"


def write_results(rows: list[SpeedRow], out: Path, machine: dict, settings: dict) -> tuple[Path, Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    data = dict(machine=machine, settings=settings, rows=[asdict(r) for r in rows], scaling=scaling(rows))
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    md_path.write_text(format_markdown(rows, machine, settings))
    return json_path, md_path


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
        rows += measure(
            models,
            [res],
            args.batch,
            args.rounds,
            args.steps,
            train=args.train,
            memory=args.memory,
            device=args.device,
            clock=args.clock,
        )
    timed = {r.model for r in rows}
    for name in zoo_sizes_plan():
        if name in timed:
            continue
        res = _default_resolution(name)
        print(f"{name}: parameters and FLOPs at {res} px")
        model = create_model(name)
        row = SpeedRow(name, res, None, _tokens(model, res), sum(p.numel() for p in model.parameters()) / 1e6)
        row.gflops = _flops(model, _example(name, res, 1))
        rows.append(row)
        del model
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="visionpe-bench speed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", default=["vit_s_ape", "vit_s_rope2d_mixed", "swin_t_rpb", "cvt_13"])
    ap.add_argument("--resolutions", nargs="+", type=int, default=[224])
    ap.add_argument(
        "--zoo",
        action="store_true",
        help="every PE of one size per family at its default resolution, "
        "plus parameters/FLOPs of every size (what the model cards report)",
    )
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default=None,
        help="cpu: CPU seconds of one thread, robust on a shared machine (default on CPU); wall: wall-clock seconds "
        "(default on GPU)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: 1 with --clock cpu)")
    ap.add_argument("--no-train", dest="train", action="store_false", help="skip training speed and memory")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="skip peak memory")
    ap.add_argument("--no-timm", dest="timm", action="store_false", help="do not measure timm's equivalents")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--out",
        default=None,
        help="output path without suffix (default results/speed/speed or "
        "results/speed/zoo with --zoo); .json and .md are written",
    )
    args = ap.parse_args(argv)
    args.clock = args.clock or ("wall" if args.device.startswith("cuda") else "cpu")
    if args.threads or args.clock == "cpu":
        torch.set_num_threads(args.threads or 1)
    if not args.resolutions or any(r <= 0 for r in args.resolutions):
        ap.error(f"--resolutions takes positive pixel sizes, got {args.resolutions}")
    if args.batch <= 0 or args.rounds <= 0 or args.steps <= 0:
        ap.error("--batch, --rounds and --steps must be positive")
    t0 = time.perf_counter()
    if args.zoo:
        rows = run_zoo(args)
    else:
        rows = measure(
            args.models,
            args.resolutions,
            args.batch,
            args.rounds,
            args.steps,
            train=args.train,
            memory=args.memory,
            with_timm=args.timm,
            device=args.device,
            clock=args.clock,
        )
    machine = machine_info(args.device)
    settings = dict(
        batch=args.batch,
        rounds=args.rounds,
        steps=args.steps,
        clock=args.clock,
        zoo=args.zoo,
        seconds=round(time.perf_counter() - t0, 1),
    )
    out = Path(args.out or ("results/speed/zoo" if args.zoo else "results/speed/speed"))
    json_path, md_path = write_results(rows, out, machine, settings)
    print(md_path.read_text())
    print(f"wrote {json_path} and {md_path}")
    return 0
