"""Model cards: `model_cards/<family>.md` for every registered family, from the zoo's tables and the measured
results under results/ (docs/benchmark.md).

    python -m visionpe.bench cards [--results results] [--out model_cards] [--families vit swin]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import yaml

import visionpe  # noqa: F401  (registers the families)

from ..data import get_dataset_info
from ..data.registry import augmentation_text
from ..engine.checkpoint import atomic_write_text
from ..models.pretrained_cfgs import WEIGHTS
from ..papers import PAPERS, bibtex
from ..pos.presets import PE_PRESETS
from ..zoo import FAMILIES, Family, model_name, preset_model_options
from .measure import machine_description
from .protocols import Point, point_label, row_point, size_label
from .report import PROTOCOL_TEXT, accuracy_table, base_check_lines, fmt, md_table, point_heading, tally_text
from .speed import ZOO_SIZES, SpeedRow, memory_ratio_text, spread_text


def load_speed(files: list[tuple[Path, dict]]) -> tuple[dict[tuple[str, int], dict], dict[str, dict]]:
    """(model, resolution) -> speed row, and model -> the machine it was measured on; zoo.json wins over others."""
    rows: dict[tuple[str, int], dict] = {}
    machines: dict[str, dict] = {}
    for path, data in sorted(files, key=lambda f: f[0].stem == "zoo"):  # zoo.json last: it wins
        for r in data.get("rows", []):
            rows[(r["model"], r["resolution"])] = r
            machines[r["model"]] = dict(data.get("machine", {}), source=str(path), settings=data.get("settings", {}))
    return rows, machines


def load_extrapolation(results: Path) -> list[tuple[Path, dict]]:
    """Every benchmark summary under `results` (results/<name>/summary.json)."""
    return [(p, json.loads(p.read_text())) for p in sorted(results.glob("*/summary.json"))]


def _first_paragraph(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def _preset_text(preset: str) -> str:
    parts = PE_PRESETS.get(preset, [])
    if not parts:
        return "none"
    return " + ".join(f"{kind}({', '.join(f'{k}={v}' for k, v in kw.items())})" if kw else kind for kind, kw in parts)


def _size_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in kwargs.items())


def _default_res(fam: Family, size: str) -> int:
    cfg = {**fam.cfg, **fam.size_cfg.get(size, {})}
    return int(cfg.get("input_size", (3, 224, 224))[-1])


def _speed_section(fam: Family, speed: dict, machines: dict) -> list[str]:
    size = ZOO_SIZES.get(fam.name, next(iter(fam.sizes)))
    res = _default_res(fam, size)
    names = [model_name(fam.name, size, pe) for pe in fam.pes]
    measured = [n for n in names if (n, res) in speed]
    lines = ["## Measured cost of each PE", ""]
    if not measured:
        return lines + [
            "No measurements yet: run `python -m visionpe.bench speed --zoo`, then `python -m visionpe.bench cards`.",
            "",
        ]
    base = speed.get((names[0], res), {})
    m = machines[measured[0]]
    lines += [
        f"`{fam.name}_{size}_*` at {res} px, measured on {_how_measured(m, m.get('settings', {}))}; medians over "
        f"the rounds. Ratios are against "
        f"`{names[0]}` measured in the same run; GFLOPs are fvcore MACs per image with attention counted; memory is "
        f"the peak of one inference step of one image beyond the weights. CPU timings on a shared machine are noisy: "
        f"read ratios, not absolute figures.",
        "",
    ]
    heads = ["model", "params (M)", "GFLOPs", "infer img/s", "infer vs first", "train img/s", "train vs first"]
    rows = []
    for n in measured:
        r = speed[(n, res)]
        rows.append([n, f"{r['params_m']:.2f}", fmt(r.get("gflops")), fmt(r.get("infer_ips"), ".1f"),
                     _ratio(r, base, "infer_ips"), fmt(r.get("train_ips"), ".1f"), _ratio(r, base, "train_ips"),
                     fmt(r.get("infer_mem_mb"), ".0f")])  # fmt: skip
    lines += md_table([*heads, "infer MiB"], "lrrrrrrr", rows)
    pairs = [(n, speed[(n, res)]) for n in measured if speed[(n, res)].get("reference")]
    if pairs:
        rows = []
        for n, r in pairs:
            ref = speed.get((r["reference"], res), {})
            fl = f"{fmt(r.get('gflops'))} / {fmt(ref.get('gflops'))}"
            rows.append([n, r["reference"], fl, _ratio(r, ref, "infer_ips"), _ratio(r, ref, "train_ips")])
        heads = ["ours", "timm", "GFLOPs (ours / timm)", "inference speed ratio", "training speed ratio"]
        lines += ["", "Against timm's implementation of the same architecture, same run:", ""]
        lines += md_table(heads, "llrrr", rows)
    return lines + [""]


def _how_measured(machine: dict, s: dict) -> str:
    clock = "CPU seconds of one thread" if s.get("clock") == "cpu" else "wall-clock"
    when = f"{machine.get('date', '?')}; batch {s.get('batch', '?')}, {s.get('rounds', '?')} interleaved rounds"
    return f"{machine_description(machine)}, {when}, {clock}"


def _ratio(r: dict, base: dict, key: str) -> str:
    return f"{r[key] / base[key]:.2f}" if r.get(key) and base.get(key) else "-"


def _speed_rows(data: dict) -> list:
    known = {f.name for f in dataclasses.fields(SpeedRow)}
    return [SpeedRow(**{k: v for k, v in r.items() if k in known}) for r in data.get("rows", []) if "model" in r]


def _cost_spread_section(fam: Family, files: list[tuple[Path, dict]], out_dir: Path) -> list[str]:
    """Per-PE cost against a baseline measured in the same rounds, median [spread], from every speed file that has
    such ratios for models of the family."""
    lines: list[str] = []
    for path, data in files:
        rows = _speed_rows(data)
        by = {(r.model, r.resolution, r.frames): r for r in rows}
        mine = [
            r
            for r in rows
            if r.model.startswith(fam.name + "_")
            and r.model != r.baseline
            and (r.infer_vs_base or r.train_vs_base or (r.baseline and (r.infer_mem_mb or r.train_mem_mb)))
        ]
        if not mine:
            continue
        word = "interquartile range" if data.get("settings", {}).get("rounds", 0) >= 4 else "min-max"
        md = path.with_suffix(".md")
        link = f" ([{md.name}]({relative_link(md, out_dir)}))" if md.is_file() else ""
        lines += [
            f"### Cost against a baseline: {path.stem}",
            "",
            f"From `{path.parent.name}/{path.name}`{link}: {_how_measured(data['machine'], data.get('settings', {}))}. "
            f"Each ratio is taken per "
            f"round against the baseline (and timm's equivalent) measured in the same rounds and given as median "
            f"[{word} over the rounds]; above 1 is faster. Memory: peak of one item, infer / train, against the "
            f"baseline's.",
            "",
        ]
        heads = ["model", "px", "frames", "baseline", "infer vs baseline", "train vs baseline", "memory vs baseline"]
        rows = [[r.model, r.resolution, r.frames or "-", r.baseline, spread_text(r.infer_vs_base),
                 spread_text(r.train_vs_base), memory_ratio_text(r, by.get((r.baseline, r.resolution, r.frames))),
                 spread_text(r.infer_vs_timm), spread_text(r.train_vs_timm)] for r in mine]  # fmt: skip
        lines += [*md_table([*heads, "infer vs timm", "train vs timm"], "lrrlrrrrr", rows), ""]
    return lines


def _recipe_text(s: dict, folder: Path) -> str:
    """The recipe in one line (model options from the run's saved config, bench.yaml)."""
    r = dict(s.get("recipe", {}))
    opts = r.pop("data_options", {}) or {}
    aug = {k: r.pop(k) for k in ("scale", "hflip") if k in r}
    parts = [f"{k}={v}" for k, v in r.items()] + [f"data.{k}={v}" for k, v in opts.items()]
    parts.append(f"augmentation: {augmentation_text(s['dataset'], opts, aug)}")
    if (folder / "bench.yaml").is_file():
        kwargs = (yaml.safe_load((folder / "bench.yaml").read_text()).get("model") or {}).get("kwargs") or {}
        parts += [f"model.{k}={v}" for k, v in kwargs.items()]
    return ", ".join(parts)


def _training_section(fam: Family, summaries: list[tuple[Path, dict]], out_dir: Path) -> list[str]:
    lines = ["## Training data and recipe", ""]
    found = family_summaries(fam, summaries)
    if not found:
        return lines + [
            "visionpe publishes no trained weights for this family and has no accuracy benchmark of it yet; train "
            "with `visionpe-train -c <recipe> model.name=<model>` (recipes: `visionpe/configs/`).",
            "",
        ]
    for path, s, models in found:
        rel = relative_link(path.parent, out_dir)
        folder = f"{path.parent.parent.name}/{path.parent.name}"  # results/<name>
        data = DATASETS.get(s["dataset"], (None, s["dataset"]))[1]
        how = (
            f"Pretrained weights evaluated without training at {_trained_where(s)}"
            if s.get("pretrained")
            else f"Trained from random initialisation at {_trained_where(s)}"
            + f" with {_recipe_text(s, path.parent)}; seeds {s['seeds']}"
        )
        lines += [
            f"- **{s['name']}** ({', '.join(f'`{m}`' for m in models)}): {data}. {how}. Recipe: "
            f"[{rel}/bench.yaml]({rel}/bench.yaml), rerun with "
            f"`{s.get('command') or f'visionpe-bench extrapolate -c {folder}/bench.yaml'}` (from the repository root)."
        ]
    return lines + [""]


def _pe_paper(fam: Family, pe: str, preset: str) -> tuple[str, str] | None:
    """(paper name, ids) of a PE variant: the family's own entry, else the entry another family gives the same PE
    (Swin's iRPE is the iRPE paper), else the family's paper for its default PE; None for no PE."""
    if pe in fam.pe_cfg:
        cfg = fam.pe_cfg[pe]
    elif pe == next(iter(fam.pes)) and preset != "nope":
        cfg = fam.cfg
    else:
        kinds = [k for k, _ in PE_PRESETS.get(preset, [])]
        keys = [pe, preset, *kinds]
        cfg = next((f.pe_cfg[k] for k in keys for f in FAMILIES.values() if k in f.pe_cfg), None)
    if not cfg or not cfg.get("paper_ids"):
        return None
    return cfg.get("paper_name", ""), cfg["paper_ids"]


def _paper_names(fam: Family) -> dict[str, str]:
    seen: dict[str, str] = {}
    for cfg in [fam.cfg, *fam.pe_cfg.values()]:
        ids, name = cfg.get("paper_ids"), cfg.get("paper_name")
        if ids and ids not in seen:
            known = PAPERS.get(ids.removeprefix("arXiv:"))
            seen[ids] = known.title if known else name or ""
    return seen


def _weights_table(fam: Family) -> list[str]:
    """The published weights of this family: `name.tag` (the first tag is the default) and where they come from."""
    rows = [
        [f"`{name}.{tag}`", cfg.get("hf_hub_id") or cfg.get("url", "-")]
        for name, tags in WEIGHTS.items()
        if name.startswith(fam.name + "_")
        for tag, cfg in tags.items()
    ]
    if not rows:
        return []
    return [*md_table(["model.tag (first tag of a model: its default)", "source"], "ll", rows), ""]


def _measured_text(fam: Family, pe: str, speed: dict, summaries: list[tuple[Path, dict]]) -> str:
    """Where results of models with this PE suffix are (the benchmarks by name, `speed`), or 'none yet'."""
    mine = {model_name(fam.name, size, pe) for size in fam.sizes}
    found = [s["name"] for _, s, models in family_summaries(fam, summaries) if mine & set(models)]
    found += ["speed"] if any(m in mine for m, _ in speed) else []
    return ", ".join(found) or "none yet"


def _details_section(fam: Family, speed: dict, summaries: list[tuple[Path, dict]] = ()) -> list[str]:
    """Model details: type, weights, license, each size's configuration and cost, each PE variant, its paper and
    which results measure it."""
    first_pe = next(iter(fam.pes))
    sizes = []
    for size, kwargs in fam.sizes.items():
        res = _default_res(fam, size)
        r = speed.get((model_name(fam.name, size, first_pe), res), {})
        sizes.append([size, _size_text(kwargs), res, fmt(r.get("params_m")), fmt(r.get("gflops"))])
    variants = []
    for pe, kwargs in fam.pes.items():
        preset = kwargs.get("pe", "")
        extra = {**preset_model_options(kwargs), **{k: v for k, v in kwargs.items() if k != "pe"}}
        paper = _pe_paper(fam, pe, preset)
        measured = _measured_text(fam, pe, speed, summaries)
        variants.append([f"`{pe or '(none)'}`", f"{preset}: {_preset_text(preset)}", _size_text(extra) or "-",
                         f"{paper[0]} ({paper[1]})" if paper else "-", measured])  # fmt: skip
    return [
        "## Model details",
        "",
        f"- Model type: {TASKS.get(fam.name, TASKS['*'])[1]}, timm models (`library_name: timm`) built by visionpe",
        "- Weights: none published by visionpe; models train from scratch or load converted published checkpoints "
        "(see *Weight compatibility*)",
        "- License: Apache-2.0 (the code; converted checkpoints keep their own licenses)",
        "",
        "### Architecture",
        "",
        *md_table(["size", "configuration", "default input", "params (M)", "GFLOPs"], "llrrr", sizes),
        "",
        f"Parameters and GFLOPs (fvcore MACs, attention included) with the `{first_pe or 'default'}` PE and "
        f"1000 classes (400 for video), at the default input; '-' where not measured yet.",
        "",
        "### PE variants",
        "",
        *md_table(
            ["suffix", "PE preset (kinds and options)", "model options", "paper", "measured in"], "lllll", variants
        ),  # fmt: skip
        "",
        "*Measured in*: the benchmarks under `results/` (and the speed files) with a model of that PE; *none yet*: "
        "registered and tested, but no committed measurement.",
        "",
    ]


def _weights_section(fam: Family) -> list[str]:
    lines = ["## Weight compatibility", ""]
    if fam.filter_fn is None:
        return lines + [
            "No published checkpoints map onto this family; its models train from random initialisation (`train.py`).",
            "",
        ]
    doc = sys.modules[fam.filter_fn.__module__].__doc__
    return lines + [
        " ".join((doc or "").split()),
        "",
        f"`timm.create_model(name, pretrained=True)` downloads the default tag's weights and applies this "
        f"conversion ({fam.filter_fn.__module__}.{fam.filter_fn.__name__}), setting the options the weights were "
        f"trained with; `pretrained_cfg_overlay=dict(file=...)` loads a local copy instead.",
        "",
        *_weights_table(fam),
    ]


def _citation_section(fam: Family) -> list[str]:
    return [
        "## Citation",
        "",
        "The papers behind this family and its PE variants:",
        "",
        *(f"- {name} ({ids})" for ids, name in _paper_names(fam).items()),
        "",
        "```bibtex",
        "\n\n".join(entry for entry in (bibtex(ids) for ids in _paper_names(fam)) if entry),
        "```",
        "",
        "---",
        f"Generated by `python -m visionpe.bench cards` on {time.strftime('%Y-%m-%d')} from the files "
        f"under results/; edits by hand are overwritten.",
        "",
    ]


def family_card(
    fam: Family,
    speed: dict,
    machines: dict,
    summaries: list[tuple[Path, dict]],
    out_dir: Path,
    speed_files: list[tuple[Path, dict]] = (),
) -> str:
    """The Markdown card of one family: the sections in order, each filled from the zoo's tables and the results."""
    names = [model_name(fam.name, s, p) for s in fam.sizes for p in fam.pes]
    notes = fam.cfg.get("notes") or ()
    lines = [
        card_metadata(fam, summaries),
        f"# {fam.name}: {fam.model_cls.__name__}",
        "",
        _first_paragraph(sys.modules[fam.module].__doc__),
        "",
        f"{len(names)} registered timm models, `{fam.name}_{{size}}_{{pe}}` (e.g. `{names[0]}`, `{names[-1]}`): "
        f'`import visionpe, timm; timm.create_model("{names[0]}")`. Every model takes any input size at call time '
        f"(`fixed_input_size=False`).",
        "",
        *([*(f"- {n}" for n in notes), ""] if notes else []),
        *_details_section(fam, speed, summaries),
        *usage_section(fam, names),
        *_training_section(fam, summaries, out_dir),
        *accuracy_section(fam, summaries, out_dir),
        *_speed_section(fam, speed, machines),
        *_cost_spread_section(fam, list(speed_files), out_dir),
        *limitations_section(fam, family_summaries(fam, summaries)),
        *_weights_section(fam),
        *_citation_section(fam),
    ]
    return "\n".join(lines)


def _check_folders(results: Path, out: Path) -> None:
    """A mistyped or empty results folder fails before anything is written (cards from no results would replace the
    committed ones with empty tables)."""
    if not results.is_dir():
        raise ValueError(f"--results {results}: no such folder (it holds speed/*.json and <benchmark>/summary.json)")
    if not any((results / "speed").glob("*.json")) and not any(results.glob("*/summary.json")):
        raise ValueError(
            f"--results {results} holds no speed/*.json and no <benchmark>/summary.json: no results to write cards "
            f"from (a mistyped folder?); the cards under {out} are left as they are"
        )
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")


def write_cards(
    results: str | Path = "results", out: str | Path = "model_cards", families: list[str] | None = None
) -> list[Path]:
    """Write one card per family (all of them drawn up before any is written); returns the paths."""
    results, out = Path(results), Path(out)
    unknown = [f for f in families or [] if f not in FAMILIES]
    if unknown:
        raise ValueError(
            f"unknown famil{'y' if len(unknown) == 1 else 'ies'} {unknown}; registered: {', '.join(FAMILIES)}"
        )
    _check_folders(results, out)
    speed_files = [(p, json.loads(p.read_text())) for p in sorted((results / "speed").glob("*.json"))]
    speed, machines = load_speed(speed_files)
    summaries = load_extrapolation(results)
    cards = {
        out / f"{name}.md": family_card(fam, speed, machines, summaries, out, speed_files)
        for name, fam in FAMILIES.items()
        if not families or name in families
    }
    out.mkdir(parents=True, exist_ok=True)
    for path, text in cards.items():
        atomic_write_text(path, text)
    return list(cards)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="visionpe-bench cards", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--results", default="results", help="folder with speed/*.json and <benchmark>/summary.json")
    ap.add_argument("--out", default="model_cards")
    ap.add_argument("--families", nargs="+", default=None, help=f"default: all ({', '.join(FAMILIES)})")
    args = ap.parse_args(argv)
    try:
        paths = write_cards(args.results, args.out, args.families)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


# ------------------------------------------------------------------------------------------------------------ accuracy


def relative_link(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()


def family_models(fam: Family, s: dict) -> list[str]:
    return [m for m in s["models"] if m.startswith(fam.name + "_") or m == fam.name]


def _base_of(s: dict):
    base, frames, tokens = tuple(s["base"]), s["base_frames"], s.get("base_tokens", 0)

    def base_of(protocol: str) -> Point:
        if protocol == "native":  # the training budget, each image at its own aspect ratio
            return Point(protocol, 0, 0, 0, tokens)
        return Point(protocol, *base, frames if protocol == "frames" else 0)

    return base_of


def _trained_where(s: dict) -> str:
    """Where the models were trained: '32 px', '8 frames of 32 px' or '64 tokens per image at native aspect ratios'."""
    base = size_label(tuple(s["base"]))
    if "native" in s["protocols"]:
        return f"{s.get('base_tokens', 0)} tokens per image at native aspect ratios"
    return f"{s['base_frames']} frames of {base} px" if "frames" in s["protocols"] else f"{base} px"


def summary_points(s: dict) -> list[Point]:
    """The table's columns: the training point once, then each protocol's other points (sizes as the summary orders
    them, clip lengths ascending)."""
    base_of, protocols = _base_of(s), s["protocols"]
    have = {row_point(r) for r in s["table"]}
    order = {tuple(x): i for i, x in enumerate(s["sizes"])}
    cols = [base_of(protocols[0])]
    for pr in protocols:
        mine = [p for p in have if p.protocol == pr and p != base_of(pr)]
        cols += sorted(mine, key=lambda p: (p.frames, p.height > 0, p.tokens, order.get(p.size, len(order)), p.size))
    return cols


def chance_level(s: dict) -> float | None:
    """Top-1 (%) of guessing on the summary's dataset; None when the number of classes is not known."""
    try:
        return 100.0 / get_dataset_info(s["dataset"]).num_classes
    except (KeyError, ValueError, TypeError, ZeroDivisionError):  # unknown set, or classes known only from a folder
        return None


def at_chance(s: dict) -> bool:
    """No model clearly above guessing at the training point (mean - 2 std within chance level)."""
    chance = chance_level(s)
    base = _base_of(s)(s["protocols"][0])
    rows = [r for r in s["table"] if row_point(r) == base]
    return chance is not None and bool(rows) and all(r["mean"] - 2 * r.get("std", 0.0) <= chance for r in rows)


def family_summaries(fam: Family, summaries: list[tuple[Path, dict]]) -> list[tuple[Path, dict, list[str]]]:
    """(path, summary, the family's models) of every summary with models of the family; above-chance runs first."""
    found = [(p, s, family_models(fam, s)) for p, s in summaries]
    return sorted((f for f in found if f[2]), key=lambda f: at_chance(f[1]))


def family_claims(models: list[str], s: dict) -> list[dict]:
    """The claims with comparisons between the given models, restricted to those comparisons."""
    out = []
    for j in s["claims"]:
        mine = [c for c in j["comparisons"] if c["better"] in models and c["worse"] in models]
        if mine:
            out.append(dict(j, comparisons=mine))
    return out


def _heading(s: dict) -> str:
    where = _trained_where(s)
    n = len(s["seeds"])
    seeds = f"{n} seeds" if n > 1 else "1 seed (single runs: no spread)"
    how = f"pretrained weights at {where}" if s.get("pretrained") else f"trained at {where}, {seeds}"
    return f"### {s['name']}: {how}" + (", at chance level" if at_chance(s) else "")


def _summary_block(fam: Family, path: Path, s: dict, models: list[str], out_dir: Path) -> list[str]:
    rel = relative_link(path.parent, out_dir)
    base_of, protocols = _base_of(s), s["protocols"]
    cols = summary_points(s)
    stats = {(r["model"], r["mode"], row_point(r)): r for r in s["table"]}
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
    base, frames = tuple(s["base"]), s["base_frames"]
    agree = s.get("modes_agree", [])
    for mode in s["modes"]:
        heads = [
            f"base ({point_label(c)})"
            if c == base_of(c.protocol) and c.protocol == "native"
            else point_heading(None if c == base_of(c.protocol) else c, base, frames, protocols)
            for c in cols
        ]
        lines += [
            f"*{mode}* positions:",
            "",
            *accuracy_table(models, mode, cols, heads, stats, base_of, agree, s["modes"][0]),
        ]
    checks = {m: c for m, c in (s.get("base_check") or {}).items() if m in models}
    lines += base_check_lines(checks, "the tables read fewer")
    chance = chance_level(s)
    lines += [
        f"Measured on {machine_description(s['machine'])}, {s['date']}."
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


# family -> (Hugging Face pipeline tag, what the model does); "*" for the image classifiers
# -------------------------------------------------------------------------------------------- Hugging Face conventions

TASKS = {
    "*": ("image-classification", "image classifier"),
    "vivit": ("video-classification", "video classifier"),
    "mm": ("visual-question-answering", "image + text encoder with a classification head (answers as classes)"),
}

# dataset name in results -> (Hugging Face dataset id or None for generated sets, description)
DATASETS = {
    "fashion-mnist": ("zalando-datasets/fashion_mnist", "Fashion-MNIST (28 px greyscale clothing, 10 classes)"),
    "synthetic-shapes": (None, "synthetic-shapes, generated by visionpe (16 classes: 4 shapes x 4 quadrants)"),
    "video-shapes": (None, "video-shapes, generated clips by visionpe (8 classes: motion order x direction)"),
    "image-text-shapes": (None, "image-text-shapes, generated image + question pairs by visionpe (7 answers)"),
    "imagefolder": ("ILSVRC/imagenet-1k", "an ImageNet-style image folder"),
}

# PE suffix words that make useful hub tags
_PE_TAGS = {
    "rope": "rope",
    "irpe": "irpe",
    "cpe": "conditional-position-encoding",
    "lepe": "lepe",
    "ape": "absolute-position-embedding",
    "rpb": "relative-position-bias",
}


def card_metadata(fam: Family, summaries: list[tuple[Path, dict]]) -> str:
    """The `---`-fenced YAML block that opens a Hugging Face model card."""
    pipeline, _ = TASKS.get(fam.name, TASKS["*"])
    tags = ["timm", "visionpe", "positional-encoding", pipeline, fam.name]
    for pe in fam.pes:
        tags += [tag for word, tag in _PE_TAGS.items() if word in pe and tag not in tags]
    hub_ids = [DATASETS.get(s["dataset"], (None,))[0] for _, s in summaries if family_models(fam, s)]
    meta = dict(library_name="timm", license="apache-2.0", pipeline_tag=pipeline, tags=tags, metrics=["accuracy"])
    if any(hub_ids):
        meta["datasets"] = list(dict.fromkeys(h for h in hub_ids if h))
    try:
        from huggingface_hub import ModelCardData
    except ImportError:  # optional dependency ([hub] extra): the same keys as plain YAML
        body = yaml.safe_dump(meta, sort_keys=True, default_flow_style=False).strip()
    else:
        body = ModelCardData(**meta).to_yaml()
    return f"---\n{body}\n---\n"


def usage_section(fam: Family, names: list[str]) -> list[str]:
    example = names[0]
    if fam.name == "vivit":
        call = "clips = torch.randn(2, 3, 8, 32, 32)  # [batch, channels, frames, height, width]\nlogits = model(clips)"
    elif fam.name == "mm":
        call = (
            "logits = model(pixels=torch.randn(2, 3, 32, 32), text_ids=torch.randint(0, 100, (2, 12)))"
            "  # image + token ids"
        )
    else:
        call = "logits = model(torch.randn(2, 3, 48, 48))  # any input size at call time"
    return [
        "## How to use",
        "",
        "```python",
        "import timm",
        "import torch",
        "import visionpe  # registers the models with timm (a plain `timm.create_model` does not know them)",
        "",
        f'model = timm.create_model("{example}", num_classes=10).eval()',
        call,
        "```",
        "",
        "Train and evaluate with the package's tools (`pip install visionpe`): `visionpe-train -c <recipe> "
        f"model.name={example}`, `visionpe-eval --checkpoint runs/<run> --resolutions 24,32,48`; or with timm's own "
        "`train.py --model <name> --device-modules visionpe` (docs/using_with_timm.md).",
        "",
        "## Intended use",
        "",
        "Research on positional encodings: comparing PEs inside one architecture with everything else fixed, and "
        "studying how they behave at input sizes other than the training size. The models are untrained "
        "architectures (or converted published checkpoints); they are not products and make no claims about "
        "real-world data.",
        "",
    ]


def limitations_section(fam: Family, summaries: list) -> list[str]:
    lines = [
        "## Limitations",
        "",
        "- The accuracy figures above come from short CPU schedules of nano models on small datasets: they compare "
        "PEs with each other under one recipe and show how accuracy changes with input size; they are not the "
        "accuracy these architectures reach with full training, and say nothing about larger sizes.",
        "- Seeds: one to a handful per model; the ± is the standard deviation over them (tables from one seed give "
        "none, so their differences cannot be told from seed noise), and differences smaller than it are not "
        "evidence of anything.",
        "- Speed figures are from a shared CPU machine: read ratios measured in the same run, not absolute numbers.",
    ]
    if not summaries:
        lines.append("- No accuracy has been measured for this family yet (see *Evaluation results*).")
    if fam.name in ("vivit", "mm"):
        lines.append(
            "- The training data are generated toy tasks; a model that does well on them has learned the task's "
            "position and order cues, not natural video or language."
        )
    return lines + [""]
