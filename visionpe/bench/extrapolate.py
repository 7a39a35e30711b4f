"""Extrapolation: train models with one recipe at a base resolution (and clip length), evaluate them elsewhere.

    python -m visionpe.bench extrapolate -c configs/bench/quick.yaml [bench.seeds=0,1 train.epochs=2 ...]
    python -m visionpe.bench extrapolate --pretrained -c configs/bench/imagenet-pretrained.yaml data.root=...

A benchmark file is a training recipe for the engine (the sections of `train.py -c`: model, data, aug, optim, train,
eval) plus a `bench:` section naming the models, seeds, evaluation points and test-time position modes. Every (model,
seed) is trained by `visionpe.engine.train` into `<runs_dir>/<model>-s<seed>` (or, with --pretrained, its published
or saved weights are loaded and nothing is trained) and evaluated at every point of each protocol (upsample: the
image at another size; fov: a larger canvas with the content at its training scale; frames: other clip lengths) in
each position mode: 'extrapolate' (raw patch indices at the new size) and 'interpolate' (positions rescaled to the
training grid, the counterpart of resampling an APE table). Each run's numbers go to
`<output_dir>/evals/<model>-s<seed>.json` as soon as they exist, so an interrupted benchmark reruns only what is
missing: finished trainings are reused, interrupted ones resume from their last checkpoint, evaluated points are kept.
The tables, the orderings the papers claim and the plot (results.csv, results.md, results.png, summary.json) are
rewritten from those files at the end.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import torch
import yaml

from ..data import get_dataset_info
from ..engine.checkpoint import atomic_write_text, find_checkpoint
from ..engine.config import Config, config_to_dict
from ..engine.setup import build_eval_sets, resolve_amp, to_device
from .evalsizes import Point, evaluate_view, first_inputs, modes_agree, point_label
from .plan import (
    BenchConfig,
    Job,
    eval_split_classes,
    load_bench,
    make_plan,
    read_record,
    recipe_of,
    row_point,
    split_name,
    validate,
    view_of,
    write_record,
)

__all__ = ["run_job", "run_benchmark", "main"]


def _load_pretrained(job: Job, num_classes: int, in_chans: int):
    """(model, cfg) for pretrained mode: a visionpe run directory, a weights file through the model's pretrained
    filter (official/timm layouts convert), or timm's own pretrained weights."""
    from ..engine import load_checkpoint
    from ..engine.setup import build_model

    cfg = job.cfg
    source = job.checkpoint
    if source and Path(source).is_dir():
        model, cfg, _ = load_checkpoint(source, device="cpu")
        return model, cfg
    c = copy.deepcopy(cfg)
    overlay = dict(num_classes=num_classes)  # keep the checkpoint's head when it has the dataset's classes
    if source:
        overlay["file"] = str(source)
    c.model.kwargs = dict(c.model.kwargs, pretrained=True, pretrained_cfg_overlay=overlay)
    return build_model(c, num_classes, in_chans), cfg


def _trained_model(job: Job, record: dict):
    """Train (or resume, or reuse) the run of `job`; returns (model, cfg, class map)."""
    from ..engine import load_checkpoint, train  # the engine's public API

    ref = find_checkpoint(job.run_dir) if job.run_dir.is_dir() else None
    if ref is None or not (ref.info or {}).get("finished"):
        train(job.cfg, resume=ref is not None)
        record["resumed"] = ref is not None
        ref = find_checkpoint(job.run_dir)
    if "cpu_seconds" in (ref.info or {}):  # the run's own count, its interrupted attempts included (None: unknown)
        record["train_seconds"], record["train_cpu_seconds"] = ref.info["seconds"], ref.info["cpu_seconds"]
    elif "train_seconds" not in record:
        record["train_seconds"] = None  # trained by an earlier benchmark whose record was removed
    model, cfg, meta = load_checkpoint(job.run_dir, device="cpu")
    return model, cfg, json.loads(meta["class_map"]) if meta.get("class_map") else None


def _same_input(record_rows: dict, mode: str, point: Point, base: dict[str, Point]) -> dict | None:
    """A row already measured on identical inputs: at the base size every protocol shows the same images."""
    if point != base.get(point.protocol):
        return None
    for other in base.values():
        row = record_rows.get((mode, other))
        if other != point and row is not None and "same_as" not in row:
            return row
    return None


