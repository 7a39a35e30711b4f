"""An extrapolation benchmark's results.csv, results.md, summary.json and results.png, and the papers' claims
judged on them (the claims are data in visionpe/papers.py; docs/benchmark.md)."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import time
from pathlib import Path

from ..data.registry import augmentation_text
from ..engine.checkpoint import atomic_write_text
from ..papers import CLAIMS
from ..zoo import FAMILIES, family_of
from .measure import machine_description, machine_info
from .protocols import Point, point_label, row_point, size_label

# what each evaluation protocol shows, in words (the tables' legend)
PROTOCOL_TEXT = {
    "upsample": "*upsample* (`up N`): the image at N px, its content scaled with it",
    "fov": "*fov* (`fov N`): an N px canvas with the content at its training scale, placed at random (the same "
    "canvases for every model), so only the field of view and the positions change",
    "frames": "*frames* (`N f`): clips of N frames at the training frame size",
    "native": "*native* (`N tok`): each image resized to N patches keeping its own aspect ratio, alone in a padded "
    "row; `W:H N tok`: every image on a canvas of aspect ratio W:H (width to height) at N patches, the content at "
    "the scale of the budget",
}

CSV_KEYS = ("model", "family", "size", "pe", "seed", "protocol", "mode", "height", "width", "frames", "tokens", "top1",
            "top5", "loss", "images", "same_as", "train_seconds")  # fmt: skip


def long_rows(records: list[dict]) -> list[dict]:
    """One flat row per (run, mode, evaluated size)."""
    out = []
    for rec in records:
        for r in rec.get("rows", []):
            out.append(
                {
                    **{k: rec.get(k) for k in ("model", "family", "size", "pe", "seed", "train_seconds")},
                    **{k: r.get(k) for k in ("protocol", "mode", "height", "width", "frames", "top1", "top5", "loss")},
                    **{k: r.get(k) for k in ("images", "same_as")},
                    "tokens": r.get("tokens", 0),
                }
            )
    return out


def ordered_sizes(sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Square sizes ascending, then the others by area."""
    square = sorted(s for s in sizes if s[0] == s[1])
    return square + sorted((s for s in sizes if s[0] != s[1]), key=lambda s: (s[0] * s[1], s))


def aggregate(rows: list[dict]) -> dict[tuple[str, str, Point], dict]:
    """(model, mode, point) -> {'mean', 'std', 'n'} of top-1 over seeds (sample std; 0 for one seed)."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["mode"], row_point(r)), []).append(r["top1"])
    return {k: mean_std(v) for k, v in groups.items()}


def mean_std(values: list[float]) -> dict:
    """{'mean', 'std', 'n'} over seeds (sample std; 0 for one value)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return dict(mean=statistics.fmean(values), std=sd, n=len(values))


def cell_text(stat: dict | None, base: dict | None, is_base: bool) -> str:
    """A table cell: mean ± std over seeds (the mean alone for one seed), bold at the training point, else with the
    change against it in brackets."""
    if stat is None:
        return "-"
    if is_base or base is None:
        return f"**{stat_text(stat)}**"
    return f"{stat_text(stat)} ({stat['mean'] - base['mean']:+.1f})"


def columns(plan) -> list[Point]:
    """Table columns: the training point once, then every other point of each protocol (at the training point the
    image protocols show the same inputs; the native protocol's own training budget gets a column of its own)."""
    first = [plan.base_point(plan.bench.protocols[0])]
    if "native" in plan.bench.protocols and first[0].protocol != "native":
        first.append(plan.base_point("native"))
    bases = {plan.base_point(p) for p in plan.bench.protocols}
    return first + [p for p in plan.points if p not in bases]


def point_heading(point: Point | None, base: tuple[int, int], base_frames: int, protocols: list[str]) -> str:
    """A column heading: 'base (32)' ('base (8 f, 32)' with clip lengths) for the training point (None), else the
    point ('up 48' when protocols sit side by side)."""
    if point is None:
        return f"base ({f'{base_frames} f, ' if 'frames' in protocols else ''}{size_label(base)})"
    return ("up " if point.protocol == "upsample" and len(protocols) > 1 else "") + point_label(point)


