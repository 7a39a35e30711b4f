"""A segmentation benchmark's results.md and summary.json (visionpe-bench segment): mIoU and pixel accuracy per model,
mean ± std over seeds at each point and position mode, and each PE against NoPE (Welch's test, Holm's correction
across one PE's comparisons; docs/benchmark.md)."""

from __future__ import annotations

import json
from pathlib import Path

from ...engine.checkpoint import atomic_write_text
from ...zoo.registry import name_parts
from ..perf.measure import machine_description, machine_info
from ..protocols import Point, point_label, row_point
from ..report import CSV_KEYS, csv_rows, csv_text, fmt, md_table, stat_text
from ..stats import ALPHA, detectable_difference, holm, mean_std, welch

__all__ = ["summarise", "compare_to_nope", "write_seg_report"]

# results.csv: the classification columns with mIoU and pixel accuracy for top-1 / top-5 / loss
SEG_CSV_KEYS = (*CSV_KEYS[: CSV_KEYS.index("top1")], "miou", "pixel_acc", *CSV_KEYS[CSV_KEYS.index("images") :])


def _key(mode: str, point: Point) -> str:
    return f"{mode}|{point_label(point)}"


def summarise(records: list[dict], plan) -> dict:
    """{model: {'mode|point': {'miou': {mean, std, n, values}, 'pixel_acc': {...}}}} over the models' seeds."""
    out: dict = {}
    for model in plan.bench.models:
        mine = [r for r in records if r["model"] == model]
        cells: dict = {}
        for mode in plan.bench.position_modes:
            for point in plan.points:
                rows = [row for r in mine for row in r["rows"] if row["mode"] == mode and row_point(row) == point]
                if rows:
                    cells[_key(mode, point)] = {
                        k: dict(mean_std([row[k] for row in rows]), values=[row[k] for row in rows])
                        for k in ("miou", "pixel_acc")
                    }
        out[model] = cells
    return out


def compare_to_nope(stats: dict, plan, baseline: str) -> list[dict]:
    """Each PE against `baseline` at every point and mode (mIoU): Welch's test of 'PE > NoPE' and of the reverse,
    Holm-adjusted across one PE's comparisons; a comparison of the same values as an earlier one (modes that agree,
    the training point under both protocols) is a repeat, counted once. Verdict: holds / does not hold / within
    noise."""
    out = []
    for model in [m for m in plan.bench.models if m != baseline]:
        claim, seen, family = f"{model} > {baseline}", {}, []
        for mode in plan.bench.position_modes:
            for point in plan.points:
                a, b = (stats[m].get(_key(mode, point), {}).get("miou") for m in (model, baseline))
                if not a or not b or a["n"] < 2 or b["n"] < 2:
                    continue
                c = dict(claim=claim, protocol=point.protocol, point=point_label(point), mode=mode, a=model,
                         b=baseline, a_values=a["values"], b_values=b["values"])  # fmt: skip
                key = (tuple(a["values"]), tuple(b["values"]))
                if key in seen:
                    c["repeat_of"] = seen[key]
                else:
                    seen[key] = f"{mode} {point_label(point)}"
                    test, reverse = welch(a["values"], b["values"]), welch(b["values"], a["values"])
                    c.update(diff=test["diff"], ci95=test["ci95"], p=test["p"], p_reverse=reverse["p"])
                    family.append(c)
                out.append(c)
        for field in ("p", "p_reverse"):
            for c, adjusted in zip(family, holm([c[field] for c in family])):
                c[f"{field}_holm"] = adjusted
        for c in family:
            c["verdict"] = ("holds" if c["p_holm"] < ALPHA else "does not hold" if c["p_reverse_holm"] < ALPHA
                            else "within noise")  # fmt: skip
        for c in out:
            if "repeat_of" in c and c["a"] == model:
                first = next(f for f in family if f"{f['mode']} {f['point']}" == c["repeat_of"])
                c.update({k: first[k] for k in ("diff", "ci95", "p", "p_holm", "verdict")})
    return out


def _tables(stats: dict, plan, metric: str, modes: list[str]) -> list[str]:
    lines = []
    for protocol in dict.fromkeys(p.protocol for p in plan.points):
        points = [p for p in plan.points if p.protocol == protocol]
        for mode in modes:
            heads = ["model", *(point_label(p) for p in points)]
            rows = [[m, *(stat_text(stats[m][_key(mode, p)][metric]) if _key(mode, p) in stats[m] else "-"
                          for p in points)] for m in plan.bench.models]  # fmt: skip
            lines += [f"### {protocol}, {mode} mode", "", *md_table(heads, "l" + "r" * len(points), rows), ""]
    return lines


