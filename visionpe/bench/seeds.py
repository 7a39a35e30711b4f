"""Accuracy over seeds for models whose inputs the extrapolation benchmark does not take (video clips, image + text).

    visionpe-bench seeds -c video_shapes_vivit_n --models vivit_n_ape vivit_n_rope3d --seeds 0 1 --resolutions 24 32 48

Each (model, seed) is trained by the engine with the recipe (plus overrides) and its checkpoint evaluated at every
resolution with raw positions (the models' default). Each run's numbers go to `<out>/evals/<model>-s<seed>.json` as
soon as they exist, so a rerun continues where it stopped; `<out>/summary.json` (the extrapolation benchmark's
format, which `visionpe-bench cards` reads) and `<out>/results.md` are rewritten at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

from ..engine.checkpoint import atomic_write_text
from ..engine.config import config_to_dict, load_config
from .report import aggregate, long_rows

__all__ = ["run_seeds", "main"]


def _record(model: str, seed: int, seconds: float, rows: list[dict]) -> dict:
    flat = [
        dict(mode="extrapolate", height=r["resolution"], width=r["resolution"], **{k: r[k] for k in ("top1", "top5")})
        | dict(loss=r["loss"], images=r["images"])
        for r in rows
    ]
    return dict(model=model, seed=seed, train_seconds=round(seconds, 1), rows=flat)


def run_seeds(
    recipe: str,
    models: list[str],
    seeds: list[int],
    resolutions: list[int],
    name: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    out: str | Path | None = None,
    runs: str | Path | None = None,
) -> Path:
    """Train and evaluate every (model, seed); returns the summary path."""
    from ..engine import evaluate_checkpoint, train
    from .speed import machine_info

    base_cfg = load_config(recipe, list(overrides))
    name = name or Path(recipe).stem
    out = Path(out or f"results/{name}")
    runs = Path(runs or f"runs/bench/{name}")
    base = base_cfg.data.resolution
    resolutions = sorted({*resolutions, base})
    records, start = [], time.time()
    for model in models:
        for seed in seeds:
            path = out / "evals" / f"{model}-s{seed}.json"
            if path.is_file():
                records.append(json.loads(path.read_text()))
                continue
            extra = [f"model.name={model}", f"train.seed={seed}", f"train.output_dir={runs}"]
            extra += [f"train.run_name={model}-s{seed}", "train.progress=false"]
            cfg = load_config(recipe, [*overrides, *extra])
            run_dir = runs / f"{model}-s{seed}"
            t0 = time.time()
            run_dir = train(cfg, resume=run_dir if (run_dir / "config.yaml").is_file() else False)
            rows = evaluate_checkpoint(run_dir, resolutions)
            rec = _record(model, seed, time.time() - t0, rows)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(rec, indent=1) + "\n")
            records.append(rec)
    stats = aggregate(long_rows(records))
    table = []
    for (model, mode, size), st in sorted(stats.items()):
        ref = stats.get((model, mode, (base, base)))
        delta = st["mean"] - ref["mean"] if ref else None
        table.append(dict(model=model, pe=model.split("_", 2)[-1], mode=mode, height=size[0], width=size[1], **st))
        table[-1]["delta"] = delta
    machine = machine_info()
    machine["threads"] = base_cfg.train.threads or machine["threads"]
    summary = dict(
        name=name,
        dataset=base_cfg.data.name,
        base=[base, base],
        sizes=[[r, r] for r in resolutions],
        modes=["extrapolate"],
        seeds=sorted(seeds),
        models=list(models),
        recipe=dict(
            epochs=base_cfg.train.epochs,
            batch_size=base_cfg.data.batch_size,
            opt=base_cfg.optim.opt,
            lr=base_cfg.optim.lr,
            data_options=base_cfg.data.options,
        ),
        command=f"visionpe-bench seeds -c {recipe} --models {' '.join(models)} --seeds "
        f"{' '.join(map(str, seeds))} --resolutions {' '.join(map(str, resolutions))} --name {name}"
        + "".join(f" {o}" for o in overrides),
        modes_agree=[],
        machine=machine,
        seconds=round(time.time() - start, 1),
        date=time.strftime("%Y-%m-%d"),
        table=table,
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "bench.yaml", yaml.safe_dump(config_to_dict(base_cfg), sort_keys=False))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    lines = [
        f"# {name}: top-1 (%) over seeds {sorted(seeds)}, trained at {base} px",
        "",
        "| model | " + " | ".join(str(r) for r in resolutions) + " |",
        "|---|" + "---:|" * len(resolutions),
    ]
    for model in models:
        cells = []
        for r in resolutions:
            st = stats.get((model, "extrapolate", (r, r)))
            cells.append("-" if st is None else f"{st['mean']:.1f} ± {st['std']:.1f}")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    atomic_write_text(out / "results.md", "\n".join(lines) + "\n")
    return out / "summary.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="visionpe-bench seeds", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-c", "--config", required=True, help="training recipe: a file or a packaged name")
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--resolutions", nargs="+", type=int, required=True)
    ap.add_argument("--name", default=None, help="results/<name> and runs/bench/<name> (default: the recipe's name)")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    args = ap.parse_args(argv)
    try:
        path = run_seeds(args.config, args.models, args.seeds, args.resolutions, args.name, args.overrides)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
