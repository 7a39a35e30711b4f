"""Extrapolation: train models with one recipe at a base size (and clip length, or token budget), evaluate them at
other sizes, fields of view, clip lengths, token budgets and aspect ratios in each test-time position mode
(docs/benchmark.md).

    python -m visionpe.bench extrapolate -c configs/bench/quick.yaml [bench.seeds=0,1 train.epochs=2 ...]
    python -m visionpe.bench extrapolate --pretrained -c configs/bench/imagenet-pretrained.yaml data.root=...
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import hashlib
import inspect
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from .. import engine
from ..data import dataset_num_classes, get_dataset_info
from ..engine.changes import changed_keys, flatten, recipe_of
from ..engine.checkpoint import atomic_write_text, find_checkpoint, read_pointer
from ..engine.cli import USER_ERRORS, user_error
from ..engine.config import Config, config_to_dict, format_config_help, native_settings
from ..engine.interrupt import TrainingInterrupted
from ..engine.metrics_log import METRICS
from ..engine.native_train import model_patch_size
from ..engine.setup import build_eval_sets, build_model, build_split, forward_on, resolve_amp, to_device
from ..engine.sharded_checkpoint import SHARDED_SUFFIX, is_sharded_run
from ..engine.trainer import resolve_run_dir
from ..models.flexi_patch import flexi_patch_refusal
from ..zoo.registry import name_parts
from . import protocols
from .jobs import JobStopped, run_stoppable, stopped_job
from .protocols import CLIP_PROTOCOLS, Point, point_label, row_point
from .report import base_point, undecided_models, write_report
from .settings import BenchConfig, BenchConfigError, load_bench, parse_aspect, parse_size


@dataclass
class Job:
    """One (model, seed) of a plan: its training config and its record."""

    model: str
    seed: int
    cfg: Config
    plan: Plan = field(repr=False, compare=False)

    @property
    def run_dir(self) -> Path:
        return resolve_run_dir(self.cfg)

    @property
    def record_path(self) -> Path:
        return self.plan.bench.out() / "evals" / f"{self.model}-s{self.seed}.json"

    @property
    def label(self) -> str:
        return f"{self.model} seed {self.seed}"

    @property
    def modes(self) -> list[str]:
        return list(self.plan.bench.position_modes)

    def eval_key(self) -> dict:
        """What the record's rows are of: the split and count evaluated, and for pretrained weights which weights
        (other weights for the same model are a new record, not 'already done')."""
        key = dict(split=self.cfg.data.val_split, samples=self.plan.bench.eval_samples)
        if self.plan.bench.pretrained:
            key["weights"] = weights_identity(self.plan.bench.checkpoints.get(self.model))
        return key

    def record(self) -> dict:
        """The run's record, or a new one when it has none or was evaluated otherwise (another split or count)."""
        record = read_record(self.record_path) if self.record_path.is_file() else None
        if record and record.get("eval") == self.eval_key():
            return record
        family, size, pe = name_parts(self.model)
        return dict(model=self.model, family=family, size=size, pe=pe, seed=self.seed, recipe=recipe_of(self.cfg),
                    eval=self.eval_key(), base=list(self.plan.base), base_frames=self.plan.base_frames,
                    run_dir=str(self.run_dir), rows=[])  # fmt: skip

    def missing(self, record: dict) -> list[tuple[str, Point]]:
        """(mode, point) pairs the record lacks."""
        have = {(r["mode"], row_point(r)) for r in record["rows"]}
        return [(m, p) for m in self.modes for p in self.plan.points if (m, p) not in have]

    def needs_base_check(self, record: dict) -> bool:
        """Whether the training point still has to be evaluated on bench.base_samples items."""
        samples = self.plan.bench.base_samples
        return samples is not None and (record.get("base_check") or {}).get("samples") != samples

    def done(self, record: dict) -> bool:
        return not self.missing(record) and not self.needs_base_check(record)


