"""An extrapolation benchmark's results.csv, summary.json, results.md (results_template.md filled from the summary,
as the model cards are) and results.png, with the papers' claims judged on them (visionpe.bench.claims) in the
summary and in results.md (docs/benchmark.md)."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

from ..data.native.timm_naflex import naflex_augmentation
from ..data.registry import augmentation_text, get_dataset_info
from ..engine.checkpoint import atomic_write_text
from ..engine.destinations import check_destination, write_text
from ..zoo.registry import name_parts
from .claims import chance_level, detectable, judge_claims, tally_text
from .perf.measure import machine_description, machine_info
from .protocols import CLIP_PROTOCOLS, Point, point_fields, point_label, row_point, size_label
from .stats import mean_std
from .templates import template

CSV_KEYS = ("model", "family", "size", "pe", "seed", "protocol", "mode", "height", "width", "frames", "tokens", "top1",
            "top5", "loss", "images", "same_as", "train_seconds", "train_cpu_seconds")  # fmt: skip
# a CSV row's columns from its run's record (train_cpu_seconds: empty for runs trained before it was counted)
RUN_KEYS = ("model", "family", "size", "pe", "seed", "train_seconds", "train_cpu_seconds")

T = template("results_template.md")


def stat_text(st: dict) -> str:
    return f"{st['mean']:.1f} ± {st['std']:.1f}" if st["n"] > 1 else f"{st['mean']:.1f}"


def fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def md_table(heads: list[str], align: str, rows) -> list[str]:
    """The one Markdown table writer: `heads`, `align` one letter per column ('l' or 'r'), rows of cells."""
    rule = "".join("---:|" if a == "r" else "---|" for a in align)
    return [f"| {' | '.join(heads)} |", f"|{rule}", *(f"| {' | '.join(map(str, r))} |" for r in rows)]


def check_files(out: Path, flag: str = "--out") -> None:
    """Before any work: out.json and out.md can be written (a one-line DestinationError says why not)."""
    for path in (out.with_suffix(".json"), out.with_suffix(".md")):
        check_destination(path, flag)


def write_files(out: Path, data: dict, markdown: str, flag: str = "--out") -> tuple[Path, Path]:
    """out.json and out.md, each written atomically (a command's results); a failure is one line naming `flag`."""
    paths = out.with_suffix(".json"), out.with_suffix(".md")
    write_text(paths[0], json.dumps(data, indent=1, default=str) + "\n", flag)
    write_text(paths[1], markdown, flag)
    return paths


# ----------------------------------------------------------------- a summary's tables (results.md and the model cards)


def base_point(s: dict, protocol: str) -> Point:
    """A protocol's training point in a summary: its size (and clip length), or its token budget for native."""
    if protocol == "native":  # each image at its own aspect ratio
        return Point(protocol, 0, 0, 0, s["base_tokens"])
    return Point(protocol, *s["base"], s["base_frames"] if protocol in CLIP_PROTOCOLS else 0)


def summary_points(s: dict) -> list[Point]:
    """The table's columns: the training point (and the native budget), then each protocol's other points in order."""
    protocols, order = s["protocols"], {tuple(x): i for i, x in enumerate(s["sizes"])}
    cols = [base_point(s, protocols[0]), *([base_point(s, "native")] if "native" in protocols[1:] else [])]
    for pr in protocols:
        mine = {row_point(r) for r in s["table"] if r["protocol"] == pr} - {base_point(s, pr)}
        cols += sorted(mine, key=lambda p: (p.frames, p.height > 0, p.tokens, p.patch,
                                            p.width / p.height if p.height else 0, order.get(p.size, len(order)),
                                            p.size))  # fmt: skip
    return cols


def heading(s: dict, c: Point) -> str:
    """A column's heading: 'base (32)', 'base (8 f, 32)' or 'base (64 tok)' at the training point, else the point."""
    if c != base_point(s, c.protocol):
        return ("up " if c.protocol == "upsample" and len(s["protocols"]) > 1 else "") + point_label(c)
    if c.protocol == "native":
        return f"base ({point_label(c)})"
    frames = f"{s['base_frames']} f, " if set(CLIP_PROTOCOLS) & set(s["protocols"]) else ""
    return f"base ({frames}{size_label(tuple(s['base']))})"


def accuracy_tables(s: dict, models: list[str], title: str, pe_column: bool = False) -> str:
    """Top-1 per model and point, a table per position mode under `title`; (=): the modes give the same logits."""
    cols, first = summary_points(s), s["modes"][0]
    stats = {(r["model"], r["mode"], row_point(r)): r for r in s["table"]}
    pe = {r["model"]: r["pe"] for r in s["table"]}
    heads = ["model", *(["PE"] if pe_column else []), *(heading(s, c) for c in cols)]
    text = ""
    for mode in s["modes"]:
        rows = []
        for m in models:
            cells = [_cell(stats.get((m, mode, c)), c == base_point(s, c.protocol)) for c in cols]
            name = f"{m} (=)" if m in s["modes_agree"] and mode != first else m
            rows.append([name, *([pe[m]] if pe_column else []), *cells])
        table = md_table(heads, "l" * (len(heads) - len(cols)) + "r" * len(cols), rows)
        text += title.format(mode=mode) + "\n\n" + "\n".join(table) + "\n\n"
    return text


def _cell(st: dict | None, at_base: bool) -> str:
    """Mean ± std over seeds, bold at the training point, else with the change against it (delta) in brackets."""
    if st is None:
        return "-"
    return f"**{stat_text(st)}**" if at_base or st["delta"] is None else f"{stat_text(st)} ({st['delta']:+.1f})"


def base_check_text(s: dict, models: list[str], tables: str) -> str:
    """The paragraph ranking the models' base checks best first ('' without any); `tables`: what the tables read."""
    checks = {m: c for m, c in s["base_check"].items() if m in models}
    if not checks:
        return ""
    ranking = ", ".join(f"{m} {stat_text(c)}" for m, c in sorted(checks.items(), key=lambda kv: -kv[1]["mean"]))
    images = "/".join(str(i) for i in sorted({c["images"] for c in checks.values()}))
    return f"The training point on {images} validation items ({tables}, with a larger sampling error): {ranking}.\n\n"


def recipe_text(cfg) -> str:
    """A training config's recipe in words, with how a data.native recipe batches its images."""
    n, aspect = cfg.data.native, cfg.data.options.get("max_aspect")
    native = ""
    if n:
        budget = f"seq_lens {n['seq_lens']}" if n.get("seq_lens") else f"{n.get('max_tokens', 64)} tokens per image"
        shapes = f" (canvases of 1:{aspect:g} to {aspect:g}:1)" if isinstance(aspect, (int, float)) else ""
        native = f", at native aspect ratios{shapes}, {budget}, {n.get('mode', 'packed')} rows"
    model_opts = ", ".join(f"{k}={v}" for k, v in cfg.model.kwargs.items())  # what every model was built with
    aug = augmentation_text(cfg.data.name, cfg.data.options, vars(cfg.aug), native=bool(n))
    if n and n.get("loader") == "timm":  # timm's NaFlex loader crops a folder's images whole, else the dataset's items
        whole = get_dataset_info(cfg.data.name).native_augmentation is not None  # the datasets with native_item
        square = augmentation_text(cfg.data.name, cfg.data.options, vars(cfg.aug))
        aug = naflex_augmentation(whole, square, vars(cfg.aug))
    return T["trained"].format(
        cfg=cfg, native=native, opts=", ".join(f"{k}={v}" for k, v in cfg.data.options.items()) or "none",
        model_opts=f"; model options: {model_opts}" if model_opts else "", aug=aug,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------------ results.md


def _statistics(s: dict, models: list[str]) -> str:
    """Base accuracy and seed spread at the training point: whether the benchmark can rank anything."""
    base, mode = base_point(s, s["protocols"][0]), s["modes"][0]
    stats = {r["model"]: r for r in s["table"] if r["mode"] == mode and row_point(r) == base}
    at_base = [(m, stats[m]) for m in models if m in stats]
    if not at_base:
        return ""
    (lo_model, lo), (hi_model, hi) = min(at_base, key=lambda x: x[1]["mean"]), max(at_base, key=lambda x: x[1]["mean"])
    sd_model, sd = max(at_base, key=lambda x: x[1]["std"])
    seeds = "/".join(map(str, sorted({st["n"] for _, st in at_base})))
    items = [f"{k} {d['difference']:.1f} points ({d['seeds']} seeds, spread {d['std']:.2f})"
             for k, d in s["detectable"].items()]  # fmt: skip
    found = T["detectable"].format(items="; ".join(items)) if items else ""
    return T["statistics"].format(heading=heading(s, base), lo=lo, lo_model=lo_model, hi=hi, hi_model=hi_model,
                                  sd=sd, sd_model=sd_model, seeds=seeds, detectable=found) + "\n\n"  # fmt: skip


PLATEAU_GAIN = 0.5  # points: a model whose last fifth of training gains less (mean over seeds) has plateaued


def last_fifth_gain(curve: list[dict] | None) -> float | None:
    """Validation top-1 gained over the last fifth of training: the last epoch's against the last evaluated epoch at
    or before four fifths of the way; None without a curve that has both."""
    top1 = {c["epoch"]: c["top1"] for c in curve or () if c.get("top1") is not None}
    last = max(top1, default=0)
    earlier = [e for e in top1 if e > 0 and 5 * e <= 4 * last]
    return top1[last] - top1[max(earlier)] if earlier else None


def training_summary(records: list[dict], models: list[str]) -> dict:
    """Per model: its training CPU time per run (over the runs that counted it) and the last-fifth gain of its
    training curves, mean over the seeds that kept one (summary.json's `training`)."""
    out = {}
    for m in models:
        mine = [r for r in records if r["model"] == m]
        cpu = [r["train_cpu_seconds"] for r in mine if r.get("train_cpu_seconds") is not None]
        gains = [g for g in (last_fifth_gain(r.get("curve")) for r in mine) if g is not None]
        out[m] = dict(train_cpu_seconds=mean_std(cpu) if cpu else None, curves=len(gains),
                      last_fifth_gain=statistics.fmean(gains) if gains else None)  # fmt: skip
    return out


def _training(s: dict, models: list[str]) -> str:
    """Each model's training cost and whether its training plateaued ('' for pretrained weights)."""
    train = {m: s["training"][m] for m in models if m in s.get("training", {})}
    if s["pretrained"] or not train:
        return ""
    curves = any(t["curves"] for t in train.values())
    cheapest = min((t["train_cpu_seconds"]["mean"] for t in train.values() if t["train_cpu_seconds"]), default=None)
    rows = []
    for m, t in train.items():
        cpu = t["train_cpu_seconds"]
        cells = [m, "-", "-"]
        if cpu is not None:
            cells[1] = stat_text(dict(cpu, mean=cpu["mean"] / 60, std=cpu["std"] / 60))
            cells[2] = f"{cpu['mean'] / cheapest:.2f}" if cheapest else "-"
        if curves:
            gain = t["last_fifth_gain"]
            plateau = "-" if gain is None else "yes" if gain < PLATEAU_GAIN else "no"
            cells += [fmt(gain, "+.1f"), plateau]
        rows.append(cells)
    heads = ["model", "training CPU-min per run", "x cheapest", *(["last-fifth gain", "plateaued"] if curves else [])]
    table = "\n".join(md_table(heads, "lrr" + "rl" * curves, rows))
    late = [f"{m} ({t['last_fifth_gain']:+.1f})" for m, t in train.items()
            if t["last_fifth_gain"] is not None and t["last_fifth_gain"] >= PLATEAU_GAIN]  # fmt: skip
    unknown = [m for m, t in train.items() if t["last_fifth_gain"] is None]
    if not curves:
        verdict = T["plateau_unknown"]
    elif late:
        verdict = T["plateau_not"].format(models=", ".join(late), n=len(late), of=len(train) - len(unknown),
                                          gain=PLATEAU_GAIN)  # fmt: skip
    else:
        verdict = T["plateau_all"].format(n=len(train) - len(unknown), gain=PLATEAU_GAIN)
    if curves and unknown:
        verdict += T["plateau_some_unknown"].format(models=", ".join(unknown))
    words = T["curve_words"].format(gain=PLATEAU_GAIN) if curves else ""
    return T["training"].format(table=table, verdict=verdict, curve_words=words) + "\n\n"


def _claims(judged: list[dict], pes: set) -> str:
    """The claims about a PE this benchmark trained (summary.json keeps every claim)."""
    judged = [j for j in judged if pes & {pe for pair in j["pairs"] for pe in pair}]
    heads = ["better? (a)", "than (b)", "protocol", "point", "mode", "top-1 a", "top-1 b", "a - b", "95% CI", "p",
             "p (Holm)", "verdict"]  # fmt: skip
    tables = ""
    for j in (j for j in judged if j["comparisons"]):
        rows = [[c["a"], c["b"], c["protocol"], c["point"], c["mode"], stat_text(c["a_stat"]), stat_text(c["b_stat"]),
                 f"{c['diff']:+.1f}", _interval(c["ci95"]), fmt(c["p"], ".3f"), fmt(c["p_holm"], ".3f"),
                 c["verdict"]] for c in j["comparisons"]]  # fmt: skip
        tables += f"### {j['claim']}\n\n" + "\n".join(md_table(heads, "lllllrrrrrrl", rows)) + "\n\n"
    claims = "".join(f"- **{j['claim']}** ({j['source']}; where: {j['where']}): {tally_text(j)}{_family(j)}.\n"
                     for j in judged)  # fmt: skip
    return T["claims"].format(claims=claims, tables=tables)


def _family(judged: dict) -> str:
    """'; after Holm over its 32 comparisons, these seeds detect 9.8 points' (80% power, median spread)."""
    d = judged.get("detectable_holm")
    if not d or d["difference"] is None:
        return ""
    return f"; after Holm over its {d['m']} comparison(s), {d['seeds']} seeds detect {d['difference']:.1f} points"


LEGEND_ENTRY_INCHES = (0.6, 0.07)  # a legend entry at fontsize 9: marker and gaps, then per character of its label


def legend_columns(labels: list[str], width: float) -> int:
    """Legend columns (at most 6) whose entries, each as wide as the longest label's, fit in `width` inches."""
    entry = LEGEND_ENTRY_INCHES[0] + LEGEND_ENTRY_INCHES[1] * max((len(x) for x in labels), default=0)
    return max(1, min(6, len(labels), int(width // entry)))


def _interval(ci: list[float] | None) -> str:
    return "-" if ci is None else f"[{ci[0]:+.1f}, {ci[1]:+.1f}]"


def format_markdown(s: dict, records: list[dict], rows: list[dict], plan, seconds: float) -> str:
    """results.md: results_template.md filled with the summary's tables, notes, statistics and claims."""
    b, models = plan.bench, [m for m in s["models"] if any(r["model"] == m for r in s["table"])]  # with a cell
    images = "/".join(map(str, sorted({r["images"] for r in rows})))
    seeds = sorted({r["seed"] for r in rows})
    sections = T["modes_agree"] + "\n\n" if s["modes_agree"] and len(s["modes"]) > 1 else ""
    sections += "".join(f"Note: {n}.\n" for n in plan.notes) + ("\n" if plan.notes else "")
    sections += _statistics(s, models)
    sections += base_check_text(s, models, f"bench.base_samples; the tables read {images}")
    sections += _training(s, models)
    sections += _claims(s["claims"], {r["pe"] for r in s["table"]})
    cpu = [r["train_cpu_seconds"] for r in records if r.get("train_cpu_seconds")] or [0]
    ev = [r["eval_cpu_seconds"] for r in records if r.get("eval_cpu_seconds")] or [0]
    return T["results"].format(
        name=b.name, how=T["pretrained"] if b.pretrained else recipe_text(plan.cfg) + ", then",
        images=images, split=plan.cfg.data.val_split, n_seeds=len(seeds), seeds=seeds,
        protocols="; ".join(T[p] for p in b.protocols), tables=accuracy_tables(s, models, "## {mode}", pe_column=True),
        sections=sections, runs=len(records), minutes=seconds / 60, machine=machine_description(s["machine"]),
        processes=b.processes, threads=b.threads, train=statistics.fmean(cpu), eval=statistics.fmean(ev),
        n_train=len(cpu), n_eval=len(ev), total=_total_time_text(records, b.processes),
    ) + "\n"  # fmt: skip


def _total_time_text(records: list[dict], processes: int) -> str:
    """The benchmark's cost from every run's recorded CPU time, whichever invocation ran it (resumed runs included)."""
    timed = [r for r in records if r.get("train_cpu_seconds") is not None and r.get("eval_cpu_seconds") is not None]
    if not timed:
        return ""
    total, lanes = sum(r["train_cpu_seconds"] + r["eval_cpu_seconds"] for r in timed), max(1, processes)
    text = T["total_time"].format(n=len(timed), minutes=total / 60, lane_minutes=total / 60 / lanes, lanes=lanes)
    if len(timed) < len(records):
        whole = total / len(timed) * len(records) / 60
        text += T["untimed"].format(n=len(records) - len(timed), runs=len(records), minutes=whole,
                                    lane_minutes=whole / lanes, lanes=lanes)  # fmt: skip
    return text


def _cells(rows: list[dict]) -> tuple[dict[tuple, list[float]], frozenset]:
    """(model, mode, point) -> per-seed top-1, and the cells whose every seed's row is copied from another cell."""
    groups: dict[tuple, list[float]] = {}
    copies: dict[tuple, list[bool]] = {}
    for r in rows:
        key = (r["model"], r["mode"], row_point(r))
        groups.setdefault(key, []).append(r["top1"])
        copies.setdefault(key, []).append(bool(r.get("same_as")))
    return groups, frozenset(k for k, c in copies.items() if all(c))


def _judged(records: list[dict], rows: list[dict], plan, groups: dict, repeats: frozenset) -> list[dict]:
    return judge_claims(groups, records, plan.points, list(plan.bench.position_modes), plan.base_point,
                        chance_level(plan.cfg.data.name), repeats)  # fmt: skip


def undecided_models(records: list[dict], plan) -> list[str]:
    """The models of every claim comparison that is within noise with the runs of bench.seeds alone (the ones
    bench.extra_seeds extends), in bench.models order."""
    first = [r for r in _kept_rows(records, plan) if r["seed"] in plan.bench.seeds]
    rows = csv_rows(first)
    judged = _judged(first, rows, plan, *_cells(rows))
    models = {m for j in judged for c in j["comparisons"] if c["verdict"] == "within noise" for m in (c["a"], c["b"])}
    return [m for m in plan.bench.models if m in models]


def _summary(records: list[dict], rows: list[dict], plan, seconds: float, machine: dict) -> dict:
    """summary.json: top-1 over seeds (with each cell's change against the training point) and the setup."""
    groups, repeats = _cells(rows)
    stats = {k: mean_std(v) for k, v in groups.items()}  # (model, mode, point) -> {'mean', 'std', 'n'}
    pe = {r["model"]: r["pe"] for r in records}
    table = []
    for (model, mode, point), st in sorted(stats.items()):
        base = stats.get((model, mode, plan.base_point(point.protocol)))
        delta = st["mean"] - base["mean"] if base else None
        table.append(dict(model=model, pe=pe[model], mode=mode, **point_fields(point), **st, delta=delta))
    cfg, b = plan.cfg, plan.bench
    checks = {m: [r["base_check"] for r in records if r["model"] == m and r.get("base_check")] for m in b.models}
    sizes = sorted(plan.sizes, key=lambda s: (s[0] != s[1], s[0] * s[1], s))  # squares ascending, then by area
    return dict(
        name=b.name, dataset=cfg.data.name, base=list(plan.base), sizes=[list(s) for s in sizes],
        modes=list(b.position_modes), protocols=list(b.protocols), base_frames=plan.base_frames,
        base_tokens=plan.base_tokens, pretrained=b.pretrained, seeds=sorted({r["seed"] for r in records}),
        models=[m for m in b.models if m in pe],
        recipe=dict(epochs=cfg.train.epochs, batch_size=cfg.data.batch_size, opt=cfg.optim.opt, lr=cfg.optim.lr,
                    data_options=cfg.data.options, scale=cfg.aug.scale, hflip=cfg.aug.hflip),
        modes_agree=sorted(r["model"] for r in records if r["modes_agree"]), machine=machine, seconds=round(seconds, 1),
        cpu_seconds={k: round(sum(r.get(f"{k}_cpu_seconds") or 0 for r in records), 1) for k in ("train", "eval")},
        date=machine["date"], table=table, base_check={
            m: dict(mean_std([c["top1"] for c in cs]), images=max(c["images"] for c in cs))
            for m, cs in checks.items() if cs},  # top-1 at the training point on bench.base_samples items
        detectable=detectable(stats, list(b.protocols)),
        training=training_summary(records, [m for m in b.models if m in pe]),
        extra_seeds={m: sorted(r["seed"] for r in records if r["model"] == m and r["seed"] not in b.seeds)
                     for m in b.models if any(r["model"] == m and r["seed"] not in b.seeds for r in records)},
        claims=_judged(records, rows, plan, groups, repeats),
    )  # fmt: skip


def _kept_rows(records: list[dict], plan) -> list[dict]:
    """The records with only the rows of the plan's points and modes (a record keeps rows of points since dropped)."""
    points, modes = set(plan.points), set(plan.bench.position_modes)
    return [dict(r, rows=[x for x in r["rows"] if x["mode"] in modes and row_point(x) in points]) for r in records]


def csv_rows(records: list[dict], keys: tuple[str, ...] = CSV_KEYS) -> list[dict]:
    """One row per (run, mode, evaluated point), with the CSV's columns."""
    return [{**{k: (rec if k in RUN_KEYS else r).get(k) for k in keys}, "tokens": r.get("tokens", 0),
             "patch": r.get("patch", 0)} for rec in records for r in rec["rows"]]  # fmt: skip


def csv_text(rows: list[dict], keys: tuple[str, ...]) -> str:
    """results.csv: a header, then one line per row (CRLF, as the csv module writes)."""
    table = io.StringIO()
    csv.writer(table, lineterminator="\r\n").writerows([keys, *([r[k] for k in keys] for r in rows)])
    return table.getvalue()


def write_report(records: list[dict], plan, out: Path, seconds: float, machine: dict | None = None) -> list[Path]:
    """results.csv/.md, summary.json and results.png under `out`; [] and nothing replaced without a row of the plan."""
    records = _kept_rows(records, plan)
    rows = csv_rows(records)
    if not rows:
        return []
    out.mkdir(parents=True, exist_ok=True)
    keys = CSV_KEYS if "patch" not in plan.bench.protocols else (*CSV_KEYS[:11], "patch", *CSV_KEYS[11:])
    machine = machine or dict(machine_info(), threads=plan.bench.threads)
    summary = _summary(records, rows, plan, seconds, machine)
    texts = {
        "results.csv": csv_text(rows, keys),
        "results.md": format_markdown(summary, records, rows, plan, seconds),
        "summary.json": json.dumps(summary, indent=1) + "\n",
    }
    for name, text in texts.items():
        atomic_write_text(out / name, text)
    png = plot_extrapolation(summary, out / "results.png")
    return [out / name for name in texts] + ([png] if png is not None else [])


# ------------------------------------------------------------------------------------------------------------ the plot


def _panel_rows(summary: dict, protocol: str, mode: str, shapes: bool) -> list[dict]:
    """A protocol's rows for its shapes panel (native: fixed aspect ratios; else non-square), or its line panel."""
    return [r for r in summary["table"] if r["mode"] == mode and r["protocol"] == protocol
            and (r["height"] > 0 if protocol == "native" else r["height"] != r["width"]) == shapes]  # fmt: skip


def plot_extrapolation(summary: dict, path: Path) -> Path | None:
    """summary.json's table to `path`: a line panel per protocol and mode, then shapes; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the tables do not need it
        return None
    modes, protocols, models = summary["modes"], summary["protocols"], summary["models"]
    square = [(p, m, False) for p in protocols for m in modes]
    panels = square + [
        (p, m, True) for p, m, _ in square if p not in CLIP_PROTOCOLS and _panel_rows(summary, p, m, True)
    ]
    parts = {m: name_parts(m) for m in models}
    one_backbone = len({p[:2] for p in parts.values()}) == 1  # then the PE names label the lines (vit_n_ape -> ape)
    labels = {m: p[2] if one_backbone else m for m, p in parts.items()}
    ncols = len(panels) if len(panels) <= 3 else 2 if len(panels) == 4 else 3  # four panels: two rows of two
    legend_cols = legend_columns([labels[m] for m in models], 5.6 * ncols)
    nrows, legend_rows = math.ceil(len(panels) / ncols), math.ceil(len(models) / legend_cols)
    height = 4.4 * nrows + 0.22 * legend_rows + 0.3  # the panels keep their height above the legend
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.6 * ncols, height), sharey=True, squeeze=False)
    styles = line_styles(len(models), plt)
    for ax, (protocol, mode, shapes) in zip(axes.flat, panels):
        _panel(ax, summary, protocol, mode, shapes, labels, styles)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("top-1 accuracy (%)")
    handles, names = axes[0][0].get_legend_handles_labels()
    # below the panels, outside every axes: no curve is hidden behind it
    fig.legend(handles, names, loc="lower center", ncol=legend_cols, fontsize=9, frameon=False)
    seeds = len(summary["seeds"])
    trained = f"{summary['base_tokens']} tokens" if "native" in protocols else f"{summary['base'][0]} px"
    frames = f", {summary['base_frames']} frames" if set(CLIP_PROTOCOLS) & set(protocols) else ""
    fig.suptitle(f"{summary['dataset']}: trained at {trained}{frames}, {seeds} seed{'s' if seeds > 1 else ''}",
                 fontsize=11)  # fmt: skip
    fig.tight_layout(rect=(0, (0.22 * legend_rows + 0.1) / height, 1, 1))  # leave room for the legend's rows
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


MARKERS = "osD^vP<X>*ph"  # one per model in turn, beside its colour (no two of 20 models share both)


def line_styles(n: int, plt) -> list[dict]:
    """A distinct colour, marker and line style per model: matplotlib's ten colours up to 10 models, tab20 up to
    20 (its dark shades solid, then its light shades dashed), else evenly spaced hues of a continuous colormap."""
    if n <= 10:
        colors = [plt.get_cmap("tab10")(k) for k in range(n)]
    elif n <= 20:
        colors = [plt.get_cmap("tab20")(k) for k in [*range(0, 20, 2), *range(1, 20, 2)][:n]]
    else:
        colors = [plt.get_cmap("turbo")(k / (n - 1)) for k in range(n)]
    dashes = ["-", "--", "-.", ":"]
    return [dict(color=c, marker=MARKERS[k % len(MARKERS)], ls=dashes[k // 10 % len(dashes)])
            for k, c in enumerate(colors)]  # fmt: skip


def _panel(ax, summary: dict, protocol: str, mode: str, shapes: bool, labels: dict, styles: list[dict]) -> None:
    """Top-1 with seed error bars, a colour, marker and line style per model: along sizes, clip lengths or budgets,
    or per shape; at a shared x the models are spread a little sideways, so their error bars do not overlap."""
    rows, models, native = _panel_rows(summary, protocol, mode, shapes), summary["models"], protocol == "native"
    key = (lambda hw: hw[1] / hw[0]) if native else (lambda hw: (hw[0] * hw[1], hw))  # tallest or smallest first
    cats = sorted({(r["height"], r["width"]) for r in rows}, key=key) if shapes else []
    x = {"native": "tokens", "frames": "frames", "duration": "frames", "patch": "patch"}.get(protocol, "height")
    log_x = protocol in (*CLIP_PROTOCOLS, "native")
    values = sorted({r[x] for r in rows}) if not shapes else []
    gap = min((b / a if log_x else b - a) for a, b in zip(values, values[1:])) if len(values) > 1 else 0
    for k, model in enumerate(models):
        offset = (k - (len(models) - 1) / 2) / max(len(models), 1)  # within [-0.5, 0.5): the models side by side
        pts = sorted((cats.index((r["height"], r["width"])) + 0.8 * offset if shapes else
                      r[x] * gap ** (0.3 * offset) if log_x else r[x] + 0.3 * gap * offset, r["mean"], r["std"])
                     for r in rows if r["model"] == model)  # fmt: skip
        if pts:
            xs, ys, es = zip(*pts)
            style = dict(styles[k], ls="none") if shapes else dict(styles[k], label=labels[model])
            ax.errorbar(xs, ys, yerr=es if any(es) else None, ms=5, capsize=2, lw=1.4, **style)
    name = f"{protocol}, {mode} positions" if len(summary["modes"]) > 1 else protocol
    ax.set_title(f"{name}, {'aspect ratios' if native else 'non-square'}" if shapes else name)
    ax.grid(alpha=0.3, axis="y" if shapes else "both")
    if shapes:
        ax.set_xticks(range(len(cats)), [f"{w}:{h}" if native else f"{h}x{w}" for h, w in cats])
        ax.set_xlim(-0.6, len(cats) - 0.4)
        ax.set_xlabel(T["axis_native_shapes" if native else "axis_shapes"].format(tokens=summary["base_tokens"]))
    else:
        base = {"native": summary["base_tokens"], "frames": summary["base_frames"], "duration": summary["base_frames"]}
        base["patch"] = 0  # the model's own patch
        ax.axvline(base.get(protocol, summary["base"][0]), color="grey", ls=":")
        if log_x:
            ax.set_xscale("log", base=2)
            ax.minorticks_off()
        ax.set_xticks(values, [str(t) for t in values])
        ax.set_xlabel(T[f"axis_{protocol}"])