def _markdown(summary: dict, stats: dict, comparisons: list[dict], plan) -> str:
    cfg, b = plan.cfg, plan.bench
    base = "x".join(map(str, plan.base))
    lines = [
        f"# {b.name}: segmentation beyond the training canvas",
        "",
        f"Dataset {cfg.data.name} (options {cfg.data.options or 'default'}), base canvas {base} px; "
        f"{len(b.models)} models x seeds {b.seeds}, {cfg.train.epochs} epochs, a linear head on the last block's "
        f"patch tokens upsampled to pixels, trained end to end (model options: "
        f"{', '.join(f'{k}={v}' for k, v in cfg.model.kwargs.items()) or 'defaults'}).",
        "upsample: the same scenes at more pixels; fov: a larger canvas with more objects at the training scale. "
        "mIoU (%) over the background and the classes present; mean ± std over seeds.",
        "",
        "## mIoU",
        "",
        *_tables(stats, plan, "miou", list(b.position_modes)),
        "## Pixel accuracy",
        "",
        *_tables(stats, plan, "pixel_acc", list(b.position_modes[:1])),
    ]
    judged = [c for c in comparisons if "repeat_of" not in c]
    if judged:
        heads = ["claim", "protocol", "mode", "point", "diff", "95% CI", "p", "p (Holm)", "verdict"]
        rows = [[c["claim"], c["protocol"], c["mode"], c["point"], fmt(c["diff"], "+.1f"),
                 f"[{c['ci95'][0]:+.1f}, {c['ci95'][1]:+.1f}]", fmt(c["p"], ".3f"), fmt(c["p_holm"], ".3f"),
                 c["verdict"]] for c in judged]  # fmt: skip
        tally = {v: sum(c["verdict"] == v for c in judged) for v in ("holds", "does not hold", "within noise")}
        lines += [
            "## Each PE against NoPE (mIoU)",
            "",
            f"Welch's one-sided test per comparison, Holm's correction across one PE's comparisons (level {ALPHA}); "
            f"repeats of the same values counted once. {tally['holds']} hold, {tally['does not hold']} do not "
            f"hold, {tally['within noise']} within noise. Smallest difference {len(b.seeds)} seeds detect at the "
            f"training point: {fmt(summary.get('detectable'), '.1f')} points.",
            "",
            *md_table(heads, "llllrrrrl", rows),
            "",
        ]
    train = summary["train_cpu_seconds"]
    lines += ["## Cost", "", *md_table(["model", "training CPU s (mean)", "params"], "lrr",
              [[m, fmt(train.get(m), ".0f"), summary["params"].get(m, "-")] for m in b.models]), "",
              f"Machine: {machine_description(summary['machine'])}; this invocation took {summary['seconds']:.0f} s.",
              ""]  # fmt: skip
    return "\n".join(lines)


def write_seg_report(records: list[dict], plan, out: Path, seconds: float) -> list[Path]:
    """results.csv, results.md and summary.json under `out` from the records there (the CSV is what the
    leaderboard ranks)."""
    stats = summarise(records, plan)
    nope = next((m for m in plan.bench.models if name_parts(m)[2] == "nope"), None)
    comparisons = compare_to_nope(stats, plan, nope) if nope else []
    base = _key(plan.bench.position_modes[0], plan.points[0])
    spread = [stats[m][base]["miou"]["std"] for m in plan.bench.models if base in stats[m]]
    summary = dict(
        benchmark=plan.bench.name, task="segmentation", dataset=plan.cfg.data.name, metric="miou",
        models=list(plan.bench.models), seeds=list(plan.bench.seeds), base=list(plan.base),
        modes=list(plan.bench.position_modes), points=[point_label(p) for p in plan.points],
        classes=next((r["classes"] for r in records if r.get("classes")), None), stats=stats, comparisons=comparisons,
        detectable=detectable_difference(max(spread), len(plan.bench.seeds)) if spread else None,
        train_cpu_seconds={m: _mean([r.get("train_cpu_seconds") for r in records if r["model"] == m])
                           for m in plan.bench.models},
        params={m: next((r["params"] for r in records if r["model"] == m and "params" in r), None)
                for m in plan.bench.models},
        seconds=seconds, machine=machine_info(plan.bench.device),
    )  # fmt: skip
    paths = [out / "summary.json", out / "results.md", out / "results.csv"]
    atomic_write_text(paths[0], json.dumps(summary, indent=1, default=str) + "\n")
    atomic_write_text(paths[1], _markdown(summary, stats, comparisons, plan))
    atomic_write_text(paths[2], csv_text(csv_rows(records, SEG_CSV_KEYS), SEG_CSV_KEYS))
    return paths


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
