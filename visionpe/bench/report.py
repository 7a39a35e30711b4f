"""Tables of an extrapolation benchmark: results.csv (one row per run, mode and size), results.md (mean and standard
deviation over seeds, and the change against the training resolution), summary.json (what the model cards read)."""

from __future__ import annotations

import csv
import inspect
import json
import statistics
import time
from pathlib import Path

from .evalsizes import size_label

__all__ = ["long_rows", "aggregate", "ordered_sizes", "format_markdown", "write_report", "CSV_KEYS"]

CSV_KEYS = (
    "model",
    "family",
    "size",
    "pe",
    "seed",
    "mode",
    "height",
    "width",
    "top1",
    "top5",
    "loss",
    "images",
    "same_as",
    "train_seconds",
)


def long_rows(records: list[dict]) -> list[dict]:
    """One flat row per (run, mode, evaluated size)."""
    out = []
    for rec in records:
        for r in rec.get("rows", []):
            out.append(
                {
                    **{k: rec.get(k) for k in ("model", "family", "size", "pe", "seed", "train_seconds")},
                    **{k: r.get(k) for k in ("mode", "height", "width", "top1", "top5", "loss", "images", "same_as")},
                }
            )
    return out


def ordered_sizes(sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Square sizes ascending, then the others by area."""
    square = sorted(s for s in sizes if s[0] == s[1])
    return square + sorted((s for s in sizes if s[0] != s[1]), key=lambda s: (s[0] * s[1], s))


def aggregate(rows: list[dict]) -> dict[tuple[str, str, tuple[int, int]], dict]:
    """(model, mode, (H, W)) -> {'mean', 'std', 'n', 'seeds'} of top-1 over seeds (sample std; 0 for one seed)."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["mode"], (r["height"], r["width"])), []).append(r["top1"])
    return {
        k: dict(mean=statistics.fmean(v), std=statistics.stdev(v) if len(v) > 1 else 0.0, n=len(v))
        for k, v in groups.items()
    }


def _cell(stat: dict | None, base: dict | None, is_base: bool) -> str:
    if stat is None:
        return "-"
    text = f"{stat['mean']:.1f} ± {stat['std']:.1f}" if stat["n"] > 1 else f"{stat['mean']:.1f}"
    if is_base or base is None:
        return f"**{text}**"
    return f"{text} ({stat['mean'] - base['mean']:+.1f})"


def format_markdown(records: list[dict], plan, seconds: float, machine: str) -> str:
    b, cfg = plan.bench, plan.cfg
    rows = long_rows(records)
    stats = aggregate(rows)
    sizes = ordered_sizes(plan.sizes)
    models = [m for m in b.models if any(r["model"] == m for r in rows)]
    pe_of = {rec["model"]: rec.get("pe", rec["model"]) for rec in records}
    agree = {rec["model"] for rec in records if rec.get("modes_agree")}
    images = sorted({r["images"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    opts = ", ".join(f"{k}={v}" for k, v in cfg.data.options.items()) or "none"
    lines = [
        f"# Resolution extrapolation: {b.name}",
        "",
        f"Trained on `{cfg.data.name}` at {cfg.data.resolution} px ({cfg.train.epochs} epochs, batch "
        f"{cfg.data.batch_size}, {cfg.optim.opt} lr {cfg.optim.lr:g}, data options: {opts}; augmentation: "
        f"{augmentation_text(cfg)}), then evaluated without fine-tuning on "
        f"{'/'.join(str(i) for i in images)} `{cfg.data.val_split}` images at each size. Top-1 accuracy (%), "
        f"mean ± standard deviation over {len(seeds)} seed(s) {seeds}; in brackets, the change against the "
        f"training resolution (bold). Non-square sizes are H x W (the image stretched).",
        "",
        "Position modes: *extrapolate* keeps raw patch indices at the new size; *interpolate* rescales positions to "
        "the training grid (the counterpart of resampling an APE table). A learned APE is resampled to the new grid "
        "in both modes.",
        "",
    ]
    for mode in b.position_modes:
        lines += [
            f"## {mode}",
            "",
            "| model | PE | " + " | ".join(size_label(s) for s in sizes) + " |",
            "|---|---|" + "---:|" * len(sizes),
        ]
        for m in models:
            base = stats.get((m, mode, plan.base))
            cells = [_cell(stats.get((m, mode, s)), base, s == plan.base) for s in sizes]
            mark = " (=)" if m in agree and mode != b.position_modes[0] else ""
            lines.append(f"| {m}{mark} | {pe_of.get(m, '')} | " + " | ".join(cells) + " |")
        lines.append("")
    if agree and len(b.position_modes) > 1:
        lines += [
            "(=): the two position modes give this model identical logits (its PE reads no coordinates, or "
            "resamples its table either way), so one evaluation serves both.",
            "",
        ]
    lines += [f"Note: {n}." for n in getattr(plan, "notes", [])] + ([""] if getattr(plan, "notes", []) else [])
    lines += [
        f"{len(records)} runs; this invocation took {seconds / 60:.1f} min on {machine}, "
        f"{b.processes} process(es) x {b.threads} thread(s). Regenerate: "
        f"`python -m visionpe.bench extrapolate -c <the benchmark file>` (finished runs are reused).",
        "",
    ]
    return "\n".join(lines)


def augmentation_text(cfg) -> str:
    """What the training images went through, in words (from the dataset's factory and options)."""
    from ..data import get_dataset_info

    params = inspect.signature(get_dataset_info(cfg.data.name).factory).parameters
    crop = cfg.data.options.get("crop")
    if crop == "rrc" or ("aug" in params and "crop" not in params):
        a = cfg.aug
        return f"random resized crops (area {a.scale}, aspect {[round(r, 2) for r in a.ratio]}) and flips (p={a.hflip})"
    if "training" in params:
        return f"the dataset's default training augmentation{f' (crop={crop})' if crop else ''}"
    return "none"


def restrict(records: list[dict], plan) -> list[dict]:
    """The records' rows for the plan's modes and sizes only (a record keeps rows of sizes since dropped)."""
    sizes, modes = set(plan.sizes), set(plan.bench.position_modes)
    return [
        dict(r, rows=[x for x in r.get("rows", []) if x["mode"] in modes and (x["height"], x["width"]) in sizes])
        for r in records
    ]


def _summary(records: list[dict], plan, seconds: float, machine: dict) -> dict:
    stats = aggregate(long_rows(records))
    table = []
    for (model, mode, size), st in sorted(stats.items()):
        base = stats.get((model, mode, plan.base))
        pe = next((r.get("pe") for r in records if r["model"] == model), model)
        table.append(
            dict(
                model=model,
                pe=pe,
                mode=mode,
                height=size[0],
                width=size[1],
                mean=st["mean"],
                std=st["std"],
                n=st["n"],
                delta=st["mean"] - base["mean"] if base else None,
            )
        )
    cfg = plan.cfg
    return dict(
        name=plan.bench.name,
        dataset=cfg.data.name,
        base=list(plan.base),
        sizes=[list(s) for s in ordered_sizes(plan.sizes)],
        modes=list(plan.bench.position_modes),
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
        date=time.strftime("%Y-%m-%d"),
        table=table,
    )


def write_report(records: list[dict], plan, out: Path, seconds: float) -> list[Path]:
    """results.csv, results.md, summary.json and results.png under `out`; returns the paths written."""
    from .plots import plot_extrapolation
    from .speed import machine_description, machine_info

    out.mkdir(parents=True, exist_ok=True)
    records = restrict(records, plan)
    machine = machine_info()
    machine["threads"] = plan.bench.threads
    rows = long_rows(records)
    csv_path = out / "results.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_KEYS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    md_path = out / "results.md"
    md_path.write_text(format_markdown(records, plan, seconds, machine_description(machine)))
    summary = _summary(records, plan, seconds, machine)
    json_path = out / "summary.json"
    json_path.write_text(json.dumps(summary, indent=1) + "\n")
    paths = [csv_path, md_path, json_path]
    png = plot_extrapolation(summary, out / "results.png")
    if png is not None:
        paths.append(png)
    return paths
