"""Model cards: `model_cards/<family>.md` for every registered family, written from measured results.

    python -m visionpe.bench cards [--results results] [--out model_cards] [--families vit swin]

A card reads the zoo's tables (sizes, PE variants, papers, weight loaders) and the results files: parameters, GFLOPs
and speed from `results/speed/*.json` (`python -m visionpe.bench speed --zoo` writes `zoo.json`; every speed file's
per-PE ratios against a baseline are shown with their spread), accuracy at every evaluation point of every protocol
from each `results/<benchmark>/summary.json` that has models of the family (`python -m visionpe.bench extrapolate`;
see card_accuracy.py). Nothing in a card is typed by hand: rerun after new measurements.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import yaml

import visionpe  # noqa: F401  (registers the families)

from ..models.pretrained_cfgs import WEIGHTS
from ..papers import PAPERS, bibtex
from ..pos.presets import PE_PRESETS
from ..zoo import FAMILIES, Family, model_name, preset_model_options
from .card_accuracy import accuracy_section, family_summaries, relative_link
from .card_text import DATASETS, TASKS, card_metadata, limitations_section, usage_section
from .evalsizes import size_label
from .speed_report import machine_description

__all__ = ["load_speed", "load_speed_files", "load_extrapolation", "family_card", "write_cards", "main"]


def load_speed(results: Path) -> tuple[dict[tuple[str, int], dict], dict[str, dict]]:
    """(model, resolution) -> speed row, and model -> the machine it was measured on; zoo.json wins over others."""
    rows: dict[tuple[str, int], dict] = {}
    machines: dict[str, dict] = {}
    files = sorted((results / "speed").glob("*.json"), key=lambda p: p.stem == "zoo")  # zoo.json last: it wins
    for path in files:
        data = json.loads(path.read_text())
        for r in data.get("rows", []):
            rows[(r["model"], r["resolution"])] = r
            machines[r["model"]] = dict(data.get("machine", {}), source=str(path), settings=data.get("settings", {}))
    return rows, machines


def load_extrapolation(results: Path) -> list[tuple[Path, dict]]:
    """Every benchmark summary under `results` (results/<name>/summary.json)."""
    return [(p, json.loads(p.read_text())) for p in sorted(results.glob("*/summary.json"))]


def _first_paragraph(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def _fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


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
    from .speed import ZOO_SIZES

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
    s = m.get("settings", {})
    lines += [
        f"`{fam.name}_{size}_*` at {res} px, measured on {machine_description(m)} ({m.get('date', '?')}; batch "
        f"{s.get('batch', '?')}, median of {s.get('rounds', '?')} interleaved rounds, "
        f"{'CPU seconds of one thread' if s.get('clock') == 'cpu' else 'wall-clock'}). Ratios are against "
        f"`{names[0]}` measured in the same run; GFLOPs are fvcore MACs per image with attention counted; memory is "
        f"the peak of one inference step of one image beyond the weights. CPU timings on a shared machine are noisy: "
        f"read ratios, not absolute figures.",
        "",
        "| model | params (M) | GFLOPs | infer img/s | infer vs first | train img/s | train vs first | infer MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in measured:
        r = speed[(n, res)]
        ratio_i = f"{r['infer_ips'] / base['infer_ips']:.2f}" if r.get("infer_ips") and base.get("infer_ips") else "-"
        ratio_t = f"{r['train_ips'] / base['train_ips']:.2f}" if r.get("train_ips") and base.get("train_ips") else "-"
        lines.append(
            f"| {n} | {r['params_m']:.2f} | {_fmt(r.get('gflops'), '.2f')} | {_fmt(r.get('infer_ips'), '.1f')}"
            f" | {ratio_i} | {_fmt(r.get('train_ips'), '.1f')} | {ratio_t} | "
            f"{_fmt(r.get('infer_mem_mb'), '.0f')} |"
        )
    pairs = [(n, speed[(n, res)]) for n in measured if speed[(n, res)].get("reference")]
    if pairs:
        lines += [
            "",
            "Against timm's implementation of the same architecture, same run:",
            "",
            "| ours | timm | GFLOPs (ours / timm) | inference speed ratio | training speed ratio |",
            "|---|---|---:|---:|---:|",
        ]
        for n, r in pairs:
            ref = speed.get((r["reference"], res), {})
            fl = f"{_fmt(r.get('gflops'))} / {_fmt(ref.get('gflops'))}"
            ri = f"{r['infer_ips'] / ref['infer_ips']:.2f}" if r.get("infer_ips") and ref.get("infer_ips") else "-"
            rt = f"{r['train_ips'] / ref['train_ips']:.2f}" if r.get("train_ips") and ref.get("train_ips") else "-"
            lines.append(f"| {n} | {r['reference']} | {fl} | {ri} | {rt} |")
    return lines + [""]


def load_speed_files(results: Path) -> list[tuple[Path, dict]]:
    """Every speed command output under results/speed (path, parsed JSON)."""
    return [(p, json.loads(p.read_text())) for p in sorted((results / "speed").glob("*.json"))]


def _speed_rows(data: dict) -> list:
    from .speed import SpeedRow

    known = {f.name for f in dataclasses.fields(SpeedRow)}
    return [SpeedRow(**{k: v for k, v in r.items() if k in known}) for r in data.get("rows", []) if "model" in r]


def _cost_spread_section(fam: Family, files: list[tuple[Path, dict]], out_dir: Path) -> list[str]:
    """Per-PE cost against a baseline measured in the same rounds, median [spread], from every speed file that has
    such ratios for models of the family."""
    from .speed_report import machine_description, memory_ratio_text, spread_text

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
        s = data.get("settings", {})
        rounds = s.get("rounds", 0)
        word = "interquartile range" if rounds >= 4 else "min-max"
        md = path.with_suffix(".md")
        link = f" ([{md.name}]({relative_link(md, out_dir)}))" if md.is_file() else ""
        lines += [
            f"### Cost against a baseline: {path.stem}",
            "",
            f"From `{path.parent.name}/{path.name}`{link}: {machine_description(data['machine'])}, "
            f"{data['machine'].get('date', '?')}; batch {s.get('batch', '?')}, {rounds} interleaved rounds, "
            f"{'CPU seconds of one thread' if s.get('clock') == 'cpu' else 'wall-clock'}. Each ratio is taken per "
            f"round against the baseline (and timm's equivalent) measured in the same rounds and given as median "
            f"[{word} over the rounds]; above 1 is faster. Memory: peak of one item, infer / train, against the "
            f"baseline's.",
            "",
            "| model | px | frames | baseline | infer vs baseline | train vs baseline | memory vs baseline | "
            "infer vs timm | train vs timm |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|",
        ]
        for r in mine:
            base = by.get((r.baseline, r.resolution, r.frames))
            lines.append(
                f"| {r.model} | {r.resolution} | {r.frames or '-'} | {r.baseline} | {spread_text(r.infer_vs_base)} | "
                f"{spread_text(r.train_vs_base)} | {memory_ratio_text(r, base)} | {spread_text(r.infer_vs_timm)} | "
                f"{spread_text(r.train_vs_timm)} |"
            )
        lines.append("")
    return lines


def _recipe_text(s: dict, folder: Path) -> str:
    """The recipe in one line; the augmentation in words from the run's saved config (bench.yaml)."""
    r = {k: v for k, v in s.get("recipe", {}).items() if k not in ("scale", "hflip")}
    opts = r.pop("data_options", {}) or {}
    parts = [f"{k}={v}" for k, v in r.items()]
    parts += [f"data.{k}={v}" for k, v in opts.items()]
    if (folder / "bench.yaml").is_file():
        from ..engine.config import config_from_dict
        from .report import augmentation_text

        data = yaml.safe_load((folder / "bench.yaml").read_text()) or {}
        data.pop("bench", None)
        cfg = config_from_dict(data)
        parts += [f"model.{k}={v}" for k, v in (cfg.model.kwargs or {}).items()]
        parts.append(f"augmentation: {augmentation_text(cfg)}")
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
            f"Pretrained weights evaluated without training at {size_label(tuple(s['base']))} px"
            if s.get("pretrained")
            else f"Trained from random initialisation at {size_label(tuple(s['base']))} px"
            + (f" on {s['base_frames']}-frame clips" if s.get("base_frames") else "")
            + f" with {_recipe_text(s, path.parent)}; seeds {s['seeds']}"
        )
        lines += [
            f"- **{s['name']}** ({', '.join(f'`{m}`' for m in models)}): {data}. {how}. Recipe: "
            f"[{rel}/bench.yaml]({rel}/bench.yaml), rerun with "
            f"`{s.get('command') or f'visionpe-bench extrapolate -c {folder}/bench.yaml'}` (from the repository root).",
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


def _paper_ids(fam: Family) -> list[str]:
    return list(_paper_names(fam))


def _weights_table(fam: Family) -> list[str]:
    """The published weights of this family: `name.tag` (the first tag is the default) and where they come from."""
    rows = [
        f"| `{name}.{tag}` | {cfg.get('hf_hub_id') or cfg.get('url', '-')} |"
        for name, tags in WEIGHTS.items()
        if name.startswith(fam.name + "_")
        for tag, cfg in tags.items()
    ]
    if not rows:
        return []
    return ["| model.tag (first tag of a model: its default) | source |", "|---|---|", *rows, ""]


def _papers(fam: Family) -> list[str]:
    return [f"- {name} ({ids})" for ids, name in _paper_names(fam).items()]


def family_card(
    fam: Family,
    speed: dict,
    machines: dict,
    summaries: list[tuple[Path, dict]],
    out_dir: Path,
    speed_files: list[tuple[Path, dict]] = (),
) -> str:
    """The Markdown card of one family."""
    module = sys.modules[fam.module]
    names = [model_name(fam.name, s, p) for s in fam.sizes for p in fam.pes]
    lines = [
        card_metadata(fam, summaries),
        f"# {fam.name}: {fam.model_cls.__name__}",
        "",
        _first_paragraph(module.__doc__),
        "",
        f"{len(names)} registered timm models, `{fam.name}_{{size}}_{{pe}}` (e.g. `{names[0]}`, `{names[-1]}`): "
        f'`import visionpe, timm; timm.create_model("{names[0]}")`. Every model takes any input size at call time '
        f"(`fixed_input_size=False`).",
        "",
    ]
    notes = fam.cfg.get("notes") or ()
    if notes:
        lines += [*(f"- {n}" for n in notes), ""]
    lines += [
        "## Model details",
        "",
        f"- Model type: {TASKS.get(fam.name, TASKS['*'])[1]}, timm models (`library_name: timm`) built by visionpe",
        "- Weights: none published by visionpe; models train from scratch or load converted published checkpoints "
        "(see *Weight compatibility*)",
        "- License: Apache-2.0 (the code; converted checkpoints keep their own licenses)",
        "",
        "### Architecture",
        "",
        "| size | configuration | default input | params (M) | GFLOPs |",
        "|---|---|---:|---:|---:|",
    ]
    first_pe = next(iter(fam.pes))
    for size, kwargs in fam.sizes.items():
        res = _default_res(fam, size)
        r = speed.get((model_name(fam.name, size, first_pe), res), {})
        lines.append(f"| {size} | {_size_text(kwargs)} | {res} | {_fmt(r.get('params_m'))} | {_fmt(r.get('gflops'))} |")
    lines += [
        "",
        f"Parameters and GFLOPs (fvcore MACs, attention included) with the `{first_pe or 'default'}` PE and "
        f"1000 classes (400 for video), at the default input; '-' where not measured yet.",
        "",
        "### PE variants",
        "",
        "| suffix | PE preset (kinds and options) | model options | paper |",
        "|---|---|---|---|",
    ]
    for pe, kwargs in fam.pes.items():
        preset = kwargs.get("pe", "")
        extra = {**preset_model_options(kwargs), **{k: v for k, v in kwargs.items() if k != "pe"}}
        paper = _pe_paper(fam, pe, preset)
        lines.append(
            f"| `{pe or '(none)'}` | {preset}: {_preset_text(preset)} | {_size_text(extra) or '-'} | "
            f"{f'{paper[0]} ({paper[1]})' if paper else '-'} |"
        )
    lines += [""]
    lines += usage_section(fam, names)
    lines += _training_section(fam, summaries, out_dir)
    lines += accuracy_section(fam, summaries, out_dir)
    lines += _speed_section(fam, speed, machines)
    lines += _cost_spread_section(fam, list(speed_files), out_dir)
    lines += limitations_section(fam, family_summaries(fam, summaries))
    lines += ["## Weight compatibility", ""]
    if fam.filter_fn is not None:
        doc = sys.modules[fam.filter_fn.__module__].__doc__
        lines += [
            " ".join((doc or "").split()),
            "",
            f"`timm.create_model(name, pretrained=True)` downloads the default tag's weights and applies this "
            f"conversion ({fam.filter_fn.__module__}.{fam.filter_fn.__name__}), setting the options the weights were "
            f"trained with; `pretrained_cfg_overlay=dict(file=...)` loads a local copy instead.",
            "",
            *_weights_table(fam),
        ]
    else:
        lines += [
            "No published checkpoints map onto this family; its models train from random initialisation (`train.py`).",
            "",
        ]
    lines += [
        "## Citation",
        "",
        "The papers behind this family and its PE variants:",
        "",
        *_papers(fam),
        "",
        "```bibtex",
        "\n\n".join(entry for entry in (bibtex(ids) for ids in _paper_ids(fam)) if entry),
        "```",
        "",
        "---",
        f"Generated by `python -m visionpe.bench cards` on {time.strftime('%Y-%m-%d')} from the files "
        f"under results/; edits by hand are overwritten.",
        "",
    ]
    return "\n".join(lines)


def write_cards(
    results: str | Path = "results", out: str | Path = "model_cards", families: list[str] | None = None
) -> list[Path]:
    """Write one card per family; returns the paths."""
    results, out = Path(results), Path(out)
    unknown = [f for f in families or [] if f not in FAMILIES]
    if unknown:
        raise ValueError(
            f"unknown famil{'y' if len(unknown) == 1 else 'ies'} {unknown}; registered: {', '.join(FAMILIES)}"
        )
    speed, machines = load_speed(results)
    summaries = load_extrapolation(results)
    speed_files = load_speed_files(results)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fam in FAMILIES.items():
        if families and name not in families:
            continue
        path = out / f"{name}.md"
        path.write_text(family_card(fam, speed, machines, summaries, out, speed_files))
        paths.append(path)
    return paths


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
