"""The leaderboard: every image PE ranked per benchmark, protocol and position mode by its mean score beyond the
training point (top-1 for classification, mIoU for segmentation), with the 95% interval over seeds, ties marked and
the training cost beside (docs/benchmark.md).

    python -m visionpe.bench leaderboard [--results results] [--out results/leaderboard.md] [--readme README.md]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

from ..engine.destinations import check_destination, write_text
from ..zoo.registry import FAMILIES, name_parts
from .claims import is_beyond
from .protocols import Point
from .report import base_point, md_table
from .stats import ALPHA, welch

IMAGE_FAMILIES = ("vit", "swin", "cvt")
README_MARKS = (
    "<!-- leaderboard head: written by `visionpe-bench leaderboard` -->",
    "<!-- end of leaderboard head -->",
)
HEAD_ROWS = 5
METRIC_NAMES = {"top1": "top-1", "miou": "mIoU"}  # a benchmark summary's `metric` (top-1 when it names none)


def _point(row: dict) -> Point:
    ints = [int(row.get(k) or 0) for k in ("height", "width", "frames", "tokens", "patch")]  # patch: its protocol's
    return Point(row["protocol"], *ints)


def _interval(values: list[float]) -> float:
    """The mean's 95% half-width over seeds (Student's t); 0 with one seed."""
    if len(values) < 2:
        return 0.0
    from scipy.stats import t

    return float(t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / len(values) ** 0.5


def scores(summary: dict, rows: list[dict], metric: str = "top1") -> dict[tuple, dict[str, dict]]:
    """(protocol, mode, backbone) -> model -> {'pe', 'seeds': per-seed mean `metric` over the points beyond the
    training point, 'base': per-seed `metric` at it, 'train_cpu_seconds': CPU seconds of one training run}; image
    models only."""
    out: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["family"] not in IMAGE_FAMILIES:
            continue
        point, base = _point(r), base_point(summary, r["protocol"])
        key = (r["protocol"], r["mode"], f"{r['family']}_{r['size']}")
        cell = out.setdefault(key, {}).setdefault(r["model"], dict(pe=r["pe"], beyond={}, base={}, train={}))
        seed = int(r["seed"])
        if point == base:
            cell["base"][seed] = float(r[metric])
        elif is_beyond(point, base):
            cell["beyond"].setdefault(seed, []).append(float(r[metric]))
        if r.get("train_cpu_seconds"):
            cell["train"][seed] = float(r["train_cpu_seconds"])
    for models in out.values():
        for model, c in list(models.items()):
            if not c["beyond"]:
                del models[model]
                continue
            c["seeds"] = [statistics.fmean(v) for _, v in sorted(c["beyond"].items())]
            c["train_cpu_seconds"] = statistics.fmean(c["train"].values()) if c["train"] else None
    return {k: v for k, v in out.items() if v}


def ranked(models: dict[str, dict]) -> list[tuple[str, str, dict]]:
    """(rank text, model, cell) by mean score; a model whose score is not below the one above it at a one-sided
    Welch p < ALPHA shares that model's rank ('=2')."""
    order = sorted(models, key=lambda m: -statistics.fmean(models[m]["seeds"]))
    out, rank = [], 0
    for i, model in enumerate(order):
        above = models[order[i - 1]]["seeds"] if i else None
        mine = models[model]["seeds"]
        tied = above is not None and len(above) > 1 and len(mine) > 1 and welch(above, mine)["p"] >= ALPHA
        rank = rank if tied else i + 1
        out.append((f"={rank}" if tied else str(rank), model, models[model]))
    for j in range(len(out) - 1):  # the first of a tied group is marked too
        if out[j + 1][0] == f"={out[j][0]}":
            out[j] = (f"={out[j][0]}", *out[j][1:])
    return out


def _table(models: dict[str, dict], metric: str, limit: int | None = None) -> list[str]:
    heads = ["rank", "model", "PE", f"{METRIC_NAMES[metric]} beyond training", "95% CI", "at training point", "seeds",
             "train CPU s/run"]  # fmt: skip
    rows = []
    for rank, model, c in ranked(models)[:limit]:
        mean, half = statistics.fmean(c["seeds"]), _interval(c["seeds"])
        base = list(c["base"].values())
        rows.append([rank, model, c["pe"], f"{mean:.1f}", f"[{mean - half:.1f}, {mean + half:.1f}]",
                     f"{statistics.fmean(base):.1f}" if base else "-", len(c["seeds"]),
                     f"{c['train_cpu_seconds']:.0f}" if c["train_cpu_seconds"] else "-"])  # fmt: skip
    return md_table(heads, "lllrrrrr", rows)


