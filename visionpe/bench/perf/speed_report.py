"""The speed benchmark's table (results/speed/*.md): a measured row (`SpeedRow`), the texts of its ratios and
spreads (the model cards reuse them), the growth of time and memory with the token count (`scaling`), and the page
every speed run writes (`markdown_page`, `timed_text`). The measurement and the command: speed.py."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ..report import fmt, md_table
from .measure import CLOCKS, Clock, Spread, machine_description, spread_word


@dataclass
class SpeedRow:
    """One model measured at one resolution (and clip length): a row of the speed table and of speed.json."""

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


def spread_text(d: dict | None) -> str:
    return "-" if not d else Spread(**d).text()


def ratio_text(r: SpeedRow, base: SpeedRow | None, key: str) -> str:
    """r's `key` over the baseline's, or '-' where either is missing."""
    a, b = getattr(r, key), base and getattr(base, key)
    return f"{a / b:.2f}" if a and b else "-"


def memory_ratio_text(r: SpeedRow, base: SpeedRow | None) -> str:
    return f"{ratio_text(r, base, 'infer_mem_mb')} / {ratio_text(r, base, 'train_mem_mb')}"


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


def markdown_page(title: str, intro: str, *blocks: list[str]) -> str:
    """A Markdown page: the title, its paragraph, then the non-empty blocks with a blank line between them."""
    lines = [f"# {title}", "", intro]
    for block in filter(None, blocks):
        lines += ["", *block]
    return "\n".join(lines) + "\n"


def timed_text(machine: dict, settings: dict, what: str) -> str:
    """The intros' first words: the machine, what was run (`what`, formatted with the settings), rounds and clock."""
    clock = Clock(settings["clock"]).describe() if settings.get("clock") in CLOCKS else "wall-clock seconds"
    rounds = f"{settings['rounds']} interleaved rounds of {settings['steps']} steps"
    return f"Measured on {machine_description(machine)}; {what.format(**settings)}, {rounds}, timed in {clock}"


def format_markdown(rows: list[SpeedRow], machine: dict, settings: dict) -> str:
    intro = (
        f"{timed_text(machine, settings, 'batch {batch}')}. Images/s (clips/s for video) are medians over the "
        f"rounds; ratios are taken per round against the baseline and against timm's equivalent "
        f"model (same architecture) measured in the same rounds, given as median [{spread_word(settings['rounds'])}]. "
        f"GFLOPs are fvcore MACs per item with attention counted; memory is the peak of one step of one item beyond "
        f"the weights (infer / train)."
    )
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
    saved = [f"- {r.model} @ {r.frames} x {r.resolution}: {r.saved_act_mb:.0f}" for r in rows if r.saved_act_mb]
    grow = [[name, f"{g['tokens'][0]} -> {g['tokens'][1]}",
             *(f"{g[k]:.2f}" if k in g else "-" for k in ("time_exp", "memory_exp", "activation_exp"))]
            for name, g in scaling(rows).items()]  # fmt: skip
    grow_heads = ["model", "N", "time per item ~ N^a", "memory ~ N^b", "saved activations ~ N^c"]
    growth = "Growth with the number of tokens N (least-squares power-law fit over the sizes measured):"
    notes = [f"- {r.model} @ {r.resolution}: {n}" for r in rows for n in r.notes]
    return markdown_page(
        f"Speed, memory and FLOPs ({machine['date']})",
        intro,
        md_table(heads, "lrrrrrrrrrlrrrrr", table),
        saved and ["Activations autograd saves for backward (one clip, MiB):", "", *saved],
        grow and [growth, "", *md_table(grow_heads, "llrrr", grow)],
        notes and ["Notes:", *notes],
    )