@dataclass
class Plan:
    """The runs of a benchmark and its evaluation points, per protocol its base first."""

    bench: BenchConfig
    cfg: Config
    sizes: list[tuple[int, int]]  # every evaluated size, the base first
    points: list[Point]
    base_frames: int  # the training clip length (0: images)
    base_tokens: int  # the training budget per image of a data.native recipe
    jobs: list[Job] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what validation noticed (e.g. sizes that need padding)

    @property
    def base(self) -> tuple[int, int]:
        return self.sizes[0]

    def base_point(self, protocol: str) -> Point:
        return base_point(dict(base=self.base, base_frames=self.base_frames, base_tokens=self.base_tokens), protocol)


def _option_default(cfg: Config, key: str) -> int:
    """A dataset option's value: the recipe's, else the factory's default (0 when it has none)."""
    if key in cfg.data.options:
        return int(cfg.data.options[key])
    param = inspect.signature(get_dataset_info(cfg.data.name).factory).parameters.get(key)
    return int(param.default) if param is not None and isinstance(param.default, int) else 0


def _job_cfg(cfg: Config, bench: BenchConfig, model: str, seed: int) -> Config:
    c = copy.deepcopy(cfg)
    c.model.name = model
    c.model.kwargs = {**c.model.kwargs, **(bench.model_kwargs.get(model) or {})}
    c.train.seed = seed
    c.train.output_dir, c.train.run_name = str(bench.runs()), f"{model}-s{seed}"
    c.train.threads = bench.threads
    c.train.progress = c.train.progress and bench.processes == 1
    c.eval.resolutions = [cfg.data.resolution]
    c.eval.every_epochs = 1  # the base size after every epoch: the training curve the record keeps
    return c


def make_plan(bench: BenchConfig, cfg: Config) -> Plan:
    """The evaluation points, per protocol its training point first, and one job per model and seed (published
    weights: one run)."""
    base = (cfg.data.resolution, cfg.data.resolution)
    sizes = list(dict.fromkeys([base, *map(parse_size, bench.resolutions + bench.shapes)]))
    frames = _option_default(cfg, "frames")
    native = native_settings(cfg)  # the training budget per image: the largest of data.native.seq_lens
    tokens = 0 if native is None else max(native.seq_lens) if native.seq_lens else native.max_tokens
    if "native" in bench.protocols and not tokens:
        raise BenchConfigError("the native protocol evaluates token budgets; the recipe needs data.native settings")
    points = []
    for protocol in bench.protocols:
        if protocol == "native":
            aspects = [Point("native", *parse_aspect(a), 0, tokens) for a in bench.aspects]
            points += dict.fromkeys([Point("native", 0, 0, 0, t) for t in [tokens, *bench.tokens]] + aspects)
        elif protocol == "patch":  # the base pixels at the model's own patch, then at each listed one
            points += [Point("patch", *base, 0, 0, p) for p in dict.fromkeys([0, *bench.patch_sizes])]
        elif protocol in CLIP_PROTOCOLS:
            points += [Point(protocol, *base, f) for f in dict.fromkeys([frames, *bench.frames])]
        else:
            points += [Point(protocol, *s, 0) for s in sizes]
    plan = Plan(bench, cfg, sizes, points, frames, tokens)
    seeds = [0] if bench.pretrained else bench.seeds
    plan.jobs = [Job(m, s, _job_cfg(cfg, bench, m, s), plan) for m in bench.models for s in seeds]
    plan.jobs += extra_jobs(plan)
    return plan


def extra_jobs(plan: Plan) -> list[Job]:
    """bench.extra_seeds for the models of the comparisons within noise, once every run of bench.seeds is done
    (none before: the choice reads those runs only, so it is the same on every rerun)."""
    if not plan.bench.extra_seeds or not all(j.done(j.record()) for j in plan.jobs):
        return []
    records = [read_record(j.record_path) for j in plan.jobs]
    b = plan.bench
    return [
        Job(m, s, _job_cfg(plan.cfg, b, m, s), plan) for m in undecided_models(records, plan) for s in b.extra_seeds
    ]