def run_job(job: Job, log=print) -> dict:
    """Train (or resume, or reuse) one run, or load pretrained weights; evaluate what its record lacks; return the
    record."""
    torch.set_num_threads(job.threads)
    record = read_record(job.record_path) if job.record_path.is_file() else None
    if job.done(record):
        return record
    todo = job.missing(record)
    if record is None or record.get("eval") != job.eval_key():
        family, size, pe = split_name(job.model)
        record = dict(
            model=job.model,
            family=family,
            size=size,
            pe=pe,
            seed=job.seed,
            recipe=recipe_of(job.cfg),
            eval=job.eval_key(),
            base=list(job.sizes[0]),
            base_frames=job.base_frames,
            run_dir=str(job.run_dir),
            rows=[],
        )
    info = get_dataset_info(job.cfg.data.name)
    if job.pretrained:
        num_classes, class_map = eval_split_classes(job.cfg, info, True)
        model, cfg = _load_pretrained(job, num_classes, info.in_chans)
        record["pretrained"] = job.checkpoint or "timm"
        record.pop("run_dir", None)
    else:
        model, cfg, class_map = _trained_model(job, record)
    device = torch.device(job.device)
    model.eval().to(device)
    record["params"] = sum(p.numel() for p in model.parameters())
    base = tuple(job.sizes[0])
    datasets = build_eval_sets(cfg, sorted({max(s) for s in job.sizes}), class_map)
    amp = resolve_amp(cfg.train.amp, device)
    workers = cfg.data.workers
    protocols = list(dict.fromkeys(p.protocol for p in job.points))
    base_points = {pr: next(p for p in job.points if p.protocol == pr) for pr in protocols}
    probes = [
        max((p for p in job.points if p.protocol == pr), key=lambda p: (p.frames, p.height * p.width))
        for pr in protocols
    ]
    probes += [p for p in job.points if p.height != p.width and p not in probes]
    record["modes_agree"] = all(
        modes_agree(model, to_device(first_inputs(view_of(datasets, p, base, 4), 4), device)) for p in probes
    )
    t0, c0 = time.perf_counter(), time.process_time()
    rows = {(r["mode"], row_point(r)): r for r in record["rows"]}
    first = job.modes[0]
    for mode, point in todo:
        key = (mode, point)
        fields = dict(protocol=point.protocol, mode=mode, height=point.height, width=point.width, frames=point.frames)
        same = _same_input(rows, mode, point, base_points)
        if record["modes_agree"] and mode != first and (first, point) in rows:
            rows[key] = dict(rows[(first, point)], mode=mode, same_as=first)
        elif same is not None:
            rows[key] = dict(same, **fields, same_as=same["protocol"])
        else:
            view = view_of(datasets, point, base, job.eval_samples)
            result = evaluate_view(model, view, mode, job.eval_batch_size, device, amp, workers)
            rows[key] = dict(**fields, **result)
        order = {p: i for i, p in enumerate(job.points)}
        record["rows"] = [
            rows[k]
            for k in sorted(
                rows, key=lambda k: (job.modes.index(k[0]) if k[0] in job.modes else 99, order.get(k[1], 10**6))
            )
        ]
        write_record(job.record_path, record)
    if job.needs_base_check(record):  # the training point on more items: its accuracy with a smaller sampling error
        whole = datasets  # the tables' sets hold the whole split unless num_val cut it
        if "num_val" in cfg.data.options:
            cut = copy.deepcopy(cfg)
            cut.data.options = {k: v for k, v in cfg.data.options.items() if k != "num_val"}
            whole = build_eval_sets(cut, [max(base)], class_map)
        view = view_of(whole, base_points[protocols[0]], base, job.base_samples)
        result = evaluate_view(model, view, first, job.eval_batch_size, device, amp, workers)
        record["base_check"] = dict(samples=job.base_samples, mode=first, **result)
    record["eval_seconds"] = round(time.perf_counter() - t0, 1) + (record.get("eval_seconds") or 0)
    record["eval_cpu_seconds"] = round(time.process_time() - c0, 1) + (record.get("eval_cpu_seconds") or 0)
    write_record(job.record_path, record)
    return record


def _worker_init(threads: int, parent: int) -> None:
    torch.set_num_threads(threads)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """Stop this worker once the benchmark process that started it is gone (killed, say): an orphaned worker would
    go on training its run and write into a runs folder the user may have moved or reused since."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    os._exit(1)


def _quiet_job(job: Job) -> dict:
    """run_job in a worker process; the engine's per-epoch lines are kept, its progress bars are off."""
    return run_job(job)


# ---------------------------------------------------------------------------------------------------- benchmark


def _summary_line(record: dict, points: list[Point]) -> str:
    mode = record["rows"][0]["mode"] if record.get("rows") else "extrapolate"
    rows = {(r["mode"], row_point(r)): r for r in record.get("rows", [])}
    shown = [points[0]] + [
        [p for p in points if p.protocol == pr][-1] for pr in dict.fromkeys(p.protocol for p in points)
    ]
    parts = [f"{point_label(p)} {rows[(mode, p)]['top1']:.1f}%" for p in dict.fromkeys(shown) if (mode, p) in rows]
    t = record.get("train_seconds")
    return f"{', '.join(parts)} ({mode}){f', trained in {t:.0f} s' if t else ''}"


