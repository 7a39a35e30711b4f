"""Resolution extrapolation: train models with one recipe at a base resolution, evaluate them at other sizes.

    python -m visionpe.bench extrapolate -c configs/bench/quick.yaml [bench.seeds=0,1 train.epochs=2 ...]

A benchmark file is a training recipe for the engine (the sections of `train.py -c`: model, data, aug, optim, train,
eval) plus a `bench:` section naming the models, seeds, evaluation sizes and test-time position modes. Every (model,
seed) is trained by `visionpe.engine.train` into `<runs_dir>/<model>-s<seed>` and evaluated at every size in each
position mode: 'extrapolate' (raw patch indices at the new size) and 'interpolate' (positions rescaled to the training
grid, the counterpart of resampling an APE table). Each run's numbers go to `<output_dir>/evals/<model>-s<seed>.json`
as soon as they exist, so an interrupted benchmark reruns only what is missing: finished trainings are reused,
interrupted ones resume from their last checkpoint, evaluated sizes are kept. The tables and the plot
(results.csv, results.md, results.png, summary.json) are rewritten from those files at the end.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import torch
import yaml

from ..engine.checkpoint import atomic_write_text, find_checkpoint
from ..engine.config import Config, config_to_dict
from ..engine.setup import build_eval_sets, resolve_amp
from .evalsizes import SizedView, evaluate_size, modes_agree, size_label
from .plan import BenchConfig, Job, load_bench, make_plan, read_record, recipe_of, split_name, validate, write_record

__all__ = ["run_job", "run_benchmark", "main"]


def run_job(job: Job, log=print) -> dict:
    """Train (or resume, or reuse) one run, evaluate what its record lacks, and return the record."""
    from ..engine import load_checkpoint, train  # the engine's public API

    torch.set_num_threads(job.threads)
    record = read_record(job.record_path) if job.record_path.is_file() else None
    todo = job.missing(record)
    if not todo:
        return record
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
            run_dir=str(job.run_dir),
            rows=[],
        )
    ref = find_checkpoint(job.run_dir) if job.run_dir.is_dir() else None
    if ref is None or not (ref.info or {}).get("finished"):
        t0, c0 = time.perf_counter(), time.process_time()
        train(job.cfg, resume=ref is not None)
        record["train_seconds"] = round(time.perf_counter() - t0, 1) + (record.get("train_seconds") or 0)
        record["train_cpu_seconds"] = round(time.process_time() - c0, 1) + (record.get("train_cpu_seconds") or 0)
        record["resumed"] = ref is not None
    elif "train_seconds" not in record:
        record["train_seconds"] = None  # trained by an earlier benchmark whose record was removed
    model, cfg, meta = load_checkpoint(job.run_dir, device="cpu")
    record["params"] = sum(p.numel() for p in model.parameters())
    class_map = json.loads(meta["class_map"]) if meta.get("class_map") else None
    datasets = build_eval_sets(cfg, sorted({max(s) for s in job.sizes}), class_map)
    device = torch.device("cpu")
    amp = resolve_amp(cfg.train.amp, device)
    workers = cfg.data.workers

    probes = [max((s for s in job.sizes if s[0] == s[1]), key=max), *(s for s in job.sizes if s[0] != s[1])]
    record["modes_agree"] = all(
        modes_agree(model, torch.stack([SizedView(datasets[max(s)], s, 4)[i][0] for i in range(4)])) for s in probes
    )
    t0, c0 = time.perf_counter(), time.process_time()
    rows = {(r["mode"], r["height"], r["width"]): r for r in record["rows"]}
    for mode, size in todo:
        key = (mode, *size)
        first = job.modes[0]
        if record["modes_agree"] and mode != first and (first, *size) in rows:
            rows[key] = dict(rows[(first, *size)], mode=mode, same_as=first)
        else:
            result = evaluate_size(
                model, datasets[max(size)], size, mode, job.eval_samples, job.eval_batch_size, device, amp, workers
            )
            rows[key] = dict(mode=mode, height=size[0], width=size[1], **result)
        record["rows"] = [
            rows[k]
            for k in sorted(rows, key=lambda k: (job.modes.index(k[0]) if k[0] in job.modes else 99, k[1] * k[2], k[1]))
        ]
        write_record(job.record_path, record)
    record["eval_seconds"] = round(time.perf_counter() - t0, 1) + (record.get("eval_seconds") or 0)
    record["eval_cpu_seconds"] = round(time.process_time() - c0, 1) + (record.get("eval_cpu_seconds") or 0)
    write_record(job.record_path, record)
    return record


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)


def _quiet_job(job: Job) -> dict:
    """run_job in a worker process; the engine's per-epoch lines are kept, its progress bars are off."""
    return run_job(job)


# ---------------------------------------------------------------------------------------------------- benchmark


def _summary_line(record: dict, base: tuple[int, int], sizes: list[tuple[int, int]]) -> str:
    mode = record["rows"][0]["mode"] if record.get("rows") else "extrapolate"
    parts = []
    for s in (base, sizes[-1]) if len(sizes) > 1 else (base,):
        row = next((r for r in record["rows"] if r["mode"] == mode and (r["height"], r["width"]) == s), None)
        if row:
            parts.append(f"@{size_label(s)} {row['top1']:.1f}%")
    t = record.get("train_seconds")
    return f"{' '.join(parts)} ({mode}){f', trained in {t:.0f} s' if t else ''}"


def run_benchmark(bench: BenchConfig, cfg: Config, dry_run: bool = False, log=print) -> Path:
    """Check everything, run what is missing (in `bench.processes` processes), write the tables and the plot.
    Returns the output directory."""
    from .report import write_report

    plan = make_plan(bench, cfg)
    validate(plan)
    out = bench.out()
    records = {id(j): read_record(j.record_path) if j.record_path.is_file() else None for j in plan.jobs}
    pending = [j for j in plan.jobs if j.missing(records[id(j)])]
    log(
        f"benchmark {bench.name!r}: {len(bench.models)} models x {len(bench.seeds)} seeds = {len(plan.jobs)} runs, "
        f"{len(plan.jobs) - len(pending)} already done, {len(pending)} to run in {bench.processes} process(es) x "
        f"{bench.threads} thread(s); sizes {', '.join(size_label(s) for s in plan.sizes)}; modes "
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
        status = f"FAILED: {type(error).__name__}: {error}" if error else _summary_line(record, plan.base, plan.sizes)
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
                min(bench.processes, len(pending)), mp_context=ctx, initializer=_worker_init, initargs=(bench.threads,)
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
        "overrides",
        nargs="*",
        metavar="key=value",
        help="bench.* keys (e.g. bench.seeds=0 bench.models=vit_n_ape,vit_n_cpe) or recipe keys "
        "(e.g. train.epochs=1 data.options.num_train=500)",
    )
    args = ap.parse_args(argv)
    from ..engine.cli import USER_ERRORS, _fail

    try:
        bench, cfg = load_bench(args.config, args.overrides)
        run_benchmark(bench, cfg, dry_run=args.dry_run)
    except (*USER_ERRORS, RuntimeError) as e:
        return _fail(e)
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to continue where it stopped", file=sys.stderr)
        return 130
    return 0
