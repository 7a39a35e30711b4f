"""Segmentation: train a linear head on each model's last-block patch tokens end to end at the base canvas of a
segmentation set (e.g. clipart-scenes), then evaluate mIoU and pixel accuracy at other sizes (upsample: the same
scene at more pixels) and fields of view (fov: a larger canvas, more objects at the training scale), in each
test-time position mode (docs/benchmark.md).

    visionpe-bench segment -c clipart-seg [bench.seeds=0 train.epochs=2 ...]

The benchmark file is read as `visionpe-bench extrapolate` reads one (recipe + `bench:`); one JSON record per (model,
seed) under <output_dir>/evals, written after each point, and run checkpoints under <runs_dir>: a rerun reuses
finished runs and points and resumes a training from its last epoch.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn.functional as F
import yaml
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from torch.utils.data import DataLoader, Dataset

from ...data import build_dataset, get_dataset_info
from ...engine.checkpoint import (
    atomic_write_text,
    find_checkpoint,
    load_training_state,
    load_weights,
    write_checkpoint,
)
from ...engine.config import Config, config_to_dict
from ...engine.distributed import resolve_device
from ...engine.setup import autocast, build_model, resolve_amp
from ...engine.train_state import rng_state, set_rng_state
from ...models.seg_head import LinearSegmenter
from .. import protocols
from ..extrapolate import Job, Plan, bench_command, failed_runs, make_plan, read_record, validate, write_record
from ..jobs import run_stoppable, stopped_job
from ..protocols import Point, point_label, row_point
from ..settings import BenchConfig, BenchConfigError, load_bench
from .segment_report import write_seg_report

__all__ = ["confusion", "scores", "load_segment", "run_segment", "main"]


# ---------------------------------------------------------------------------------------------------- the metrics


def confusion(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[K, K] counts of (true class, predicted class) over every pixel (int64)."""
    idx = target.reshape(-1).long() * num_classes + pred.reshape(-1).long()
    return torch.bincount(idx, minlength=num_classes**2).reshape(num_classes, num_classes)


def scores(conf: torch.Tensor) -> dict:
    """{'miou', 'pixel_acc' (%), 'iou': per class (None: absent from both truth and prediction)} of a confusion
    matrix; the mean is over the classes present (background included)."""
    conf = conf.double()
    hit, truth, pred = conf.diag(), conf.sum(1), conf.sum(0)
    union = truth + pred - hit
    iou = [float(100 * h / u) if u > 0 else None for h, u in zip(hit, union)]
    present = [v for v in iou if v is not None]
    total = float(conf.sum())
    return dict(miou=sum(present) / len(present) if present else 0.0,
                pixel_acc=100 * float(hit.sum()) / total if total else 0.0, iou=iou)  # fmt: skip


# ---------------------------------------------------------------------------------------------- plan and checks


def load_segment(path, overrides=()) -> tuple[BenchConfig, Config]:
    """(bench section, recipe) of a segmentation benchmark file, checked: its dataset must label pixels."""
    bench, cfg = load_bench(path, overrides)
    kind = get_dataset_info(cfg.data.name).kind
    if kind != "segmentation":
        raise BenchConfigError(
            f"visionpe-bench segment trains on segmentation sets (e.g. data.name=clipart-scenes); {cfg.data.name!r} "
            f"is {kind!r}: use visionpe-bench extrapolate"
        )
    if bench.pretrained or bench.base_samples is not None:
        raise BenchConfigError("visionpe-bench segment trains every run: drop bench.pretrained and bench.base_samples")
    if cfg.optim.layer_decay:
        raise BenchConfigError("visionpe-bench segment has no layer-wise lr decay; drop optim.layer_decay")
    return bench, cfg


def build_set(cfg: Config, split: str, training: bool) -> Dataset:
    aug = {k: getattr(cfg.aug, k) for k in ("scale", "ratio", "hflip")}
    res = cfg.data.resolution
    return build_dataset(cfg.data.name, split, res, cfg.data.root, cfg.data.options, training=training, aug=aug)


def build_segmenter(cfg: Config, num_classes: int, in_chans: int = 3) -> LinearSegmenter:
    backbone = build_model(cfg, 0, in_chans)  # no classifier: the head reads the tokens
    return LinearSegmenter(backbone, num_classes, (cfg.data.resolution,) * 2)


