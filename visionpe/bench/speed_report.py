"""The speed command's report: ratio and spread texts, the power-law growth fit, and the JSON + Markdown files
(`visionpe-bench speed` measures, this module writes what it measured)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from .timing import CLOCKS, Clock, Spread

if TYPE_CHECKING:
    from .speed import SpeedRow

__all__ = [
    "spread_text",
    "memory_ratio_text",
    "growth_exponent",
    "scaling",
    "format_markdown",
    "machine_description",
    "write_results",
]


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


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
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


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
        "| model | px | frames | tokens | params (M) | GFLOPs | infer img/s | train img/s | infer MiB | train MiB | "
        "baseline | infer vs base | train vs base | memory vs base | infer vs timm | train vs timm |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    by = {(r.model, r.resolution, r.frames): r for r in rows}
    for r in rows:
        base = by.get((r.baseline, r.resolution, r.frames)) if r.baseline else None
        lines.append(
            f"| {r.model} | {r.resolution} | {r.frames or '-'} | {r.tokens} | {r.params_m:.2f} | "
            f"{_fmt(r.gflops, '.3f')} | {_fmt(r.infer_ips)} | {_fmt(r.train_ips)} | {_fmt(r.infer_mem_mb, '.0f')} | "
            f"{_fmt(r.train_mem_mb, '.0f')} | {r.baseline or '-'} | {spread_text(r.infer_vs_base)} | "
            f"{spread_text(r.train_vs_base)} | {memory_ratio_text(r, base)} | {spread_text(r.infer_vs_timm)} | "
            f"{spread_text(r.train_vs_timm)} |"
        )
    if any(r.saved_act_mb for r in rows):
        lines += ["", "Activations autograd saves for backward (one clip, MiB):", ""]
        lines += [f"- {r.model} @ {r.frames} x {r.resolution}: {r.saved_act_mb:.0f}" for r in rows if r.saved_act_mb]
    grow = scaling(rows)
    if grow:
        lines += [
            "",
            "Growth with the number of tokens N (least-squares power-law fit over the sizes measured):",
            "",
            "| model | N | time per item ~ N^a | memory ~ N^b | saved activations ~ N^c |",
            "|---|---|---:|---:|---:|",
        ]
        for name, g in grow.items():
            cols = [f"{g[k]:.2f}" if k in g else "-" for k in ("time_exp", "memory_exp", "activation_exp")]
            lines.append(f"| {name} | {g['tokens'][0]} -> {g['tokens'][1]} | {' | '.join(cols)} |")
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
