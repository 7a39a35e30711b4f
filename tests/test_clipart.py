"""clipart: classes, duplicates, the split, skip rules, the cached scan, renders at any size, and a tiny run, on a
small SVG tree written here (Debian's openclipart-svg is not needed)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from tiny_runs import tiny_run

try:
    import cairosvg  # noqa: F401
except (ImportError, OSError):  # OSError: the cairo library is missing
    pytestmark = pytest.mark.skip(reason="clipart renders with cairosvg and the cairo library")

from visionpe.bench.protocols import SizedView
from visionpe.data import build_dataset
from visionpe.data.datasets import clipart, clipart_index
from visionpe.data.datasets.clipart import ClipArt, load_index, select

SVG = '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" {size}>{body}</svg>'
BOX = 'width="100" height="100" viewBox="0 0 100 100"'


def svg(body: str, size: str = BOX) -> str:
    return SVG.format(size=size, body=body)


def circle(i: int) -> str:
    return svg(f'<circle cx="{20 + 7 * i}" cy="50" r="{10 + i}" fill="#{(i * 40) % 256:02x}2040"/>')


def rect(i: int) -> str:
    return svg(f'<rect x="{10 + 5 * i}" y="20" width="30" height="{20 + 4 * i}" fill="#20{(i * 40) % 256:02x}40"/>')


def write(root: Path, rel: str, text: str | bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)


def make_tree(root: Path, order: list | None = None) -> Path:
    """animals: 8 circles (one also under a subfolder, one again with metadata and other ids), tools: 8 rects,
    tiny: 1 (below the threshold); an ambiguous drawing in both; broken, external, empty, zero-size, hairline files."""
    files = {f"animals/{'sub/' if i % 2 else ''}c{i}.svg": circle(i) for i in range(8)}
    files |= {f"tools/r{i}.svg": rect(i) for i in range(8)}
    files["animals/more/c0_copy.svg"] = circle(0)  # the same bytes under another path
    noisy = circle(1).replace(">", "><metadata><title>a circle</title></metadata>", 1).replace("<circle", "\n <circle")
    files["animals/c1_saved_again.svg"] = noisy.replace("/>", ' id="path123"/>')  # same drawing, other bytes
    files["tiny/t0.svg"] = circle(3).replace('r="13"', 'r="14"')
    files["animals/shared.svg"] = files["tools/shared.svg"] = rect(9)  # in two categories: no single class
    files["animals/broken.svg"] = '<svg xmlns="http://www.w3.org/2000/svg"><circle r="3"'
    files["tools/external.svg"] = svg('<image xlink:href="/home/someone/photo.png" width="10" height="10"/>')
    files["tools/empty.svg"] = ""
    files["animals/zero.svg"] = svg('<circle cx="5" cy="5" r="3"/>', 'viewBox="0 0 0 10"')
    files["tools/hairline.svg"] = svg('<path d="M 10 10 L 90 90" fill="none" stroke="black" stroke-width="0.1"/>')
    files["loose.svg"] = circle(2)  # outside a category folder
    for rel in order or sorted(files):
        write(root, rel, files[rel])
    return root


def dataset(root: Path, split: str = "train", resolution: int = 16, **options) -> ClipArt:
    options = {"min_drawings": 3, "val_percent": 50, "cache_dir": str(root.parent / "cache"), **options}
    return clipart.clipart(split, resolution, root=str(root), **options)


def test_classes_duplicates_skips_and_a_split_without_leaks(tmp_path):
    root = make_tree(tmp_path / "svg")
    train, val = dataset(root), dataset(root, "val")
    assert train.classes == val.classes == ("animals", "tools")  # tiny has 1 drawing, below min_drawings=3
    assert train.small == {"tiny": 1}
    assert train.skipped_at_scan == {
        "empty file": 1, "external reference": 1, "hairlines only": 1, "outside category folders": 1,
        "unreadable": 1, "zero-size canvas": 1,
    }  # fmt: skip
    assert train.duplicates == 3 and train.ambiguous == 1  # c0_copy, c1_saved_again, the second shared.svg
    assert len(train) + len(val) == 16 and train.counts == val.counts
    assert sum(t + v for t, v in train.counts.values()) == 16
    assert not set(train.digests) & set(val.digests)
    drawings = [(Path(p).stem.split("_")[0]) for p in train.paths + val.paths]
    assert len(set(drawings)) == 16  # every drawing once, in one split
    assert all(train.classes[label] == p.split("/")[0] for p, label in zip(train.paths, train.labels))
    assert 0 < len(val) < 16


def test_the_split_depends_on_content_only(tmp_path):
    """Another root, files written in another order, and one more drawing: the shared drawings keep their split."""
    first = make_tree(tmp_path / "a")
    rels = sorted(str(p.relative_to(first)) for p in first.rglob("*.svg"))
    random.Random(1).shuffle(rels)
    second = make_tree(tmp_path / "b", order=rels)
    write(second, "tools/r_extra.svg", rect(20))
    split = {}
    for root in (first, second):
        for kind in ("train", "val"):
            for p in dataset(root, kind).paths:
                assert split.setdefault(p, kind) == kind
    index = load_index(first, tmp_path / "cache")
    shuffled = dict(index, files=random.Random(2).sample(index["files"], len(index["files"])))
    a, b = select(index, 3, (), 50), select(shuffled, 3, (), 50)
    assert [i[0] for i in a["train"]] == [i[0] for i in b["train"]] and a["counts"] == b["counts"]


def test_the_scan_is_cached_until_a_file_changes(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "svg")
    dataset(root)
    assert len(list((tmp_path / "cache").glob("index-*.json"))) == 1

    def no_scan(*a, **k):
        raise AssertionError("scanned again")

    monkeypatch.setattr(clipart_index, "scan", no_scan)
    assert dataset(root, "val").classes == ("animals", "tools")  # from the index
    write(root, "tools/r_new.svg", rect(30))
    with pytest.raises(AssertionError, match="scanned again"):
        dataset(root)


def test_a_missing_root_is_one_clear_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install openclipart-svg.*or set data.root"):
        dataset(tmp_path / "nowhere")


def plain(ds: ClipArt, x: torch.Tensor) -> torch.Tensor:
    return x * ds.std + ds.mean  # back to [0, 1]


def test_a_larger_size_shows_finer_detail_and_keeps_the_aspect_ratio(tmp_path):
    root = make_tree(tmp_path / "svg")
    thin = '<rect x="0" y="0" width="30" height="30" fill="red"/><path d="M 60 5 L 60 95" stroke="black"/>'
    write(root, "tools/thin.svg", svg(thin))  # a 1-unit line: 1/100 of the side
    write(root, "tools/wide.svg", svg('<rect width="200" height="100" fill="blue"/>', 'width="200" height="100"'))
    ds = dataset(root, val_percent=1)
    thin_i, wide_i = ds.paths.index("tools/thin.svg"), ds.paths.index("tools/wide.svg")
    small, large = (plain(ds, ds.render(thin_i, r)[0]) for r in (16, 160))
    assert small.shape == (3, 16, 16) and large.shape == (3, 160, 160)
    assert large[:, 20:140, 95:98].min() < 0.2  # the line is black at 160 px
    assert small[:, 2:14, 9:11].min() > 0.5  # a faint grey at 16 px
    wide = plain(ds, ds.render(wide_i, 32)[0])
    assert torch.allclose(wide[:, :8], torch.ones(3, 8, 32), atol=1e-3)  # white above and below, centred
    assert torch.allclose(wide[:, 24:], torch.ones(3, 8, 32), atol=1e-3)
    assert wide[2, 9:23].min() > 0.9 and wide[0, 9:23].max() < 0.1  # blue in between
    assert list((tmp_path / "cache" / "renders").glob("160/*/*.png"))  # cached on disk per size
    again = ClipArt(root, "train", 16, min_drawings=3, val_percent=1, cache_dir=tmp_path / "cache", log=lambda m: 0)
    assert torch.equal(again.render(thin_i, 160)[0], ds.render(thin_i, 160)[0])


def test_training_crops_and_flips_and_the_protocols(tmp_path):
    root = make_tree(tmp_path / "svg")
    aug = {"scale": [0.3, 1.0], "ratio": [0.75, 1.33], "hflip": 0.5}
    train = build_dataset("clipart", "train", 24, str(root), {"min_drawings": 3, "val_percent": 50,
                          "cache_dir": str(tmp_path / "cache")}, training=True, aug=aug)  # fmt: skip
    torch.manual_seed(0)
    items = [train.render(0, 24)[0] for _ in range(6)]
    assert all(x.shape == (3, 24, 24) for x in items) and len({x.sum().item() for x in items}) > 1  # random crops
    assert "random resized crops (area [0.3, 1.0]" in clipart.clipart_augmentation({}, aug)

    val = dataset(root, "val", 24)
    up = SizedView(val, (48, 48), protocol="upsample", base=(24, 24))[0][0]
    assert torch.equal(up, val.render(0, 48)[0])  # upsample draws at 48 px, it does not resize the 24 px image
    fov = SizedView(val, (48, 48), protocol="fov", base=(24, 24))[0][0]
    ink = (plain(val, fov) < 0.99).any(0)
    rows, cols = ink.any(1).nonzero().flatten(), ink.any(0).nonzero().flatten()
    assert rows.max() - rows.min() < 24 and cols.max() - cols.min() < 24  # the drawing at its 24 px size
    assert torch.equal(fov, val.render_canvas(0, (48, 48))[0])  # the same place every time


def test_a_drawing_that_fails_to_render_is_skipped_and_reported(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "svg")
    real = clipart.render_svg

    def fail_on_first(data, size, timeout=0):
        if b"#002040" in data:  # circle(0)
            raise clipart.RenderError("boom")
        return real(data, size, timeout)

    monkeypatch.setattr(clipart, "render_svg", fail_on_first)
    for split in ("train", "val"):
        plain_ds = dataset(root, split, render_cache=False)
        bad = [i for i, p in enumerate(plain_ds.paths) if p == "animals/c0.svg"]
        if not bad:
            continue
        if split == "train":
            ds = build_dataset("clipart", split, 16, str(root), {"min_drawings": 3, "val_percent": 50,
                               "cache_dir": str(tmp_path / "cache"), "render_cache": False}, training=True)  # fmt: skip
            x, label = ds.render(bad[0], 16)
            assert x is not None and label == ds.labels[(bad[0] + 1) % len(ds)]  # the next drawing
        else:
            ds = plain_ds
            assert ds.render(bad[0], 16)[0] is None  # left out of evaluation
        assert ds.pop_skipped() == [f"{root / 'animals/c0.svg'} (boom)"] and ds.pop_skipped() == []


def test_the_render_deadline_counts_cpu_time_not_waiting():
    import time

    with clipart._Timeout(0.2):
        time.sleep(0.5)  # 0.5 s by the clock, almost no CPU: a loaded machine must not skip a drawing
    with pytest.raises(clipart.RenderError, match="more than 0.2 CPU seconds"), clipart._Timeout(0.2):
        start = time.process_time()
        while time.process_time() - start < 5.0:  # busy: the deadline fires long before this ends
            pass


def test_a_tiny_run_trains_and_evaluates_on_clipart(tmp_path):
    from visionpe.engine import train

    root = make_tree(tmp_path / "svg")
    data = [
        "data.name=clipart",
        f"data.root={root}",
        "data.options.min_drawings=3",
        "data.options.val_percent=50",
        f"data.options.cache_dir={tmp_path / 'cache'}",
        "data.batch_size=4",
    ]
    run = train(None, tiny_run(tmp_path / "runs", data, "train.run_name=run", "eval.resolutions=16,32"))
    rows = json.loads((run / "results.json").read_text())
    assert [r["resolution"] for r in rows] == [16, 32]
    val = dataset(root, "val")
    assert all(r["images"] == len(val) for r in rows)