def benchmarks(results: Path) -> list[tuple[str, dict, dict]]:
    """(name, summary, scores) of every benchmark under `results` with image models and more than one seed."""
    out = []
    for path in sorted(results.glob("*/summary.json")):
        summary = json.loads(path.read_text())
        if not (path.parent / "results.csv").is_file():  # a segmentation benchmark reported before it wrote one
            continue
        with open(path.parent / "results.csv", newline="") as f:
            found = scores(summary, list(csv.DictReader(f)), summary.get("metric", "top1"))
        if found and len(summary["seeds"]) > 1:
            out.append((path.parent.name, summary, found))
    return out


def leaderboard(results: Path) -> tuple[str, str]:
    """(results/leaderboard.md, the README's head of it)."""
    found = benchmarks(results)
    text = ["# Leaderboard: image PEs beyond the training resolution", "", LEGEND, ""]
    metric_of = {name: summary.get("metric", "top1") for name, summary, _ in found}
    head, widest = [], (0, False, False)  # the head: the table with the most models (fov, extrapolate first)
    for name, summary, tables in found:
        trained = f"Trained at {summary['base'][0]} x {summary['base'][1]} px on `{summary['dataset']}`"
        task = ", segmentation (mIoU)" if metric_of[name] == "miou" else ""
        text += [f"## {name}", "", f"{trained}{task}, {len(summary['seeds'])} seeds; [results]({name}/results.md).",
                 ""]  # fmt: skip
        for (protocol, mode, backbone), models in sorted(tables.items()):
            text += [f"### {protocol}, {mode} ({backbone})", "", *_table(models, metric_of[name]), ""]
            width = (len(models), protocol == "fov", mode == "extrapolate")
            if width > widest:
                widest = width
                head = [f"**{name}**, {protocol}, {mode} ({backbone}), the first {HEAD_ROWS} of {len(models)}:", "",
                        *_table(models, metric_of[name], HEAD_ROWS)]  # fmt: skip
    done = {(k[2].split("_")[0], c["pe"]) for _, _, t in found for k, models in t.items() for c in models.values()}
    missing = [f"{f}: " + ", ".join(name_parts(f"{f}_n_{pe}" if pe else f"{f}_n")[2] for pe in FAMILIES[f].pes
                                     if (f, name_parts(f"{f}_n_{pe}" if pe else f"{f}_n")[2]) not in done)
               for f in IMAGE_FAMILIES]  # fmt: skip
    text += ["## Not benchmarked yet", "", *(f"- {line}" for line in missing), ""]
    return "\n".join(text), "\n".join(head)


LEGEND = (
    "Each model's score is its top-1 (%), or mIoU (%) on a segmentation benchmark, averaged over the protocol's "
    "points beyond the training point, per seed; "
    "the table gives the mean over seeds and its 95% confidence interval (Student's t). A rank written `=k` is "
    "shared: the model's score is not below the one ranked above it by Welch's one-sided test at p < 0.05, so the "
    "order within a group is not established. *at training point*: top-1 there (the same weights); *train CPU s/run*: "
    "the CPU seconds one training run took (one thread), for compute-matched comparisons. Generated by "
    "`visionpe-bench leaderboard` from results/*/results.csv."
)


def with_head(readme: str, head: str) -> str:
    """The README with the text between its leaderboard marks replaced by `head`."""
    start, end = README_MARKS
    if start not in readme or end not in readme:
        raise ValueError(f"the README has no leaderboard marks; add the lines {start!r} and {end!r} where it goes")
    before, rest = readme.split(start, 1)
    return f"{before}{start}\n{head}\n{end}{rest.split(end, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="visionpe-bench leaderboard", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default="results", help="the folder of benchmark results (default: results)")
    ap.add_argument("--out", default=None, help="the leaderboard file (default: <results>/leaderboard.md)")
    ap.add_argument("--readme", default=None, help="a README whose leaderboard head to rewrite (between its marks)")
    args = ap.parse_args(argv)
    results = Path(args.results).expanduser()
    if not results.is_dir():
        raise ValueError(f"--results {results} is not a folder; point it at the folder holding <benchmark>/results.csv")
    out = check_destination(Path(args.out).expanduser() if args.out else results / "leaderboard.md", "--out")
    readme = Path(args.readme).expanduser() if args.readme else None
    if readme is not None and not readme.is_file():
        raise ValueError(f"--readme {readme} is not a file; give the README whose leaderboard head to rewrite")
    text, head = leaderboard(results)
    write_text(out, text, "--out")
    if readme is not None:
        write_text(readme, with_head(readme.read_text(), head), "--readme")
    print(f"wrote {out}" + (f" and the head in {args.readme}" if args.readme else ""))
    return 0