def _headings(plan, cols: list[Point]) -> list[str]:
    args = plan.base, plan.base_frames, plan.bench.protocols
    heads = []
    for c in cols:
        if c == plan.base_point(c.protocol):
            heads.append(f"base ({point_label(c)})" if c.protocol == "native" else point_heading(None, *args))
        else:
            heads.append(point_heading(c, *args))
    return heads


def native_text(cfg) -> str:
    """How a data.native recipe batches its images, for the tables' first sentence ('' without data.native)."""
    n = cfg.data.native
    if not n:
        return ""
    budget = f"seq_lens {n['seq_lens']}" if n.get("seq_lens") else f"{n.get('max_tokens', 64)} tokens per image"
    aspect = cfg.data.options.get("max_aspect")
    shapes = f" (canvases of 1:{aspect:g} to {aspect:g}:1)" if isinstance(aspect, (int, float)) else ""
    return f", at native aspect ratios{shapes}, {budget}, {n.get('mode', 'packed')} rows"


def stat_text(st: dict) -> str:
    return f"{st['mean']:.1f} ± {st['std']:.1f}" if st["n"] > 1 else f"{st['mean']:.1f}"


def base_checks(records: list[dict], models: list[str]) -> dict[str, dict]:
    """model -> {'mean', 'std', 'n', 'images'} of top-1 at the training point on bench.base_samples items."""
    out = {}
    for m in models:
        checks = [r["base_check"] for r in records if r["model"] == m and r.get("base_check")]
        if checks:
            out[m] = dict(mean_std([c["top1"] for c in checks]), images=max(c["images"] for c in checks))
    return out


def base_check_lines(checks: dict[str, dict], tables: str) -> list[str]:
    """The sentence ranking base_checks() best first; `tables` says what the tables read instead."""
    if not checks:
        return []
    ranked = sorted(checks.items(), key=lambda kv: -kv[1]["mean"])
    images = "/".join(str(i) for i in sorted({c["images"] for c in checks.values()}))
    ranking = ", ".join(f"{m} {stat_text(c)}" for m, c in ranked)
    return [f"The training point on {images} validation items ({tables}, with a larger sampling error): {ranking}.", ""]


def _quality_lines(stats: dict, models: list[str], plan) -> list[str]:
    """Base accuracy and seed spread at the training point: whether the benchmark can rank anything."""
    base = plan.base_point(plan.bench.protocols[0])
    mode = plan.bench.position_modes[0]
    at_base = [(m, stats[(m, mode, base)]) for m in models if (m, mode, base) in stats]
    if not at_base:
        return []
    lo = min(at_base, key=lambda x: x[1]["mean"])
    hi = max(at_base, key=lambda x: x[1]["mean"])
    spread = max(at_base, key=lambda x: x[1]["std"])
    seeds = sorted({st["n"] for _, st in at_base})
    heading = _headings(plan, [base])[0]
    return [
        "## Statistics",
        "",
        f"At the training point ({heading}): top-1 from {lo[1]['mean']:.1f} ({lo[0]}) to "
        f"{hi[1]['mean']:.1f} ({hi[0]}); the largest seed standard deviation is {spread[1]['std']:.2f} points "
        f"({spread[0]}); {'/'.join(map(str, seeds))} seed(s) per cell. An ordering *holds* when the mean difference "
        f"is at least twice its standard error sqrt(s_a²/n_a + s_b²/n_b), *does not hold* when it is at least twice "
        f"that the other way, and is *within noise* otherwise.",
        "",
    ]


def fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def md_table(heads: list[str], align: str, rows) -> list[str]:
    """The one Markdown table writer: `heads`, `align` one letter per column ('l' or 'r'), rows of cells."""
    rule = "".join("---:|" if a == "r" else "---|" for a in align)
    return [f"| {' | '.join(heads)} |", f"|{rule}", *(f"| {' | '.join(map(str, r))} |" for r in rows)]


def accuracy_table(models, mode, cols, heads, stats, base_of, agree, first_mode, pe_of=None) -> list[str]:
    """Top-1 per model (rows) and evaluation point (columns) in one position mode: the tables of results.md and of
    the model cards. `stats`: (model, mode, point) -> {'mean', 'std', 'n'}; base_of(protocol): the training point;
    `agree`: models whose two modes give the same logits (marked (=) after the first mode); `pe_of`: a PE column."""
    rows = []
    for m in models:
        cells = [cell_text(stats.get((m, mode, c)), stats.get((m, mode, base_of(c.protocol))), c == base_of(c.protocol))
                 for c in cols]  # fmt: skip
        name = f"{m} (=)" if m in agree and mode != first_mode else m
        rows.append([name, *([pe_of.get(m, "")] if pe_of is not None else []), *cells])
    heads = ["model", *(["PE"] if pe_of is not None else []), *heads]
    return [*md_table(heads, "l" * (len(heads) - len(cols)) + "r" * len(cols), rows), ""]


