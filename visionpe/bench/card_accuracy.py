"""The accuracy part of a model card: every benchmark summary (results/<name>/summary.json) with models of a family,
each protocol's points side by side (upsample, fov, clip lengths), runs that learned the task before chance-level
ones, and the papers' orderings judged on those numbers."""

from __future__ import annotations

import os
from pathlib import Path

from ..zoo import Family
from .claims import judge_claims, tally_text
from .evalsizes import Point, size_label
from .report import PROTOCOL_TEXT, base_check_lines, cell_text, point_heading

__all__ = ["family_models", "family_summaries", "summary_points", "chance_level", "at_chance", "family_claims",
           "accuracy_section", "relative_link"]  # fmt: skip


def relative_link(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()


def family_models(fam: Family, s: dict) -> list[str]:
    return [m for m in s["models"] if m.startswith(fam.name + "_") or m == fam.name]


def _point(row: dict) -> Point:
    """A summary row's evaluation point (summaries written before protocols existed hold upsample rows)."""
    return Point(row.get("protocol", "upsample"), row["height"], row["width"], row.get("frames", 0))


def _protocols(s: dict) -> list[str]:
    return s.get("protocols") or ["upsample"]


def _base_of(s: dict):
    base, frames = tuple(s["base"]), s.get("base_frames", 0)
    return lambda protocol: Point(protocol, *base, frames if protocol == "frames" else 0)


def summary_points(s: dict) -> list[Point]:
    """The table's columns: the training point once, then each protocol's other points (sizes as the summary orders
    them, clip lengths ascending)."""
    base_of, protocols = _base_of(s), _protocols(s)
    have = {_point(r) for r in s["table"]}
    order = {tuple(x): i for i, x in enumerate(s["sizes"])}
    cols = [base_of(protocols[0])]
    for pr in protocols:
        mine = [p for p in have if p.protocol == pr and p != base_of(pr)]
        cols += sorted(mine, key=lambda p: (p.frames, order.get(p.size, len(order)), p.size))
    return cols


def chance_level(s: dict) -> float | None:
    """Top-1 (%) of guessing on the summary's dataset; None when the number of classes is not known."""
    from ..data import get_dataset_info

    try:
        return 100.0 / get_dataset_info(s["dataset"]).num_classes
    except (KeyError, ValueError, TypeError, ZeroDivisionError):  # unknown set, or classes known only from a folder
        return None


def at_chance(s: dict) -> bool:
    """No model clearly above guessing at the training point (mean - 2 std within chance level)."""
    chance = chance_level(s)
    base = _base_of(s)(_protocols(s)[0])
    rows = [r for r in s["table"] if _point(r) == base]
    return chance is not None and bool(rows) and all(r["mean"] - 2 * r.get("std", 0.0) <= chance for r in rows)


def family_summaries(fam: Family, summaries: list[tuple[Path, dict]]) -> list[tuple[Path, dict, list[str]]]:
    """(path, summary, the family's models) of every summary with models of the family; above-chance runs first."""
    found = [(p, s, family_models(fam, s)) for p, s in summaries]
    return sorted((f for f in found if f[2]), key=lambda f: at_chance(f[1]))


def _judged(s: dict) -> list[dict]:
    """The summary's judged claims; judged here from its table for summaries written before claims existed."""
    if "claims" in s:
        return s["claims"]
    from .plan import split_name

    stats = {(r["model"], r["mode"], _point(r)): dict(mean=r["mean"], std=r["std"], n=r["n"]) for r in s["table"]}
    records = [dict(zip(("family", "size", "pe"), split_name(m)), model=m) for m in s["models"]]
    points = list(dict.fromkeys(_point(r) for r in s["table"]))
    return judge_claims(stats, records, points, list(s["modes"]), _base_of(s))


def family_claims(models: list[str], s: dict) -> list[dict]:
    """The claims with comparisons between the given models, restricted to those comparisons."""
    out = []
    for j in _judged(s):
        mine = [c for c in j["comparisons"] if c["better"] in models and c["worse"] in models]
        if mine:
            out.append(dict(j, comparisons=mine))
    return out


def _heading(s: dict) -> str:
    base = size_label(tuple(s["base"]))
    where = f"{s['base_frames']} frames of {base} px" if "frames" in _protocols(s) else f"{base} px"
    n = len(s["seeds"])
    seeds = f"{n} seeds" if n > 1 else "1 seed (single runs: no spread)"
    how = f"pretrained weights at {where}" if s.get("pretrained") else f"trained at {where}, {seeds}"
    return f"### {s['name']}: {how}" + (", at chance level" if at_chance(s) else "")


def _summary_block(fam: Family, path: Path, s: dict, models: list[str], out_dir: Path) -> list[str]:
    rel = relative_link(path.parent, out_dir)
    base_of, protocols = _base_of(s), _protocols(s)
    cols = summary_points(s)
    stats = {(r["model"], r["mode"], _point(r)): r for r in s["table"]}
    spread = (
        f"mean ± standard deviation over the seeds {s['seeds']}"
        if len(s["seeds"]) > 1
        else f"one run (seed {s['seeds'][0]}) per cell, so no spread is given"
    )
    has_plot = (path.parent / "results.png").exists()
    plot = f", ![top-1 against the evaluation point]({rel}/results.png)" if has_plot else ""
    lines = [
        _heading(s),
        "",
        f"Top-1 (%) on {s['dataset']} validation examples, {spread}; change against the training point (bold) in "
        f"brackets; the same weights everywhere, no fine-tuning. Protocols: "
        + "; ".join(PROTOCOL_TEXT[p] for p in protocols)
        + f". Full tables: [{rel}/results.md]({rel}/results.md){plot}",
        "",
    ]
    base, frames = tuple(s["base"]), s.get("base_frames", 0)
    for mode in s["modes"]:
        heads = [point_heading(c, c == base_of(c.protocol), base, frames, protocols) for c in cols]
        lines += [f"*{mode}* positions:", "", "| model | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(cols)]
        for m in models:
            cells = []
            for c in cols:
                ref = stats.get((m, mode, base_of(c.protocol)))
                cells.append(cell_text(stats.get((m, mode, c)), ref, c == base_of(c.protocol)))
            same = " (=)" if m in s.get("modes_agree", []) and mode != s["modes"][0] else ""
            lines.append(f"| {m}{same} | " + " | ".join(cells) + " |")
        lines.append("")
    checks = {m: c for m, c in (s.get("base_check") or {}).items() if m in models}
    lines += base_check_lines(checks, "the tables read fewer")
    chance = chance_level(s)
    lines += [
        f"Measured on {_machine(s)}, {s['date']}."
        + (" (=): both position modes give identical logits for this model." if len(s["modes"]) > 1 else "")
        + (f" Chance level: {chance:.1f}%." if chance is not None else "")
        + (
            " At the training point no model is clearly above chance: this schedule is too short for the task, "
            "and the table says nothing about the PEs."
            if at_chance(s)
            else ""
        ),
        "",
    ]
    claims = family_claims(models, s)
    if claims:
        lines += [
            "The papers' orderings on these numbers (an ordering *holds* at a point when the claimed-better PE leads "
            "by at least twice the standard error of the difference over seeds; with one seed nothing is judged and "
            f"only which PE is ahead is counted; per-point tables in [{rel}/results.md]({rel}/results.md)):",
            "",
            *(f"- **{j['claim']}** ({j['source']}): {tally_text(j)}." for j in claims),
            "",
        ]
    return lines


def _machine(s: dict) -> str:
    from .speed_report import machine_description

    return machine_description(s["machine"])


def accuracy_section(fam: Family, summaries: list[tuple[Path, dict]], out_dir: Path) -> list[str]:
    """'## Evaluation results': one block per benchmark with models of the family, runs above chance first."""
    lines = ["## Evaluation results", ""]
    found = family_summaries(fam, summaries)
    if not found:
        return lines + [
            "No accuracy benchmark of this family yet: `visionpe-bench extrapolate -c <benchmark>` with models of this "
            "family, then rerun `visionpe-bench cards`.",
            "",
        ]
    for path, s, models in found:
        lines += _summary_block(fam, path, s, models, out_dir)
    return lines