class PointView(Dataset):
    """The first `limit` scenes (0: all) at one point: render(i, size) (upsample) or render_canvas(i, size) (fov)."""

    def __init__(self, dataset: Dataset, point: Point, limit: int = 0):
        self.dataset, self.point = dataset, point
        self.length = min(len(dataset), limit) if limit else len(dataset)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        p = self.point
        if p.protocol == "fov":
            return self.dataset.render_canvas(index, p.size)
        if p.height != p.width:
            raise ValueError(f"the upsample protocol draws square scenes; {point_label(p)} is not square (use fov)")
        return self.dataset.render(index, p.height)


@torch.no_grad()
def _check_models(plan: Plan) -> int:
    """Each model built and run on one scene at every point and mode (on CPU) before anything trains; returns the
    number of classes."""
    cfg = plan.cfg
    val = build_set(cfg, cfg.data.val_split, False)
    num_classes = int(val.num_classes)
    for name in plan.bench.models:
        job = next(j for j in plan.jobs if j.model == name)
        try:
            model = build_segmenter(job.cfg, num_classes, get_dataset_info(cfg.data.name).in_chans).eval()
        except (TypeError, ValueError, RuntimeError) as e:
            raise BenchConfigError(f"model {name!r} cannot segment {cfg.data.name!r}: {e}") from None
        for point in plan.points:
            try:
                x, _ = PointView(val, point)[0]
            except ValueError as e:
                raise BenchConfigError(f"cannot evaluate at {point_label(point)}: {e}") from None
            for mode in plan.bench.position_modes[: None if protocols.has_position_modes(model) else 1]:
                try:
                    protocols.set_position_mode(model, mode)
                    out = model(x[None])
                except ValueError as e:
                    raise BenchConfigError(f"bench.position_modes: model {name!r} {e}") from None
                except (RuntimeError, TypeError, AssertionError) as e:
                    raise BenchConfigError(
                        f"model {name!r} cannot take {point_label(point)} px in {mode} mode: {e}; drop that size "
                        f"from bench.resolutions / bench.shapes"
                    ) from None
                if out.shape[-2:] != x.shape[-2:]:
                    raise BenchConfigError(f"model {name!r} returned {tuple(out.shape)} for {tuple(x.shape)}")
    return num_classes


# ------------------------------------------------------------------------------------------------------- training


def _train(job: Job, model: LinearSegmenter, device, stop) -> dict:
    """Train (or resume) the job's run to the end; returns its finished checkpoint's info. Checkpoints at each epoch
    end; a stop signal ends it at the next step (the last epoch's checkpoint is kept, a rerun resumes there)."""
    cfg, run_dir = job.cfg, job.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    train_set = build_set(cfg, cfg.data.train_split, True)
    o = cfg.optim
    extra = {k: v for k, v in (("betas", tuple(o.betas) if o.betas else None), ("eps", o.eps)) if v is not None}
    optimizer = create_optimizer_v2(model, o.opt, lr=o.lr, weight_decay=o.weight_decay, momentum=o.momentum, **extra)
    steps = len(train_set) // cfg.data.batch_size
    if steps < 1:
        raise BenchConfigError(f"data.batch_size={cfg.data.batch_size} is larger than the {len(train_set)} training "
                               f"scenes (data.options.num_train)")  # fmt: skip
    if cfg.train.max_steps_per_epoch:
        steps = min(steps, cfg.train.max_steps_per_epoch)
    scheduler = None
    if o.sched != "none":
        scheduler, _ = create_scheduler_v2(
            optimizer, o.sched, num_epochs=cfg.train.epochs, warmup_epochs=o.warmup_epochs, warmup_lr=o.warmup_lr,
            min_lr=o.min_lr, cooldown_epochs=o.cooldown_epochs, step_on_epochs=False, updates_per_epoch=steps,
        )  # fmt: skip
    amp = resolve_amp(cfg.train.amp, device)
    ref = find_checkpoint(run_dir)
    start, info = 0, dict(seconds=0.0, cpu_seconds=0.0)
    if ref is not None:  # resume at the epoch after the last one saved
        state = load_training_state(ref.state)
        model.load_state_dict(load_weights(ref.weights)[0])
        optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        start, info = int(ref.info["epoch"]) + 1, dict(ref.info)
    else:
        torch.manual_seed(cfg.train.seed)
    model.to(device).train()
    t0, c0 = time.perf_counter(), time.process_time()
    for epoch in range(start, cfg.train.epochs):
        gen = torch.Generator().manual_seed(cfg.train.seed * 100_003 + epoch)
        loader = DataLoader(train_set, batch_size=cfg.data.batch_size, shuffle=True, drop_last=True, generator=gen,
                            num_workers=cfg.data.workers)  # fmt: skip
        for step, (x, y) in enumerate(loader):
            if step >= steps:
                break
            if stop is not None and stop.signum:
                raise stopped_job(stop.signum, f" while training {job.label} (epoch {epoch + 1})")
            with autocast(device, amp):
                logits = model(x.to(device))
            loss = F.cross_entropy(logits.float(), y.to(device), label_smoothing=cfg.aug.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if o.clip_grad:
                torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_grad)
            optimizer.step()
            if scheduler is not None:
                scheduler.step_update(num_updates=epoch * steps + step + 1)
        info = dict(epoch=epoch, finished=epoch + 1 == cfg.train.epochs, loss=loss.item(),
                    seconds=info["seconds"] + time.perf_counter() - t0,
                    cpu_seconds=info["cpu_seconds"] + time.process_time() - c0)  # fmt: skip
        t0, c0 = time.perf_counter(), time.process_time()
        weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        state = dict(optimizer=optimizer.state_dict(), rng=rng_state())
        write_checkpoint(run_dir, f"epoch{epoch + 1}", weights, {"model": cfg.model.name}, state, info=info)
    return info