def run_benchmark(bench: BenchConfig, cfg: Config, dry_run: bool = False, log=print) -> Path:
    """Check everything, run what is missing (in `bench.processes` processes), write the tables and the plot.
    Returns the output directory."""
    from .report import write_report

    plan = make_plan(bench, cfg)
    validate(plan)
    out = bench.out()
    records = {id(j): read_record(j.record_path) if j.record_path.is_file() else None for j in plan.jobs}
    pending = [j for j in plan.jobs if not j.done(records[id(j)])]
    log(
        f"benchmark {bench.name!r}: {len(bench.models)} models x {len(bench.seeds)} seeds = {len(plan.jobs)} runs, "
        f"{len(plan.jobs) - len(pending)} already done, {len(pending)} to run in {bench.processes} process(es) x "
        f"{bench.threads} thread(s); points {', '.join(point_label(p) for p in plan.points)}; modes "
        f"{', '.join(bench.position_modes)}; results in {out}, checkpoints in {bench.runs()}"
    )
    for note in plan.notes:
        log(f"note: {note}")
    if dry_run:
        return out
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        out / "bench.yaml",
        yaml.safe_dump(dict(bench=dataclasses.asdict(bench), **config_to_dict(cfg)), sort_keys=False),
    )
    failures: list[str] = []
    t_start = time.perf_counter()
    done = 0

    def report(job: Job, record: dict | None, error: BaseException | None) -> None:
        nonlocal done
        done += 1
        elapsed = time.perf_counter() - t_start
        eta = elapsed / done * (len(pending) - done)
        status = f"FAILED: {type(error).__name__}: {error}" if error else _summary_line(record, plan.points)
        log(f"[{done}/{len(pending)}] {job.label}: {status} | {elapsed / 60:.1f} min elapsed, ~{eta / 60:.1f} min left")
        if error:
            failures.append(f"{job.label}: {type(error).__name__}: {error}")

    try:
        if bench.processes == 1 or len(pending) <= 1:
            for job in pending:
                try:
                    record = run_job(job, log)
                except (KeyboardInterrupt, SystemExit):
                    raise
                except Exception as e:  # one failed run does not lose the others; reported at the end
                    if os.environ.get("VISIONPE_DEBUG"):
                        raise
                    report(job, None, e)
                else:
                    report(job, record, None)
        else:
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(
                min(bench.processes, len(pending)),
                mp_context=ctx,
                initializer=_worker_init,
                initargs=(bench.threads, os.getpid()),
            ) as pool:
                futures = {pool.submit(_quiet_job, job): job for job in pending}
                remaining = set(futures)
                while remaining:
                    finished, remaining = wait(remaining, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        err = fut.exception()
                        report(futures[fut], None if err else fut.result(), err)
    finally:
        records = [read_record(j.record_path) for j in plan.jobs if j.record_path.is_file()]
        if records:
            paths = write_report(records, plan, out, time.perf_counter() - t_start)
            log(f"wrote {', '.join(str(p) for p in paths)}")
    if failures:
        raise RuntimeError(
            f"{len(failures)} run(s) failed (the others are kept; rerun to retry only these):\n  "
            + "\n  ".join(failures)
        )
    return out


def _keys_help() -> str:
    lines = ["bench keys (default, then help):"]
    for f in dataclasses.fields(BenchConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        lines.append(f"  bench.{f.name} = {default}\n      {f.metadata['help']}")
    return "\n".join(lines) + "\n\nthe other sections are train.py's recipe keys (python train.py --help)"


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="visionpe-bench extrapolate",
        description=__doc__,
        epilog=_keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("-c", "--config", required=True, help="benchmark file, e.g. configs/bench/quick.yaml")
    ap.add_argument("--dry-run", action="store_true", help="check the benchmark and print the plan; train nothing")
    ap.add_argument(
        "--pretrained",
        action="store_true",
        help="evaluate pretrained weights without training (same as bench.pretrained=true; weights from "
        "bench.checkpoints or timm)",
    )
    ap.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="bench.* keys (e.g. bench.seeds=0 bench.models=vit_n_ape,vit_n_cpe) or recipe keys "
        "(e.g. train.epochs=1 data.options.num_train=500)",
    )
    args = ap.parse_args(argv)
    from ..engine.cli import USER_ERRORS, user_error

    try:
        overrides = [*args.overrides, *(["bench.pretrained=true"] if args.pretrained else [])]
        bench, cfg = load_bench(args.config, overrides)
        run_benchmark(bench, cfg, dry_run=args.dry_run)
    except (*USER_ERRORS, RuntimeError) as e:
        return user_error(e)
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to continue where it stopped", file=sys.stderr)
        return 130
    return 0