def validate(plan: Plan, check_models: bool = True) -> None:
    """The checks that read the runs and build the models (load_bench checked the settings), raising an error that
    names the fix: results or runs left by a benchmark with another recipe are never mixed in (nor overwritten)."""
    for job in [] if plan.bench.pretrained else plan.jobs:
        theirs, where = None, job.record_path
        if job.record_path.is_file():
            theirs = read_record(job.record_path).get("recipe")
        elif (job.run_dir / "config.yaml").is_file():
            theirs, where = yaml.safe_load((job.run_dir / "config.yaml").read_text()), job.run_dir
        changed = {} if theirs is None else changed_keys(flatten(recipe_of(theirs)), flatten(recipe_of(job.cfg)))
        if changed:
            diff = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in list(changed.items())[:4])
            raise BenchConfigError(
                f"{where} was made with another recipe ({diff}); keep it and write elsewhere with "
                f"bench.name=<new name> (or bench.output_dir=... bench.runs_dir=...), or delete it to redo the run"
            )
    if check_models:
        _check_models(plan, get_dataset_info(plan.cfg.data.name))


def eval_split_classes(cfg: Config, info, pretrained: bool) -> tuple[int, dict | None]:
    """(number of classes, class map) of the training split, or of the evaluation split for pretrained weights."""
    split = cfg.data.val_split if pretrained else cfg.data.train_split
    ds = build_split(cfg, split, cfg.data.resolution, training=not pretrained)
    return dataset_num_classes(info, ds), getattr(ds, "class_to_idx", None)


@torch.no_grad()
def _check_models(plan: Plan, info) -> None:
    """Each model built and run on one item at every point and mode (on CPU), before anything trains; a note for
    the sizes a model zero-pads to its patch."""
    cfg = plan.cfg
    num_classes, class_map = eval_split_classes(cfg, info, plan.bench.pretrained)
    evals = build_eval_sets(cfg, sorted({max(s) for s in plan.sizes}), class_map)
    amp = resolve_amp(cfg.train.amp, torch.device("cpu"))
    for job in (next(j for j in plan.jobs if j.model == name) for name in plan.bench.models):
        try:
            model = build_model(copy.deepcopy(job.cfg), num_classes, info.in_chans).eval()
        except (TypeError, ValueError, RuntimeError) as e:
            raise BenchConfigError(f"model {job.model!r} cannot be built for {cfg.data.name!r}: {e}") from None
        why = flexi_patch_refusal(model) if "patch" in plan.bench.protocols else None
        if why:
            raise BenchConfigError(f"the patch protocol cannot evaluate {job.model!r} at another patch size: {why}")
        patch = model_patch_size(model)
        odd = [p for p in plan.points if patch and p.protocol != "native" and (p.height % patch or p.width % patch)]
        if odd:
            plan.notes.append(f"{job.model}: {', '.join(sorted({point_label(p) for p in odd}))} are not multiples of "
                              f"its {patch} px patch; the model zero-pads them at the bottom/right, which costs "
                              f"accuracy of its own")  # fmt: skip
        for point in plan.points:
            try:
                x = protocols.first_inputs(protocols.view_of(evals, point, plan.base, 1, patch), 1)
            except ValueError as e:
                raise BenchConfigError(f"cannot evaluate at {point_label(point)}: {e}") from None
            for mode in plan.bench.position_modes[: None if protocols.has_position_modes(model) else 1]:
                try:
                    protocols.set_position_mode(model, mode)
                except ValueError as e:
                    raise BenchConfigError(f"bench.position_modes: model {job.model!r} {e}") from None
                try:
                    out = forward_on(model, x, torch.device("cpu"), amp)
                except (RuntimeError, ValueError, TypeError, AssertionError) as e:
                    unit = "" if point.protocol in (*CLIP_PROTOCOLS, "native") else " px"
                    raise BenchConfigError(
                        f"model {job.model!r} cannot take {point_label(point)}{unit} in {mode} mode: "
                        f"{e}; drop that size from bench.resolutions / bench.shapes / bench.frames"
                    ) from None
                if out.shape != (1, num_classes):
                    raise BenchConfigError(f"model {job.model!r} returned {tuple(out.shape)}, not [1, {num_classes}]; "
                                           f"the benchmark evaluates classifiers")  # fmt: skip


_DIGESTS: dict[tuple, str] = {}  # (path, size, mtime) -> content hash: each weights file is read once per process


