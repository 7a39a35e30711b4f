"""`visionpe-bench speed --compile`: what torch.compile buys, measured in interleaved rounds.

For each of our models (and timm's equivalent where timm has one, loaded with the same weights): eager and
`torch.compile`d inference run in the same rounds, each round in a fresh random order (see timing.py). Reported per
round and summarised as median [spread]: the compiled/eager time ratio of each model, and compiled ours vs compiled
timm (time ratio, below 1 = ours faster). The first call of a compiled model (the compilation) is timed apart, in
wall-clock seconds. Outputs are checked too: compiled against eager, ours against timm's (same weights).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import timm
import torch
from torch import nn

from ..zoo import create_model, family_of
from .memprobe import example_input
from .timing import Clock, Spread, interleave, model_step, spread

__all__ = ["CompileRow", "measure_compiled", "format_compile_markdown", "write_compile_results", "run_compile"]


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
    from .speed import timm_equivalent  # speed imports this module for its --compile flag

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


def _s(d: dict | None) -> str:
    return "-" if not d else Spread(**d).text()


def format_compile_markdown(rows: list[CompileRow], machine: dict, settings: dict) -> str:
    from .speed_report import machine_description

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
        "| model | timm model | eager img/s | compiled img/s | compiled / eager | timm compiled / eager | "
        "ours / timm, eager | ours / timm, compiled | compile s (ours / timm) | max diff compiled-eager | "
        "max diff ours-timm |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ref_s = "-" if r.ref_compile_s is None else f"{r.ref_compile_s:.0f}"
        timm_diff = "-" if r.max_diff_timm is None else f"{r.max_diff_timm:.1e}"
        lines.append(
            f"| {r.model} | {r.reference or '-'} | {r.eager_ips:.2f} | {r.compiled_ips:.2f} | "
            f"{_s(r.compiled_vs_eager)} | {_s(r.ref_compiled_vs_eager)} | {_s(r.ours_vs_timm_eager)} | "
            f"{_s(r.ours_vs_timm_compiled)} | {r.compile_s:.0f} / {ref_s} | {r.max_diff_compiled:.1e} | {timm_diff} |"
        )
    notes = [f"- {r.model}: {n}" for r in rows for n in r.notes]
    return "\n".join(lines + (["", "Notes:", *notes] if notes else [])) + "\n"


def write_compile_results(rows: list[CompileRow], out: Path, machine: dict, settings: dict) -> tuple[Path, Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    data = dict(machine=machine, settings=settings, rows=[asdict(r) for r in rows])
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    md_path.write_text(format_compile_markdown(rows, machine, settings))
    return json_path, md_path


def run_compile(args, models: list[str], machine: dict, settings: dict, t0: float) -> tuple[Path, Path]:
    """`speed --compile`: measure at the first resolution and write results/compile/compile.{json,md} (not under
    results/speed, whose files the model cards read as speed rows)."""
    res = args.resolutions[0]
    rows = measure_compiled(models, res, args.batch, args.rounds, args.steps, args.clock, args.timm)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    settings.update(seconds=round(time.perf_counter() - t0, 1), resolution=res, load=load)
    return write_compile_results(rows, Path(args.out or "results/compile/compile"), machine, settings)