def _trained(job: Job, record: dict, num_classes: int, in_chans: int, stop) -> LinearSegmenter:
    """The job's model, trained, resumed or reused (a finished run is only loaded)."""
    model = build_segmenter(job.cfg, num_classes, in_chans)
    ref = find_checkpoint(job.run_dir) if job.run_dir.is_dir() else None
    if ref is None or not (ref.info or {}).get("finished"):
        record["resumed"] = ref is not None
        info = _train(job, model, resolve_device(job.cfg.train.device), stop)
    else:
        weights, _ = load_weights(ref.weights)
        model.load_state_dict(weights)
        info = ref.info
    record["train_seconds"] = round(info["seconds"], 1)
    record["train_cpu_seconds"] = round(info["cpu_seconds"], 1)
    record["train_loss"] = info.get("loss")
    return model


# ----------------------------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate_point(model, dataset, point: Point, mode: str, limit: int, batch_size: int, device, amp,
                   workers: int = 0) -> dict:  # fmt: skip
    """{'miou', 'pixel_acc', 'iou', 'images'} of `model` on the scenes of one point in position `mode`."""
    protocols.set_position_mode(model, mode)
    model.eval()
    k = int(dataset.num_classes)
    conf, images = torch.zeros(k, k, dtype=torch.int64), 0
    for x, y in DataLoader(PointView(dataset, point, limit), batch_size=batch_size, num_workers=workers):
        with autocast(device, amp):
            logits = model(x.to(device))
        conf += confusion(logits.argmax(1).cpu(), y, k)
        images += len(x)
    return dict(**scores(conf), images=images)


def _modes_agree(job: Job, model, dataset, device) -> bool:
    """Whether all modes give the same logits at each protocol's largest point (4 scenes)."""
    points = job.plan.points
    probes = [max((p for p in points if p.protocol == k), key=lambda p: p.height * p.width)
              for k in dict.fromkeys(p.protocol for p in points)]  # fmt: skip
    for p in probes:
        x = torch.stack([PointView(dataset, p)[i][0] for i in range(min(4, len(dataset)))]).to(device)
        if not protocols.modes_agree(model, x, job.modes):
            return False
    return True


def _same_as(job: Job, rows: dict, agree: bool, mode: str, point: Point) -> tuple[dict, str] | None:
    """A row measured on identical inputs and logits: the first mode's (modes agree), or at the training size the
    upsample protocol's (fov at the base canvas draws the same scenes)."""
    first = job.modes[0]
    if agree and mode != first and (first, point) in rows:
        return rows[(first, point)], first
    up = Point("upsample", *job.plan.base)
    if point.protocol == "fov" and point.size == job.plan.base and (mode, up) in rows:
        return rows[(mode, up)], "upsample"
    return None