def _file_digest(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        _DIGESTS[key] = f"sha256:{h.hexdigest()[:24]}"
    return _DIGESTS[key]


def weights_identity(source: str | None) -> str:
    """Which weights a pretrained job evaluates: 'timm' (timm's own), else a hash of the weights file's content (for
    a run directory, of its latest weights; a sharded checkpoint by its files' names, sizes and times)."""
    if not source:
        return "timm"
    path = Path(source)
    if path.is_dir() and is_sharded_run(path):
        folder = path if path.name.endswith(SHARDED_SUFFIX) else path / str((read_pointer(path) or {}).get("sharded"))
        stats = sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                       for p in folder.rglob("*") if p.is_file())  # fmt: skip
        return "stat:" + hashlib.sha256(repr((folder.name, stats)).encode()).hexdigest()[:24]
    ref = find_checkpoint(path) if path.is_dir() else None
    if path.is_dir() and ref is None:
        raise BenchConfigError(f"{source} has no checkpoint yet (no {source}/checkpoint.json)")
    return _file_digest(ref.weights if ref is not None else path)


def read_record(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BenchConfigError(f"{path} is unreadable ({e}); delete it and the run is evaluated again") from None


def write_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def _load_pretrained(job: Job, record: dict, info):
    """(model, cfg, class map) of published weights: a visionpe run directory, a weights file through the model's
    pretrained filter (official/timm layouts convert), or timm's own."""
    num_classes, class_map = eval_split_classes(job.cfg, info, True)
    source = job.plan.bench.checkpoints.get(job.model)
    record["pretrained"] = source or "timm"
    record.pop("run_dir", None)
    if source and Path(source).is_dir():
        model, cfg, _ = engine.load_checkpoint(source, device="cpu")
        if cfg.model.name != job.model:  # check_bench compared config.yaml; this is what the weights say
            raise BenchConfigError(
                f"bench.checkpoints.{job.model}: {source} holds weights of model {cfg.model.name!r}, not "
                f"{job.model!r}; list it as bench.checkpoints.{cfg.model.name}"
            )
        return model, cfg, class_map
    c = copy.deepcopy(job.cfg)  # the checkpoint's head is kept when it has the dataset's classes
    overlay = dict(num_classes=num_classes, **({"file": str(source)} if source else {}))
    c.model.kwargs = dict(c.model.kwargs, pretrained=True, pretrained_cfg_overlay=overlay)
    return build_model(c, num_classes, info.in_chans), job.cfg, class_map


def _trained_model(job: Job, record: dict):
    """(model, cfg, class map) of the job's run, trained, resumed or reused; a stop signal checkpoints (the trainer)
    and raises JobStopped, and a rerun resumes there."""
    ref = find_checkpoint(job.run_dir) if job.run_dir.is_dir() else None
    if ref is None or not (ref.info or {}).get("finished"):
        try:
            engine.train(job.cfg, resume=ref is not None)
        except TrainingInterrupted as e:
            raise JobStopped(str(e), e.signum) from None
        record["resumed"] = ref is not None
        ref = find_checkpoint(job.run_dir)
    if "cpu_seconds" in (ref.info or {}):  # the run's own count, its interrupted attempts included (None: unknown)
        record["train_seconds"], record["train_cpu_seconds"] = ref.info["seconds"], ref.info["cpu_seconds"]
    record.setdefault("train_seconds", None)  # None: trained by an earlier benchmark whose record was removed
    curve = training_curve(job.run_dir / METRICS, job.cfg.data.resolution, job.plan.base_tokens)
    if curve:
        record["curve"] = curve
    model, cfg, meta = engine.load_checkpoint(job.run_dir, device="cpu")
    return model, cfg, json.loads(meta["class_map"]) if meta.get("class_map") else None


def training_curve(path: Path, resolution: int, tokens: int = 0) -> list[dict]:
    """Per epoch of a run's metrics.jsonl: the validation top-1 at the training point (the `<tokens>tok` row of a
    data.native recipe, else the base resolution's; the model's weights, not EMA) and the mean training loss (its
    logged windows weighted by their steps). [] without the file or an evaluation there."""
    if not path.is_file():
        return []
    want = f"{tokens}tok" if tokens else resolution
    top1, losses, last_step = {}, {}, 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut off by a crash: the trainer trims it on resume
            continue
        if not isinstance(row, dict) or not isinstance(row.get("epoch"), int):
            continue
        if row.get("kind") == "eval" and row.get("weights", "model") == "model" and row.get("resolution") == want:
            top1[row["epoch"]] = row.get("top1")
        elif row.get("kind") == "train" and isinstance(row.get("loss"), (int, float)):
            steps, last_step = row.get("global_step", last_step) - last_step, row.get("global_step", last_step)
            total, n = losses.get(row["epoch"], (0.0, 0))
            losses[row["epoch"]] = (total + row["loss"] * max(steps, 1), n + max(steps, 1))
    return [dict(epoch=e, top1=top1[e], train_loss=round(losses[e][0] / losses[e][1], 4) if e in losses else None)
            for e in sorted(top1)]  # fmt: skip


def _coinciding(job: Job, rows: dict, agree: bool, mode: str, point: Point) -> tuple[dict, str] | None:
    """(a row already measured on identical inputs and logits, what it is) or None: the first mode's row when the
    modes give identical logits; at the training point, another protocol's (every protocol shows the same inputs)."""
    first = job.modes[0]
    if agree and mode != first and (first, point) in rows:
        return rows[(first, point)], first
    bases = [p for p in job.plan.points if p == Point(p.protocol, *job.plan.base, p.frames and job.plan.base_frames)]
    for other in bases if point in bases else []:
        row = rows.get((mode, other))
        if other != point and row is not None and "same_as" not in row:
            return row, other.protocol
    return None


def _modes_agree(job: Job, model, datasets: dict, device) -> bool:
    """Whether all modes give the same logits at each protocol's largest point and at every non-square one."""
    points = job.plan.points
    probes = [max((p for p in points if p.protocol == k), key=lambda p: (p.frames, p.tokens, p.height * p.width))
              for k in dict.fromkeys(p.protocol for p in points)]  # fmt: skip
    probes += [p for p in points if p.height != p.width and p not in probes]
    views = [protocols.view_of(datasets, p, job.plan.base, 4, model_patch_size(model)) for p in probes]
    inputs = (to_device(protocols.first_inputs(v, 4), device) for v in views)
    return all(protocols.modes_agree(model, x, job.modes) for x in inputs)


def _evaluate_points(job: Job, record: dict, todo: list, evaluate, stop) -> None:
    """Evaluate `todo` (mode, point) pairs, writing the record after each; a stop signal ends it between points."""
    rows = {(r["mode"], row_point(r)): r for r in record["rows"]}
    order = {p: i for i, p in enumerate(job.plan.points)}
    rank = {m: i for i, m in enumerate(job.modes)}
    for mode, point in todo:
        if stop is not None and stop.signum:
            raise stopped_job(stop.signum, f" during the evaluation of {job.label}")
        fields = dict(protocol=point.protocol, mode=mode, height=point.height, width=point.width, frames=point.frames)
        if point.protocol == "native":
            fields["tokens"] = point.tokens
        if point.protocol == "patch":
            fields["patch"] = point.patch
        same = _coinciding(job, rows, record["modes_agree"], mode, point)
        if same is not None:
            rows[(mode, point)] = dict(same[0], **fields, same_as=same[1])
        else:
            rows[(mode, point)] = dict(**fields, **evaluate(point, mode, job.plan.bench.eval_samples))
        record["rows"] = [rows[k] for k in sorted(rows, key=lambda k: (rank.get(k[0], 99), order.get(k[1], 10**6)))]
        write_record(job.record_path, record)


def _base_check(job: Job, cfg: Config, datasets: dict, class_map, evaluate) -> dict:
    """The training point on bench.base_samples items of the whole validation split (a smaller sampling error)."""
    whole = datasets  # the tables' sets hold the whole split unless num_val cut it
    if "num_val" in cfg.data.options:
        cut = copy.deepcopy(cfg)
        cut.data.options = {k: v for k, v in cfg.data.options.items() if k != "num_val"}
        whole = build_eval_sets(cut, [max(job.plan.base)], class_map)
    result = evaluate(job.plan.points[0], job.modes[0], job.plan.bench.base_samples, whole)
    return dict(samples=job.plan.bench.base_samples, mode=job.modes[0], **result)


def run_job(job: Job, stop=None) -> dict:
    """Train (or resume, or reuse) one run, or load pretrained weights; evaluate what its record lacks; return the
    record. `stop.signum` (a stop signal received) ends it at the next step or evaluation point."""
    bench = job.plan.bench
    torch.set_num_threads(bench.threads)
    record = job.record()
    if job.done(record):
        return record
    if stop is not None and stop.signum:
        raise stopped_job(stop.signum, f" before {job.label}")
    if bench.pretrained:
        model, cfg, class_map = _load_pretrained(job, record, get_dataset_info(job.cfg.data.name))
    else:
        model, cfg, class_map = _trained_model(job, record)
    device = torch.device(bench.device)
    model.eval().to(device)
    record["params"] = sum(p.numel() for p in model.parameters())
    datasets = build_eval_sets(cfg, sorted({max(s) for s in job.plan.sizes}), class_map)
    amp, patch = resolve_amp(cfg.train.amp, device), model_patch_size(model)

    def evaluate(point: Point, mode: str, limit: int, sets: dict = datasets) -> dict:
        view = protocols.view_of(sets, point, job.plan.base, limit, patch)
        return protocols.evaluate_point(model, view, point, mode, bench.eval_batch_size, device, amp, cfg.data.workers)

    record["modes_agree"] = len(job.modes) > 1 and _modes_agree(job, model, datasets, device)  # probed only if used
    t0, c0 = time.perf_counter(), time.process_time()
    _evaluate_points(job, record, job.missing(record), evaluate, stop)
    if job.needs_base_check(record):
        record["base_check"] = _base_check(job, cfg, datasets, class_map, evaluate)
    record["eval_seconds"] = round(time.perf_counter() - t0, 1) + (record.get("eval_seconds") or 0)
    record["eval_cpu_seconds"] = round(time.process_time() - c0, 1) + (record.get("eval_cpu_seconds") or 0)
    write_record(job.record_path, record)
    return record


class _Progress:
    """One line per finished run with the time elapsed and left; failures kept for the end."""

    def __init__(self, total: int, points: list[Point], log):
        self.total, self.points, self.log = total, points, log
        self.done, self.start, self.failures = 0, time.perf_counter(), []

    def summary(self, record: dict) -> str:
        mode = record["rows"][0]["mode"] if record.get("rows") else "extrapolate"
        rows = {(r["mode"], row_point(r)): r for r in record.get("rows", [])}
        shown = dict.fromkeys([self.points[0], *{p.protocol: p for p in self.points}.values()])  # each protocol's last
        parts = [f"{point_label(p)} {rows[(mode, p)]['top1']:.1f}%" for p in shown if (mode, p) in rows]
        t = record.get("train_seconds")
        return f"{', '.join(parts)} ({mode}){f', trained in {t:.0f} s' if t else ''}"

    def __call__(self, job: Job, record: dict | None, error: BaseException | None) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        status = f"FAILED: {type(error).__name__}: {error}" if error else self.summary(record)
        self.log(f"[{self.done}/{self.total}] {job.label}: {status} | {elapsed / 60:.1f} min elapsed, "
                 f"~{eta / 60:.1f} min left")  # fmt: skip
        if error:
            self.failures.append(f"{job.label}: {type(error).__name__}: {error}")


def run_benchmark(bench: BenchConfig, cfg: Config, dry_run: bool = False, log=print, report_only: bool = False) -> Path:
    """Check everything, run what is missing (in `bench.processes` processes), write the tables and the plot.
    Returns the output directory. SIGTERM / SIGINT stop it cleanly (JobStopped): trainings checkpoint,
    evaluated points are kept, the tables are written from what exists, and a rerun continues. report_only: run
    nothing, write the tables from the evaluations present (records copied from other machines, a new report)."""
    plan = make_plan(bench, cfg)
    validate(plan)
    out = bench.out()
    pending = [j for j in plan.jobs if not j.done(j.record())]
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
    if report_only:
        pending = []
        plan.jobs += [j for j in extra_jobs(plan) if j not in plan.jobs]
        log(f"report only: {sum(j.record_path.is_file() for j in plan.jobs)} runs' evaluations, nothing trained")
    out.mkdir(parents=True, exist_ok=True)
    snapshot = dict(bench=dataclasses.asdict(bench), **config_to_dict(cfg))
    atomic_write_text(out / "bench.yaml", yaml.safe_dump(snapshot, sort_keys=False))
    progress = _Progress(len(pending), plan.points, log)
    try:
        run_stoppable(run_job, pending, progress, bench.processes, bench.threads)
        more = [j for j in extra_jobs(plan) if j not in plan.jobs]  # the first seeds just finished
        if more and not progress.failures:
            validate(dataclasses.replace(plan, jobs=more), check_models=False)
            log(f"{len(set(j.model for j in more))} models within noise in a claim: seeds "
                f"{', '.join(map(str, bench.extra_seeds))} added ({len(more)} runs)")  # fmt: skip
            plan.jobs += more
            progress.total += len(more)
            run_stoppable(run_job, [j for j in more if not j.done(j.record())], progress, bench.processes,
                          bench.threads)  # fmt: skip
    finally:
        records = [read_record(j.record_path) for j in plan.jobs if j.record_path.is_file()]
        seconds, machine = time.perf_counter() - progress.start, None
        if not pending:  # nothing ran: the tables keep the machine and time of the invocation that ran them
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                last = json.loads((out / "summary.json").read_text())
                seconds, machine = float(last["seconds"]), dict(last["machine"])
        paths = write_report(records, plan, out, seconds, machine)
        if paths:
            log(f"wrote {', '.join(str(p) for p in paths)}")
    if progress.failures:
        raise failed_runs(progress.failures)
    return out


def failed_runs(failures: list[str]) -> RuntimeError:
    """The error that ends a benchmark some of whose runs failed (the others' records are kept)."""
    return RuntimeError(f"{len(failures)} run(s) failed (the others are kept; rerun to retry only these):\n  "
                        + "\n  ".join(failures))  # fmt: skip


def bench_command(prog: str, example: str, argv, run, kept: str, extra=None) -> int:
    """A benchmark command's shell: `-c FILE [--dry-run] [key=value ...]` parsed, `run(args)` called, bad input and
    stops (SIGTERM, Ctrl-C) as one line each; `kept` says what a stop keeps, `extra(ap)` adds flags."""
    keys = format_config_help({"bench": BenchConfig})
    epilog = f"bench keys (default, then help):{keys}\n\nthe other sections are train.py's recipe keys ({Config.HELP})"
    ap = argparse.ArgumentParser(prog, description=sys.modules[run.__module__].__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("-c", "--config", required=True, help=f"benchmark file, e.g. {example}")
    ap.add_argument("--dry-run", action="store_true", help="check the benchmark and print the plan; train nothing")
    if extra is not None:
        extra(ap)
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="bench.* or recipe keys, e.g. bench.seeds=0,1")
    args = ap.parse_args(argv)
    try:
        run(args)
    except (*USER_ERRORS, RuntimeError) as e:
        return user_error(e)
    except JobStopped as e:  # one line: what stopped, and how to continue
        print(f"{e.args[0]}; {kept} are kept: rerun the same command to continue", file=sys.stderr)
        return 128 + e.args[1]
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to continue where it stopped", file=sys.stderr)
        return 130
    return 0


def _run(args) -> None:
    overrides = [*args.overrides, *(["bench.pretrained=true"] if args.pretrained else [])]
    run_benchmark(*load_bench(args.config, overrides), dry_run=args.dry_run, report_only=args.report_only)


def _flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pretrained", action="store_true", help="evaluate weights without training (bench.pretrained)")
    ap.add_argument("--report-only", action="store_true",
                    help="train and evaluate nothing: write the tables and plot from the evaluations in "
                         "<output_dir>/evals (e.g. records copied from other machines)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    kept = "checkpoints and evaluated points"
    return bench_command("visionpe-bench extrapolate", "configs/bench/quick.yaml", argv, _run, kept, _flags)
