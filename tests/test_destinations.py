"""Result destinations (`visionpe-eval --json/--csv`, `visionpe-export --out`, `visionpe-bench speed/cards/gpu-check
--out`): a path that cannot be written is one line before any work, and a disk that fills up at the end is one line
that leaves the previous file as it was (written atomically, never truncated in place)."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest

import visionpe.engine.checkpoint as ckpt
from visionpe.bench.__main__ import main as bench_main
from visionpe.bench.perf import speed
from visionpe.engine import destinations, evaluate, export
from visionpe.engine.cli import eval_main
from visionpe.engine.destinations import DestinationError, check_destination

REPO = Path(__file__).resolve().parents[1]
ROW = dict(resolution=16, top1=50.0, top5=90.0, loss=1.0, images=8)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err.splitlines()[0]


def _not_reached(*args, **kwargs):
    pytest.fail("the work started before the destination was checked")


def test_check_destination_names_what_is_wrong(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DestinationError, match=r"--out .*file/sub/r.json: .*file is a file, not a folder"):
        check_destination(tmp_path / "file" / "sub" / "r.json", "--out")
    with pytest.raises(DestinationError, match="is a folder; give a file name"):
        check_destination(tmp_path, "--json")
    with pytest.raises(DestinationError, match="is a file, not a folder"):
        check_destination(tmp_path / "file", "--out", folder=True)
    with pytest.raises(DestinationError, match="does not exist; create it first"):
        check_destination(tmp_path / "missing" / "r.json", "--json", create=False)
    assert check_destination(tmp_path / "new" / "deeper" / "r.json", "--out").name == "r.json"
    assert not (tmp_path / "new").exists()  # checked, nothing made


def test_a_full_disk_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(destinations.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(DestinationError, match=r"the disk holding .* is full \(1000 bytes free\)"):
        check_destination(tmp_path / "r.json", "--json")


def test_export_out_under_a_file_is_one_line_before_reading_the_checkpoint(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(export, "is_sharded_run", _not_reached)
    out = tmp_path / "file" / "w.safetensors"
    assert export.export_main(["--checkpoint", str(tmp_path), "--out", str(out)]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"error: --out {out}: ") and "is a file, not a folder" in line


def test_export_onto_a_disk_that_fills_up_is_one_line_and_leaves_no_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(export, "is_sharded_run", lambda p: False)
    monkeypatch.setattr(export, "find_checkpoint", lambda p: ckpt.CheckpointRef(tmp_path / "w", None, None, None))
    monkeypatch.setattr(export, "load_weights", lambda p: ({}, {"model": "m"}))

    def full(tensors, path, metadata=None):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "save_file", full)
    out = tmp_path / "o" / "w.safetensors"
    assert export.export_main(["--checkpoint", str(tmp_path), "--out", str(out)]) == 2
    line = _one_line(capsys)
    assert f"--out {out}: disk full" in line
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == []  # no partial file, no temporary file


def _eval_rows(monkeypatch):
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", lambda *a, **k: [dict(ROW, resolution=16 + i) for i in a[1]])


def test_eval_json_onto_a_full_disk_keeps_the_previous_file(tmp_path, capsys, monkeypatch):
    """A real full disk (a small tmpfs; root only): before, the file was truncated in place to 0 bytes."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        (mnt / "r.json").write_text("previous\n")
        (mnt / "filler").write_bytes(b"\0" * (3 << 19))  # 1.5 MiB of 3 left: the check before the work passes
        _eval_rows(monkeypatch)
        many = ",".join(str(i) for i in range(1, 30001))  # ~2.5 MB of JSON onto 1.5 MB of free space
        assert eval_main(["--checkpoint", str(tmp_path), "--resolutions", many, "--json", str(mnt / "r.json")]) == 2
        line = _one_line(capsys)
        assert line.startswith(f"error: --json {mnt / 'r.json'}: disk full")
        assert (mnt / "r.json").read_text() == "previous\n" and not list(mnt.glob(".*.tmp-*"))
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_eval_json_and_csv_are_written_whole(tmp_path, monkeypatch):
    _eval_rows(monkeypatch)
    js, cs = tmp_path / "r.json", tmp_path / "r.csv"
    assert eval_main(["--checkpoint", str(tmp_path), "--resolutions", "1,2", "--json", str(js), "--csv", str(cs)]) == 0
    assert '"resolution": 17' in js.read_text() and cs.read_text().splitlines()[0].startswith("resolution,")


def test_speed_out_under_a_file_is_one_line_before_measuring(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(speed, "measure", _not_reached)
    assert bench_main(["speed", "--models", "vit_n_ape", "--out", str(tmp_path / "file" / "speed")]) == 2
    assert "--out" in _one_line(capsys)


def test_speed_onto_a_disk_that_fills_up_prints_the_numbers_and_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(speed._RUNS, "speed", (lambda *a: ({"rows": [1]}, "THE TABLE\n"), "unused"))

    def full(path, text):
        ckpt._atomic(path, lambda tmp: (Path(tmp).write_text(text[:3]), _raise_enospc()))

    monkeypatch.setattr(destinations, "atomic_write_text", full)
    assert bench_main(["speed", "--models", "vit_n_ape", "--out", str(tmp_path / "s")]) == 2
    captured = capsys.readouterr()
    assert "THE TABLE" in captured.out  # the measurement is on screen, not lost
    assert f"--out {tmp_path / 's.json'}: disk full" in captured.err and "Traceback" not in captured.err
    assert list(tmp_path.iterdir()) == []


def _raise_enospc():
    raise OSError(errno.ENOSPC, "No space left on device")


def test_cards_out_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert bench_main(["cards", "--results", str(REPO / "results"), "--out", str(tmp_path / "file" / "cards")]) == 2
    assert "--out" in _one_line(capsys)


def test_gpu_check_out_under_a_file_is_one_line_before_checking(tmp_path, capsys, monkeypatch):
    from visionpe.bench.perf import gpu_check

    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(gpu_check, "run_check", _not_reached)
    assert bench_main(["gpu-check", "--out", str(tmp_path / "file" / "g")]) == 2
    assert "--out" in _one_line(capsys)


def test_export_into_a_read_only_folder_is_one_line_before_reading(tmp_path, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True).returncode:
        ro.chmod(0o555)
        if check_destination_passes(ro):
            pytest.skip("cannot make a read-only folder here (root without mount)")
    monkeypatch.setattr(export, "is_sharded_run", _not_reached)
    try:
        assert export.export_main(["--checkpoint", str(tmp_path), "--out", str(ro / "w.safetensors")]) == 2
        line = _one_line(capsys)
        assert f"--out {ro / 'w.safetensors'}: cannot write to {ro}" in line
    finally:
        subprocess.run(["umount", str(ro)], check=False, capture_output=True)


def check_destination_passes(folder: Path) -> bool:
    try:
        check_destination(folder / "x", "--out")
        return True
    except DestinationError:
        return False