def run_seg_job(job: Job, stop=None) -> dict:
    """Train (or resume, or reuse) one run and evaluate what its record lacks, writing the record after each
    point; returns the record."""
    bench = job.plan.bench
    torch.set_num_threads(bench.threads)
    record = job.record()
    if job.done(record):
        return record
    if stop is not None and stop.signum:
        raise stopped_job(stop.signum, f" before {job.label}")
    cfg = job.cfg
    val = build_set(cfg, cfg.data.val_split, False)
    model = _trained(job, record, int(val.num_classes), get_dataset_info(cfg.data.name).in_chans, stop)
    device = torch.device(bench.device)
    model.eval().to(device)
    record["params"] = sum(p.numel() for p in model.parameters())
    record["classes"] = list(val.classes)
    record["modes_agree"] = len(job.modes) > 1 and _modes_agree(job, model, val, device)
    amp = resolve_amp(cfg.train.amp, device)
    rows = {(r["mode"], row_point(r)): r for r in record["rows"]}
    t0, c0 = time.perf_counter(), time.process_time()
    for mode, point in job.missing(record):
        if stop is not None and stop.signum:
            raise stopped_job(stop.signum, f" during the evaluation of {job.label}")
        fields = dict(protocol=point.protocol, mode=mode, height=point.height, width=point.width, frames=0)
        same = _same_as(job, rows, record["modes_agree"], mode, point)
        if same is not None:
            rows[(mode, point)] = dict(same[0], **fields, same_as=same[1])
        else:
            found = evaluate_point(model, val, point, mode, bench.eval_samples, bench.eval_batch_size, device, amp,
                                   cfg.data.workers)  # fmt: skip
            rows[(mode, point)] = dict(**fields, **found)
        order = {p: i for i, p in enumerate(job.plan.points)}
        record["rows"] = [rows[k] for k in sorted(rows, key=lambda k: (job.modes.index(k[0]), order[k[1]]))]
        write_record(job.record_path, record)
    record["eval_seconds"] = round(time.perf_counter() - t0, 1) + (record.get("eval_seconds") or 0)
    record["eval_cpu_seconds"] = round(time.process_time() - c0, 1) + (record.get("eval_cpu_seconds") or 0)
    write_record(job.record_path, record)
    return record


# ------------------------------------------------------------------------------------------------------ the command


def run_segment(bench: BenchConfig, cfg: Config, dry_run: bool = False, log=print):
    """Check everything, run what is missing, write results.md and summary.json; returns the output folder."""
    plan = make_plan(bench, cfg)
    validate(plan, check_models=False)  # records or runs of another recipe are never mixed in
    _check_models(plan)
    out = bench.out()
    pending = [j for j in plan.jobs if not j.done(j.record())]
    log(f"segmentation benchmark {bench.name!r}: {len(bench.models)} models x {len(bench.seeds)} seeds = "
        f"{len(plan.jobs)} runs, {len(plan.jobs) - len(pending)} already done, {len(pending)} to run; points "
        f"{', '.join(point_label(p) for p in plan.points)}; modes {', '.join(bench.position_modes)}; results in "
        f"{out}, checkpoints in {bench.runs()}")  # fmt: skip
    if dry_run:
        return out
    out.mkdir(parents=True, exist_ok=True)
    snapshot = dict(bench=dataclasses.asdict(bench), **config_to_dict(cfg))
    atomic_write_text(out / "bench.yaml", yaml.safe_dump(snapshot, sort_keys=False))
    start, failures, done = time.perf_counter(), [], [0]

    def progress(job: Job, record: dict | None, error: BaseException | None) -> None:
        done[0] += 1
        if error is not None:
            failures.append(f"{job.label}: {type(error).__name__}: {error}")
            status = f"FAILED: {type(error).__name__}: {error}"
        else:
            first = record["rows"][0] if record.get("rows") else {}
            status = f"mIoU {first.get('miou', float('nan')):.1f} at the training size"
        log(f"[{done[0]}/{len(pending)}] {job.label}: {status} | {(time.perf_counter() - start) / 60:.1f} min")

    try:
        run_stoppable(run_seg_job, pending, progress, bench.processes, bench.threads)
    finally:
        records = [read_record(j.record_path) for j in plan.jobs if j.record_path.is_file()]
        if records:
            paths = write_seg_report(records, plan, out, time.perf_counter() - start)
            log(f"wrote {', '.join(str(p) for p in paths)}")
    if failures:
        raise failed_runs(failures)
    return out


def _run(args) -> None:
    run_segment(*load_segment(args.config, args.overrides), dry_run=args.dry_run)


def main(argv: list[str] | None = None) -> int:
    return bench_command("visionpe-bench segment", "clipart-seg", argv, _run, "finished epochs and evaluated points")