def _claim_lines(judged: list[dict]) -> list[str]:
    lines = ["## The papers' claims on this benchmark", ""]
    for j in judged:
        lines.append(f"- **{j['claim']}** ({j['source']}; where: {j['where']}): {tally_text(j)}.")
    lines.append("")
    for j in judged:
        if not j["comparisons"]:
            continue
        rows = [
            [c["better"], c["worse"], c["protocol"], point_label(Point(c["protocol"], c["height"], c["width"],
             c["frames"], c.get("tokens", 0))), c["mode"], stat_text(c["a"]), stat_text(c["b"]), f"{c['diff']:+.1f}",
             f"{2 * c['se']:.1f}", c["verdict"]]
            for c in j["comparisons"]
        ]  # fmt: skip
        heads = ["better?", "than", "protocol", "point", "mode", "top-1 a", "top-1 b", "a - b", "2 x s.e.", "verdict"]
        lines += [f"### {j['claim']}", "", *md_table(heads, "lllllrrrrl", rows), ""]
    return lines


def _judged(records: list[dict], plan) -> list[dict]:
    stats = aggregate(long_rows(records))
    return judge_claims(stats, records, plan.points, list(plan.bench.position_modes), plan.base_point)


def format_markdown(records: list[dict], plan, seconds: float, machine: str) -> str:
    b, cfg = plan.bench, plan.cfg
    rows = long_rows(records)
    stats = aggregate(rows)
    cols = columns(plan)
    models = [m for m in b.models if any(r["model"] == m for r in rows)]
    pe_of = {rec["model"]: rec.get("pe", rec["model"]) for rec in records}
    agree = {rec["model"] for rec in records if rec.get("modes_agree")}
    images = sorted({r["images"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    opts = ", ".join(f"{k}={v}" for k, v in cfg.data.options.items()) or "none"
    model_opts = ", ".join(f"{k}={v}" for k, v in cfg.model.kwargs.items())  # what every model was built with
    model_opts = f"; model options: {model_opts}" if model_opts else ""
    if b.pretrained:
        how = "Pretrained weights (no training) "
    else:
        how = (
            f"Trained on `{cfg.data.name}` at {cfg.data.resolution} px{native_text(cfg)} ({cfg.train.epochs} epochs, "
            f"batch {cfg.data.batch_size}, {cfg.optim.opt} lr {cfg.optim.lr:g}, data options: {opts}"
            f"{model_opts}; augmentation: {augmentation_text(cfg.data.name, cfg.data.options, vars(cfg.aug))}), "
            "then "
        )
    lines = [
        f"# Extrapolation: {b.name}",
        "",
        f"{how}evaluated without fine-tuning on {'/'.join(str(i) for i in images)} `{cfg.data.val_split}` items at "
        f"each point. Top-1 accuracy (%), mean ± standard deviation over {len(seeds)} seed(s) {seeds}; in brackets, "
        f"the change against the training point (bold). Non-square sizes are H x W.",
        "",
        "Protocols: " + "; ".join(PROTOCOL_TEXT[p] for p in b.protocols) + ".",
        "",
        "Position modes: *extrapolate* keeps raw patch indices at the new size; *interpolate* rescales positions to "
        "the training grid (the counterpart of resampling an APE table). A learned APE is resampled to the new grid "
        "in both modes. Models without test-time position modes (the video backbones) run as they are.",
        "",
    ]
    heads = _headings(plan, cols)
    for mode in b.position_modes:
        lines += [f"## {mode}", ""]
        lines += accuracy_table(models, mode, cols, heads, stats, plan.base_point, agree, b.position_modes[0], pe_of)
    if agree and len(b.position_modes) > 1:
        lines += [
            "(=): the two position modes give this model identical logits (its PE reads no coordinates, or "
            "resamples its table either way), so one evaluation serves both.",
            "",
        ]
    lines += [f"Note: {n}." for n in plan.notes] + ([""] if plan.notes else [])
    lines += _quality_lines(stats, models, plan)
    lines += base_check_lines(
        base_checks(records, models), f"bench.base_samples; the tables read {'/'.join(map(str, images))}"
    )
    lines += _claim_lines(_judged(records, plan))
    cpu = [r["train_cpu_seconds"] for r in records if r.get("train_cpu_seconds")] or [0]
    ev = [r["eval_cpu_seconds"] for r in records if r.get("eval_cpu_seconds")] or [0]
    lines += [
        f"{len(records)} runs; this invocation took {seconds / 60:.1f} min on {machine}, "
        f"{b.processes} process(es) x {b.threads} thread(s); CPU time per run: training {statistics.fmean(cpu):.0f} s, "
        f"evaluation {statistics.fmean(ev):.0f} s on average over the runs this benchmark trained/evaluated "
        f"({len(cpu)}/{len(ev)} of {len(records)}). {_total_time_text(records, b.processes)} Regenerate: "
        f"`python -m visionpe.bench extrapolate -c <the benchmark file>` (finished runs are reused).",
        "",
    ]
    return "\n".join(lines)


def _total_time_text(records: list[dict], processes: int) -> str:
    """The whole benchmark's cost from every run's recorded CPU time, whichever invocation trained it: the figure that
    stays meaningful when runs were resumed or the machine was shared."""
    timed = [r for r in records if r.get("train_cpu_seconds") is not None and r.get("eval_cpu_seconds") is not None]
    if not timed:
        return ""
    total = sum(r["train_cpu_seconds"] + r["eval_cpu_seconds"] for r in timed)
    lanes = max(1, processes)
    text = (
        f"All {len(timed)} timed runs together: {total / 60:.0f} CPU-minutes (training and evaluation), about "
        f"{total / 60 / lanes:.0f} minutes on {lanes} free core(s) at one thread per process."
    )
    if len(timed) < len(records):
        whole = total / len(timed) * len(records)
        text += (
            f" The other {len(records) - len(timed)} have no complete count (trained outside this benchmark, or "
            f"resumed from a checkpoint that kept no cost); at the timed runs' mean, all {len(records)} take about "
            f"{whole / 60:.0f} CPU-minutes, {whole / 60 / lanes:.0f} minutes on {lanes} free core(s)."
        )
    return text


def restrict(records: list[dict], plan) -> list[dict]:
    """The records' rows for the plan's modes and points only (a record keeps rows of points since dropped)."""
    points, modes = set(plan.points), set(plan.bench.position_modes)
    return [
        dict(r, rows=[x for x in r.get("rows", []) if x["mode"] in modes and row_point(x) in points]) for r in records
    ]


def _summary(records: list[dict], plan, seconds: float, machine: dict) -> dict:
    stats = aggregate(long_rows(records))
    table = []
    for (model, mode, point), st in sorted(stats.items()):
        base = stats.get((model, mode, plan.base_point(point.protocol)))
        pe = next((r.get("pe") for r in records if r["model"] == model), model)
        delta = st["mean"] - base["mean"] if base else None
        table.append(dict(model=model, pe=pe, mode=mode, **point._asdict(), **st, delta=delta))
    cfg = plan.cfg
    return dict(
        name=plan.bench.name,
        dataset=cfg.data.name,
        base=list(plan.base),
        sizes=[list(s) for s in ordered_sizes(plan.sizes)],
        modes=list(plan.bench.position_modes),
        protocols=list(plan.bench.protocols),
        base_frames=plan.base_frames,
        base_tokens=plan.base_tokens,
        pretrained=plan.bench.pretrained,
        seeds=sorted({r["seed"] for r in records}),
        models=[m for m in plan.bench.models if any(r["model"] == m for r in records)],
        recipe=dict(
            epochs=cfg.train.epochs,
            batch_size=cfg.data.batch_size,
            opt=cfg.optim.opt,
            lr=cfg.optim.lr,
            data_options=cfg.data.options,
            scale=cfg.aug.scale,
            hflip=cfg.aug.hflip,
        ),
        modes_agree=sorted(r["model"] for r in records if r.get("modes_agree")),
        machine=machine,
        seconds=round(seconds, 1),
        cpu_seconds=dict(
            train=round(sum(r.get("train_cpu_seconds") or 0 for r in records), 1),
            eval=round(sum(r.get("eval_cpu_seconds") or 0 for r in records), 1),
        ),
        date=time.strftime("%Y-%m-%d"),
        table=table,
        base_check=base_checks(records, plan.bench.models),
        claims=_judged(records, plan),
    )


def write_report(records: list[dict], plan, out: Path, seconds: float, machine: dict | None = None) -> list[Path]:
    """results.csv, results.md, summary.json and results.png under `out`; returns the paths written. Nothing is
    written (and [] returned) when the records hold no row of the plan's points and modes: tables already there are
    never replaced by empty ones. `machine`: what the runs were measured on (default: this machine)."""
    records = restrict(records, plan)
    rows = long_rows(records)
    if not rows:
        return []
    out.mkdir(parents=True, exist_ok=True)
    machine = machine or dict(machine_info(), threads=plan.bench.threads)
    table = io.StringIO()
    w = csv.DictWriter(table, fieldnames=CSV_KEYS, extrasaction="ignore", lineterminator="\r\n")
    w.writeheader()
    w.writerows(rows)
    summary = _summary(records, plan, seconds, machine)
    paths = [out / "results.csv", out / "results.md", out / "summary.json"]
    texts = [table.getvalue(), format_markdown(records, plan, seconds, machine_description(machine))]
    for path, text in zip(paths, [*texts, json.dumps(summary, indent=1) + "\n"]):
        atomic_write_text(path, text)
    png = plot_extrapolation(summary, out / "results.png")
    return paths + ([png] if png is not None else [])


# -------------------------------------------------------------------------------------------------- the papers' claims

VERDICTS = ("holds", "does not hold", "within noise", "one seed")


def standard_error(a: dict, b: dict) -> float:
    """Standard error of mean_a - mean_b from each side's sample std and number of seeds."""
    return math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])


def verdict(a: dict, b: dict) -> str:
    """Whether 'a above b' holds on {'mean', 'std', 'n'} statistics (see the module docstring)."""
    if a["n"] < 2 or b["n"] < 2:
        return "one seed"
    diff, se = a["mean"] - b["mean"], standard_error(a, b)
    if abs(diff) < 2 * se or diff == 0:
        return "within noise"
    return "holds" if diff > 0 else "does not hold"


def _is_beyond(point, base) -> bool:
    if point.protocol == "native":  # a larger budget, or an aspect ratio other than square
        return point.tokens > base.tokens or point.height != point.width
    if point.protocol == "frames":
        return point.frames > base.frames
    return point.height * point.width > base.height * base.width


def _selected(point, base, where: str) -> bool:
    if where == "base":
        return point == base
    if where == "beyond":
        return _is_beyond(point, base)
    return True


def _compare(claim, good: str, bad: str, stats: dict, points: list, modes: list[str], base_of) -> list[dict]:
    """The comparisons of one model pair at every point and mode the claim covers."""
    out = []
    for mode in modes:
        for point in points:
            covered = not claim.protocols or point.protocol in claim.protocols
            a, b = stats.get((good, mode, point)), stats.get((bad, mode, point))
            if covered and a and b and _selected(point, base_of(point.protocol), claim.where):
                diff, se = a["mean"] - b["mean"], standard_error(a, b)
                where = dict(better=good, worse=bad, mode=mode, **point._asdict())
                out.append(dict(where, a=dict(a), b=dict(b), diff=diff, se=se, verdict=verdict(a, b)))
    return out


def judge_claims(stats: dict, records: list[dict], points: list, modes: list[str], base_of) -> list[dict]:
    """Every claim judged at every point and mode where the benchmark has both models of a pair.

    stats: (model, mode, point) -> {'mean', 'std', 'n'}; records: per-run records (model, family, size, pe);
    base_of(protocol) -> the training point of that protocol."""
    by_pe: dict[str, dict[str, dict]] = {}
    for rec in records:
        by_pe.setdefault(rec.get("pe"), {}).setdefault(rec["model"], rec)
    out = []
    for claim in CLAIMS:
        present = [
            [ra["model"], rb["model"]]
            for good, bad in claim.pairs
            for ra in by_pe.get(good, {}).values()
            for rb in by_pe.get(bad, {}).values()
            if (ra.get("family"), ra.get("size")) == (rb.get("family"), rb.get("size"))
        ]
        comparisons = [c for a, b in present for c in _compare(claim, a, b, stats, points, modes, base_of)]
        out.append(
            dict(
                claim=claim.text,
                source=claim.source,
                pairs=[list(p) for p in claim.pairs],
                present=present,  # the (better, worse) model pairs the benchmark has, compared or not
                where=claim.where + (f" ({', '.join(claim.protocols)})" if claim.protocols else ""),
                comparisons=comparisons,
                tally={v: sum(c["verdict"] == v for c in comparisons) for v in VERDICTS},
            )
        )
    return out


def tally_text(judged: dict) -> str:
    """'upsample: holds at 5 of 8 comparisons, within noise at 3; fov: ...' or why nothing was compared."""
    comparisons = judged["comparisons"]
    if not comparisons and judged.get("present"):
        models = "; ".join(" and ".join(pair) for pair in judged["present"])
        where = judged["where"]
        return f"not measured: this benchmark has {models}, but no evaluation point where the claim applies ({where})"
    if not comparisons:
        pes = sorted({pe for pair in judged["pairs"] for pe in pair})
        return f"not measured: this benchmark lacks models with the PEs {', '.join(pes)} on one backbone"
    parts = []
    for protocol in dict.fromkeys(c["protocol"] for c in comparisons):
        rows = [c for c in comparisons if c["protocol"] == protocol]
        mine = [c["verdict"] for c in rows]
        counts = ", ".join(f"{v} at {mine.count(v)}" for v in VERDICTS if v in mine)
        ahead = sum(c["diff"] > 0 for c in rows if c["verdict"] == "one seed")
        signs = f" (the claimed-better PE ahead at {ahead})" if "one seed" in mine else ""
        parts.append(f"{protocol}: {counts}{signs} of {len(mine)} comparison(s)")
    return "; ".join(parts)


# ------------------------------------------------------------------------------------------------------------ the plot

_AXES = {
    "upsample": "evaluation resolution (px), content scaled",
    "fov": "canvas size (px), content at training scale",
    "frames": "clip length (frames)",
    "native": "tokens per image, each at its own aspect ratio",
}


def _line_x(row: dict, protocol: str) -> int | None:
    """A row's x in a protocol's line panel, None when the row belongs to the shapes panel."""
    if protocol == "native":
        return row.get("tokens") if row["height"] == 0 else None
    if row["height"] != row["width"]:
        return None
    return row["frames"] if protocol == "frames" else row["height"]


def _base_x(summary: dict, protocol: str) -> int:
    if protocol == "native":
        return summary.get("base_tokens", 0)
    return summary["base_frames"] if protocol == "frames" else summary["base"][0]


def plot_extrapolation(summary: dict, path: Path) -> Path | None:
    """Draw summary.json's table to `path` (square sizes as lines, non-square shapes in their own panels); None when
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the tables do not need it
        return None
    modes = summary["modes"]
    protocols = summary["protocols"]
    square = [(p, m) for p in protocols for m in modes]
    oblong = [(p, m) for p, m in square if p != "frames" and _oblong_shapes(summary["table"], p, m)]
    labels = _labels(summary["models"])
    n = len(square) + len(oblong)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.6), sharey=True, squeeze=False)
    for ax, (protocol, mode) in zip(axes[0][len(square) :], oblong):
        _oblong_panel(ax, summary, protocol, mode, labels, len(modes) > 1)
    for ax, (protocol, mode) in zip(axes[0], square):
        ticks: set[int] = set()
        for k, model in enumerate(summary["models"]):
            pts = sorted(
                (_line_x(r, protocol), r["mean"], r["std"])
                for r in summary["table"]
                if r["model"] == model and r["mode"] == mode and r["protocol"] == protocol
                and _line_x(r, protocol) is not None
            )  # fmt: skip
            if not pts:
                continue
            xs, ys, es = zip(*pts)
            ticks.update(xs)
            ax.errorbar(
                xs, ys, yerr=es if any(es) else None, marker="o", ms=4, capsize=2, label=labels[model], color=f"C{k}"
            )
        ax.axvline(_base_x(summary, protocol), color="grey", ls=":")
        if protocol in ("frames", "native"):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
            ax.minorticks_off()
        ax.set_title(f"{protocol}, {mode} positions" if len(modes) > 1 else protocol)
        ax.set_xlabel(_AXES[protocol])
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("top-1 accuracy (%)")
    handles, names = axes[0][0].get_legend_handles_labels()
    # below the panels, outside every axes: no curve is hidden behind it
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 6) or 1, fontsize=8, frameon=False)
    seeds = len(summary["seeds"])
    trained = f"{summary['base_tokens']} tokens" if "native" in protocols else f"{summary['base'][0]} px"
    fig.suptitle(
        f"{summary['dataset']}: trained at {trained}"
        + (f", {summary['base_frames']} frames" if "frames" in protocols else "")
        + f", {seeds} seed{'s' if seeds > 1 else ''}",
        fontsize=11,
    )
    rows = -(-len(names) // 6) if names else 0
    fig.tight_layout(rect=(0, 0.05 * rows + 0.02, 1, 1))  # leave room for the legend's rows
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _labels(models: list[str]) -> dict[str, str]:
    """PE names when all models share a backbone prefix (vit_n_ape -> ape), full names otherwise."""
    parts = {m: split_name(m) for m in models}
    backbones = {(f, s) for f, s, _ in parts.values()}
    if len(backbones) == 1:
        return {m: p[2] for m, p in parts.items()}
    return {m: m for m in models}


def _in_shapes_panel(r: dict, protocol: str) -> bool:
    """Native: every fixed aspect ratio (1:1 too); the others: every non-square shape."""
    return r["height"] > 0 if protocol == "native" else r["height"] != r["width"]


def _oblong_shapes(table: list[dict], protocol: str, mode: str) -> list[tuple[int, int]]:
    """The shapes panel's (height, width) under `protocol` and `mode`: non-square sizes smallest first, or the native
    protocol's aspect ratios tallest first."""
    key = (lambda hw: hw[1] / hw[0]) if protocol == "native" else (lambda hw: (hw[0] * hw[1], hw))
    shapes = {(r["height"], r["width"]) for r in table
              if r["mode"] == mode and r["protocol"] == protocol and _in_shapes_panel(r, protocol)}  # fmt: skip
    return sorted(shapes, key=key)


def _oblong_panel(ax, summary: dict, protocol: str, mode: str, labels: dict, name_mode: bool) -> None:
    """Top-1 at each non-square shape: shapes on a categorical axis, one marker (with seed error bar) per PE."""
    shapes = _oblong_shapes(summary["table"], protocol, mode)
    models = summary["models"]
    width = 0.8 / max(len(models), 1)
    for k, model in enumerate(models):
        pts = [
            (shapes.index((r["height"], r["width"])), r["mean"], r["std"])
            for r in summary["table"]
            if r["model"] == model and r["mode"] == mode and r["protocol"] == protocol and _in_shapes_panel(r, protocol)
        ]
        if not pts:
            continue
        xs, ys, es = zip(*sorted(pts))
        offset = (k - (len(models) - 1) / 2) * width  # side by side within a shape: markers do not overlap
        color = f"C{k}"  # the same colour as the model's line in the square panels (same order)
        ax.errorbar([x + offset for x in xs], ys, yerr=es if any(es) else None, fmt="s", ms=4, capsize=2, color=color)
    native = protocol == "native"
    ax.set_xticks(range(len(shapes)), [f"{w}:{h}" if native else f"{h}x{w}" for h, w in shapes])
    ax.set_xlim(-0.6, len(shapes) - 0.4)
    kind = "aspect ratios" if native else "non-square"
    ax.set_title(f"{protocol}, {mode} positions, {kind}" if name_mode else f"{protocol}, {kind}")
    tokens = f" at {summary.get('base_tokens')} tokens" if native else ""
    ax.set_xlabel(f"aspect ratio (width:height){tokens}" if native else "evaluation shape (height x width, px)")
    ax.grid(alpha=0.3, axis="y")


def split_name(name: str) -> tuple[str, str, str]:
    try:
        fam = family_of(name)
    except ValueError:
        return name, "", name
    rest = name[len(fam.name) + 1 :]
    size = max((s for s in fam.sizes if rest == s or rest.startswith(s + "_")), key=len, default="")
    pe = rest[len(size) + 1 :] if size else rest
    if not pe:
        pe = FAMILIES[fam.name].pes.get("", {}).get("pe", "default")
    return fam.name, size, pe
