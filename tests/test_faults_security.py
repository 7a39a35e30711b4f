"""Crafted files and names never run code or write outside the run: a sharded checkpoint's pickled index and values,
paths in checkpoint.json, a symlinked lock, run names leaving train.output_dir, folders no run wrote, `~` in paths.
Each payload is harmless: it would create a marker file, and the tests check that it does not."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
from test_faults import _one_line_error, run, tiny

from visionpe.engine import CheckpointError, ConfigError, find_checkpoint, load_config
from visionpe.engine.checkpoint import resume_candidates
from visionpe.engine.cli import eval_main
from visionpe.engine.config import save_config
from visionpe.engine.dcp_reader import read_dcp_metadata
from visionpe.engine.export import export_main
from visionpe.engine.metrics_log import append_metrics
from visionpe.engine.run_dir import check_run_dir_is_ours
from visionpe.engine.runlock import RunLock
from visionpe.engine.trainer import resolve_run_dir


class Marker:
    """Unpickling this creates `path` (what a crafted pickle could do with any code)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One finished ddp run and one fsdp run (1 process), 2 checkpoints each; tests work on copies."""
    out = tmp_path_factory.mktemp("sec")
    common = tiny(out, "train.ckpt_every_steps=2", "train.epochs=1")
    return {s: run([*common, f"train.strategy={s}", f"train.run_name={s}"]) for s in ("ddp", "fsdp")}


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _user_error(capsys, main, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[1].startswith("(set VISIONPE_DEBUG=1"), err
    return err[0]


def _resume_args(run_dir: Path) -> list[str]:
    return ["--resume", str(run_dir), "train.epochs=2", "--accept-changes"]


# ------------------------------------------------------------------------------------------- sharded checkpoints


def test_a_crafted_sharded_index_never_runs_code(runs, tmp_path, capsys):
    run_dir = copy(runs["fsdp"], tmp_path / "fsdp")
    marker = tmp_path / "marker"
    for folder in (run_dir / "checkpoints").glob("*.dcp"):
        (folder / ".metadata").write_bytes(pickle.dumps(Marker(marker)))
    out = str(tmp_path / "w.safetensors")
    for main, argv in (
        (eval_main, ["--checkpoint", str(run_dir)]),
        (export_main, ["--checkpoint", str(run_dir), "--out", out]),
        (export_main, ["--checkpoint", str(next((run_dir / "checkpoints").glob("*.dcp"))), "--out", out]),
    ):
        assert ".metadata: it names io.open, which a checkpoint's index never holds" in _user_error(capsys, main, argv)
    assert "refusing" in _one_line_error(capsys, _resume_args(run_dir))
    assert not marker.exists()


def test_a_crafted_value_in_sharded_data_never_runs_code(runs, tmp_path, capsys):
    run_dir = copy(runs["fsdp"], tmp_path / "fsdp")
    marker = tmp_path / "marker"
    folder = run_dir / find_checkpoint_sharded(run_dir)
    meta = read_dcp_metadata(folder)
    (index,) = [i for i in meta.storage_data if i.fqn == "optimizer.param_groups.0.lr"]
    payload = pickle.dumps(Marker(marker))  # what DCP's own planner would torch.load(weights_only=False)
    (folder / "extra.distcp").write_bytes(payload)
    info = meta.storage_data[index]
    info.relative_path, info.offset, info.length = "extra.distcp", 0, len(payload)
    (folder / ".metadata").write_bytes(pickle.dumps(meta))
    assert "refusing the value optimizer.param_groups.0.lr" in _one_line_error(capsys, _resume_args(run_dir))
    assert not marker.exists()
    info.relative_path = "../../elsewhere.distcp"  # the index names data outside its folder
    (folder / ".metadata").write_bytes(pickle.dumps(meta))
    assert "not a plain name" in _user_error(capsys, eval_main, ["--checkpoint", str(run_dir)])


def find_checkpoint_sharded(run_dir: Path) -> str:
    return json.loads((run_dir / "checkpoint.json").read_text())["sharded"]


# -------------------------------------------------------------------------------------------- checkpoint.json


def test_pointer_history_outside_the_run_never_deletes_anything(runs, tmp_path):
    run_dir = copy(runs["ddp"], tmp_path / "r")
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("model.safetensors", "model.state.pt", "model-ema.safetensors"):
        (victim / name).write_text("keep")
    pointer = json.loads((run_dir / "checkpoint.json").read_text())
    pointer["history"] = ["../../victim/model", *pointer["history"]]  # pruned first by the next save
    (run_dir / "checkpoint.json").write_text(json.dumps(pointer))
    with pytest.warns(UserWarning, match=r"history' names '../../victim/model'.*looking for checkpoints in"):
        run(["train.epochs=2"], resume=run_dir, accept_changes=True)
    assert sorted(p.read_text() for p in victim.iterdir()) == ["keep"] * 3
    assert json.loads((run_dir / "checkpoint.json").read_text())["global_step"] == 8  # the run went on


def test_sharded_pointer_history_outside_the_run_never_deletes_anything(runs, tmp_path):
    run_dir = copy(runs["fsdp"], tmp_path / "f")
    victim = tmp_path / "victim.dcp"
    victim.mkdir()
    (victim / "data").write_text("keep")
    pointer = json.loads((run_dir / "checkpoint.json").read_text())
    pointer["history"] = ["../../victim", *pointer["history"]]
    (run_dir / "checkpoint.json").write_text(json.dumps(pointer))
    with pytest.warns(UserWarning, match=r"history' names '../../victim'.*looking for checkpoints in"):
        run(["train.epochs=2"], resume=run_dir, accept_changes=True)
    assert (victim / "data").read_text() == "keep"


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        "[]",
        '"hello"',
        '{"weights": "checkpoints/e0001-b000004.safetensors", "history": "e0001-b000004"}',
        '{"weights": "../../victim/model.safetensors"}',
        '{"weights": "/etc/passwd"}',
        '{"weights": "checkpoints/x.safetensors", "state": "checkpoints/../../x.state.pt"}',
    ],
)
def test_a_pointer_of_the_wrong_shape_is_one_line_or_a_fallback(runs, tmp_path, capsys, text):
    run_dir = copy(runs["ddp"], tmp_path / "r")
    (run_dir / "checkpoint.json").write_text(text)
    with pytest.raises(CheckpointError, match=r"checkpoint.json is corrupt \(.*\); point it at a checkpoint"):
        find_checkpoint(run_dir)
    assert "checkpoint.json is corrupt" in _user_error(capsys, eval_main, ["--checkpoint", str(run_dir)])
    with pytest.warns(UserWarning, match="checkpoint.json is corrupt.*looking for checkpoints in"):
        refs = resume_candidates(run_dir)  # what --resume reads: the files on disk, newest first
    assert [r.weights.parent for r in refs] == [run_dir / "checkpoints"] * 2


# ------------------------------------------------------------------------------------------------- run directory


def test_a_symlinked_lock_is_refused_and_its_target_kept(runs, tmp_path, capsys):
    run_dir = copy(runs["ddp"], tmp_path / "r")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (run_dir / ".lock").unlink()
    (run_dir / ".lock").symlink_to(victim)
    with pytest.raises(ConfigError, match=r"\.lock is a symbolic link; a run's lock is a plain file"):
        RunLock(run_dir).acquire()
    assert ".lock is a symbolic link" in _one_line_error(capsys, _resume_args(run_dir))
    assert victim.read_text() == "keep"


def test_run_names_stay_inside_output_dir_and_foreign_folders_are_refused(tmp_path, capsys):
    user = tmp_path / "user"
    (user / "out").mkdir(parents=True)
    (user / "config.yaml").write_text("my: own config\n")
    (user / "metrics.jsonl").write_text("mine\n")
    base = tiny(user / "out")
    for name, message in (
        ("..", "train.run_name: '..' is not a plain folder name"),
        ("a/b", "train.run_name: 'a/b' is not a plain folder name"),
        ("x" * 300, "train.run_name: the name is 300 bytes long, over the file system's limit of 255"),
    ):
        assert message in _one_line_error(capsys, [*base, f"train.run_name={name}"])
    args = tiny(tmp_path, "train.run_name=user")
    assert f"{user} is a folder that no visionpe run wrote" in _one_line_error(capsys, args)
    assert (user / "config.yaml").read_text() == "my: own config\n" and (user / "metrics.jsonl").read_text() == "mine\n"
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for name in ("dangling", "loop"):
        err = _one_line_error(capsys, tiny(tmp_path, f"train.run_name={name}"))
        assert f"run directory {tmp_path / name} is a symbolic link to" in err and "missing or loops" in err


def test_folders_runs_wrote_are_still_ours(tmp_path):
    check_run_dir_is_ours(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    check_run_dir_is_ours(tmp_path / "empty")
    old = tmp_path / "old"  # a run killed before its first checkpoint, by code older than the lock
    old.mkdir()
    cfg = load_config(None, ["train.run_name=old"])
    save_config(cfg, old / "config.yaml")
    (old / "metrics.jsonl").write_text("")
    check_run_dir_is_ours(old)
    save_config(load_config(None, ["train.run_name=other"]), old / "config.yaml")  # a recipe, not this run's
    with pytest.raises(ConfigError, match="no visionpe run wrote"):
        check_run_dir_is_ours(old)
    (old / ".lock").write_text("")
    check_run_dir_is_ours(old)


def test_home_is_expanded_in_path_settings(tmp_path, monkeypatch, runs, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(None, ["train.output_dir=~/runs", "data.root=~/data", "train.run_name=r"])
    assert cfg.train.output_dir == str(tmp_path / "runs") and cfg.data.root == str(tmp_path / "data")
    assert resolve_run_dir(cfg) == tmp_path / "runs" / "r"
    copy(runs["ddp"], tmp_path / "r")
    out = tmp_path / "w.safetensors"
    assert export_main(["--checkpoint", "~/r", "--out", "~/w.safetensors"]) == 0 and out.is_file()
    assert not Path("~").exists() and not os.path.exists(os.path.join(os.getcwd(), "~"))


def test_a_symlinked_metrics_file_is_refused_and_its_target_kept(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(CheckpointError, match="symbolic link"):
        append_metrics(tmp_path / "metrics.jsonl", {"step": 1})
    assert victim.read_text() == "keep me\n"
    append_metrics(tmp_path / "plain.jsonl", {"step": 1})  # a plain file is appended as before
    append_metrics(tmp_path / "plain.jsonl", {"step": 2})
    assert (tmp_path / "plain.jsonl").read_text().splitlines() == ['{"step": 1}', '{"step": 2}']
