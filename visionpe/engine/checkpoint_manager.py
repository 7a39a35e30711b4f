"""One checkpoint path for every strategy; the storage format is a backend (checkpoint_backend.py).

    checkpoints = CheckpointManager(run_dir, ctx, PlainBackend() or ShardedBackend(), keep=2)
    found = checkpoints.find(resume)  # before the model exists: the checkpoint to resume and its training state
    checkpoints.load(found, parts, model_name)  # its tensors and state into the run's TrainingParts
    checkpoints.save(parts, header, finished)  # every rank

A save: every rank builds its training state (TrainingParts.rank_state) and the backend stores it with the tensors
(safetensors: rank 0, file by file under their final names; DCP: every rank, into a partial folder); every rank agrees
that it worked (one error on every rank if not: a full disk anywhere is one DiskFullError); rank 0 moves it into place,
replaces checkpoint.json (the pointer: where the run stood, what it cost, the files, the history) and prunes the
oldest. A kill at any moment leaves the previous checkpoint intact and pointed to (the fault points of checkpoint.py).
A resume: the pointer's history newest first (the files on disk when it is unreadable), the first checkpoint that
every rank can read, its world size checked before any collective; an unreadable newest one falls back to an older
one with a warning.
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path

from torch.distributed.checkpoint.api import CheckpointException

from .. import __version__
from .checkpoint import (
    CKPT_DIR,
    POINTER,
    CheckpointError,
    begin_write,
    check_world_size,
    checkpoint_tags,
    disk_full_error,
    is_disk_full,
    publish_checkpoint,
    read_pointer,
    remove_leftovers,
)
from .checkpoint_backend import Backend, Found, Unreadable, WriteFailed, describe_failure, failure_causes
from .config import Config, config_to_dict
from .distributed import DistContext, gather_objects
from .train_state import Position, TrainingParts

__all__ = ["CheckpointManager", "CheckpointCadence", "CorruptCheckpointWarning", "run_header", "warn_fell_back"]

_TRAINED_WITH = {
    "fsdp": "{run_dir} was trained with train.strategy=fsdp (sharded checkpoints); continue it with "
    "train.strategy=fsdp, or export its weights (visionpe-export) and start a new run from them",
    "ddp": "{run_dir} was trained with train.strategy=ddp (safetensors checkpoints); continue it with "
    "train.strategy=ddp, or export its weights and start a new fsdp run from them (docs/training.md)",
}


class CorruptCheckpointWarning(UserWarning):
    """The newest checkpoint could not be read; the run resumed from an older, valid one."""


def warn_fell_back(run_dir: Path, why: str, name: str, step: int) -> None:
    """The warning of a resume that skipped an unreadable newest checkpoint (`why`) for the older `name`."""
    warnings.warn(
        f"the newest checkpoint of {run_dir} is unreadable ({why}); resuming from the newest valid one, {name} "
        f"(step {step})",
        CorruptCheckpointWarning,
        stacklevel=4,
    )


def run_header(
    cfg: Config, num_classes: int, in_chans: int, class_map: dict | None, position: Position
) -> dict[str, str]:
    """What a checkpoint says about its weights (safetensors metadata; a sharded one's meta.json): the model, the
    data it was trained on, the resolved config, where the run stood."""
    meta = {
        "format": "visionpe",
        "visionpe_version": __version__,
        "model": cfg.model.name,
        "dataset": cfg.data.name,
        "num_classes": str(num_classes),
        "in_chans": str(in_chans),
        "epoch": str(position.epoch),
        "global_step": str(position.global_step),
        "config": json.dumps(config_to_dict(cfg)),
    }
    if class_map:
        meta["class_map"] = json.dumps(class_map)
    return meta


class CheckpointCadence:
    """When the loop saves besides each epoch's end: every `train.ckpt_every_steps` steps (0: never) within an epoch
    (its last step is the epoch's own checkpoint)."""

    def __init__(self, every_steps: int, steps_per_epoch: int):
        self.every, self.steps_per_epoch = every_steps, steps_per_epoch

    def due(self, position: Position) -> bool:
        every = self.every
        return bool(every and position.global_step % every == 0 and position.batch < self.steps_per_epoch)


class CheckpointManager:
    def __init__(self, run_dir: Path, ctx: DistContext, backend: Backend, keep: int = 2):
        self.run_dir, self.ctx, self.backend, self.keep = run_dir, ctx, backend, max(keep, 1)
        self.ckpt_dir = run_dir / CKPT_DIR
        self.tags: list[str] = []  # the resume's candidates, newest first

    # ------------------------------------------------------------------------------------------------------ save

    def save(self, parts: TrainingParts, header: dict[str, str], finished: bool = False) -> dict | None:
        """Every rank: write the run's checkpoint; rank 0 returns the pointer written."""
        begin_write()
        state = parts.rank_state(self.ctx)
        seconds, cpu_seconds = state["spent"]
        position = parts.position
        info = dict(
            epoch=position.epoch,
            batch=position.batch,
            global_step=position.global_step,
            finished=finished,
            seconds=seconds,
            cpu_seconds=cpu_seconds,
            model=header["model"],
            time=time.strftime("%Y-%m-%d %H:%M:%S"),
            world_size=self.ctx.world_size,
        )
        return self.write(position.tag, self.backend.payload(parts, state, header, self.ctx), info)

    def write(self, tag: str, payload, info: dict) -> dict | None:
        """Every rank: store `payload` under `tag`, then (rank 0) move it into place, point to it and prune."""
        error, path, partial = None, self.backend.source(self.ckpt_dir, tag), self.backend.partial(self.ckpt_dir, tag)
        if self.ctx.is_main:
            try:
                self.backend.prepare(self.ckpt_dir, tag)
            except OSError as e:
                error = e
        self._agree(error, path, partial)
        entries = None
        try:
            entries = self.backend.write(self.ckpt_dir, tag, payload, self.ctx)
        except WriteFailed as e:
            error, path = e.error, e.path
        self._agree(error, path, partial)
        pointer = None
        if self.ctx.is_main:
            try:
                pointer = self._publish(tag, {**info, **(entries or {})})
            except OSError as e:
                error = e
        self._agree(error, self.run_dir / POINTER)
        return pointer

    def _publish(self, tag: str, info: dict) -> dict:
        """Rank 0: the checkpoint into place, the pointer to it, the oldest pruned, leftovers removed."""
        commit = lambda: self.backend.commit(self.ckpt_dir, tag)  # noqa: E731
        return publish_checkpoint(self.run_dir, tag, info, self.keep, commit, self.backend.remove)

    def _agree(self, error: BaseException | None, path: Path, partial: Path | None = None) -> None:
        """Every rank: wait for the others, and fail together if any rank failed writing checkpoint `path` (instead
        of waiting at a collective for a rank that gave up). A full disk on any rank is one DiskFullError on every
        rank, after rank 0 removed the `partial` folder."""
        report = None
        if error is not None:
            full = any(is_disk_full(c, path.parent) for c in failure_causes(error))
            report = ("disk" if full else "other", describe_failure(error))
        reports = [(r, rep) for r, rep in enumerate(gather_objects(report, self.ctx)) if rep is not None]
        if not reports:
            return
        if self.ctx.is_main and partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        if any(kind == "disk" for _, (kind, _) in reports):
            full = disk_full_error(self.run_dir, path)  # checkpoint.write_error's, on every rank
            full.every_rank = True
            raise full from None
        if error is not None and not isinstance(error, CheckpointException):  # this rank's own error, as raised
            raise error
        rank, (_, what) = reports[0]
        raise CheckpointError(
            f"rank {rank} failed writing checkpoint {path} ({what}); the previous checkpoint is intact"
        )

    # ---------------------------------------------------------------------------------------------------- resume

    def _written_strategy(self) -> str | None:
        """The strategy whose checkpoints the run directory holds (its pointer's, else its files'), None if none."""
        try:
            pointer = read_pointer(self.run_dir) if self.run_dir.is_dir() else None
        except CheckpointError:
            pointer = None
        if pointer:
            return "fsdp" if pointer.get("sharded") else "ddp"
        if not self.ckpt_dir.is_dir():
            return None
        if any(p.name.endswith(".dcp") for p in self.ckpt_dir.iterdir()):
            return "fsdp"
        return "ddp" if any(self.ckpt_dir.glob("*.state.pt")) else None

    def find(self, resume: bool) -> Found | None:
        """The checkpoint to resume from (None for a new run). A new run into a directory that holds a run, a resume
        with nothing to resume, with another strategy or another world size, are CheckpointErrors."""
        written = self._written_strategy()
        if written is not None and written != self.backend.strategy:
            raise CheckpointError(_TRAINED_WITH[written].format(run_dir=self.run_dir))
        on_disk = self.backend.tags_on_disk(self.ckpt_dir) if self.ckpt_dir.is_dir() else []
        tags = checkpoint_tags(self.run_dir, on_disk, warn=resume and self.ctx.is_main) if self.run_dir.is_dir() else []
        if resume and not tags:
            raise CheckpointError(f"nothing to resume in {self.run_dir} (no checkpoint.json); start without --resume")
        if not resume and (tags or (self.run_dir / POINTER).is_file()):
            raise CheckpointError(
                f"{self.run_dir} already holds a run; continue it with --resume, or start a new "
                f"one with train.run_name=<new name> (or train.output_dir=...)"
            )
        if not resume:
            return None
        if self.ctx.is_main:
            remove_leftovers(self.run_dir)
        self.tags, broken = tags, []
        found = self._first_readable(tags, broken)
        if broken and self.ctx.is_main:
            warn_fell_back(self.run_dir, broken[0], found.source.name, found.state["global_step"])
        return found

    def _first_readable(self, tags: list[str], broken: list[str]) -> Found:
        """The first of `tags` that every rank can read; why each one before it was skipped goes to `broken`."""
        for tag in tags:
            error, found = None, None
            try:
                written = self.backend.world_size(self.ckpt_dir, tag)
            except CheckpointError as e:
                error = str(e)
            else:  # before any collective: every rank refuses
                check_world_size(self.backend.source(self.ckpt_dir, tag), written, self.ctx.world_size)
                try:
                    found = self.backend.read(self.ckpt_dir, tag, self.ctx.rank)
                except CheckpointError as e:
                    error = str(e)
            errors = [e for e in gather_objects(error, self.ctx) if e]  # every rank takes the same checkpoint
            if not errors:
                return found
            broken.append(errors[0])
        error = CheckpointError(f"no readable checkpoint in {self.run_dir}: {'; '.join(broken)}; start a new run")
        error.every_rank = True
        raise error

    def load(self, found: Found, parts: TrainingParts, model_name: str) -> Found:
        """Every rank: the checkpoint's tensors and training state into `parts`. Tensors that cannot be read fall back
        to the next older readable checkpoint, with the warning of `find`. Returns the checkpoint loaded."""
        broken: list[str] = []
        while True:
            if parts.ema is not None and not found.has_ema:
                raise CheckpointError(
                    f"{found.source} has no EMA weights but train.ema=true; resume with train.ema=false or start "
                    f"a new run"
                )
            try:
                self.backend.load(found, parts, model_name)
                break
            except Unreadable as e:
                broken.append(str(e))
            older = self.tags[self.tags.index(found.tag) + 1 :] if found.tag in self.tags else []
            found = self._first_readable(older, broken)
        parts.load_rank_state(found.state, self.ctx)
        if broken and self.ctx.is_main:
            warn_fell_back(self.run_dir, broken[0], found.source.name, found.state["global_step"])
        return found
