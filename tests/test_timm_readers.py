"""Names timm reads (hfds/, wds/, tfds/) go to timm.data.create_dataset with our split, root and options."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import IterableDataset

import visionpe.data.datasets.timm_readers as timm_readers
from visionpe.data import build_dataset, dataset_num_classes, get_dataset_info


class _Reader:
    class_to_idx = {"cat": 0, "dog": 1, "fox": 2}


class _FakeMapDataset:
    """What timm's ImageDataset gives without a transform: (RGB PIL image, class)."""

    reader = _Reader()

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        return Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)), i % 3


def _record(monkeypatch, result) -> list:
    calls = []

    def fake_create_dataset(name, **kwargs):
        calls.append((name, kwargs))
        return result

    monkeypatch.setattr(timm_readers, "create_dataset", fake_create_dataset)
    return calls


def test_hfds_names_are_routed_to_timm_with_split_root_and_options(monkeypatch):
    calls = _record(monkeypatch, _FakeMapDataset())
    info = get_dataset_info("hfds/someone/pets")
    ds = build_dataset(info, "validation", 24, root="/data/hf", options={"target_key": "label"}, training=False)
    name, kwargs = calls[0]
    assert name == "hfds/someone/pets"
    assert kwargs["root"] == "/data/hf" and kwargs["split"] == "validation" and kwargs["target_key"] == "label"
    assert kwargs["is_training"] is False and kwargs["input_img_mode"] == "RGB" and kwargs["class_map"] is None
    assert len(ds) == 5 and dataset_num_classes(info, ds) == 3 and ds.class_to_idx == _Reader.class_to_idx
    x, y = ds[4]
    assert x.shape == (3, 24, 24) and y == 1
    assert ds.render(4, 32)[0].shape == (3, 32, 32)
    build_dataset(info, "train", 24, training=True, class_map={"cat": 0, "dog": 1, "fox": 2})
    assert calls[1][1]["is_training"] is True and calls[1][1]["class_map"] == _Reader.class_to_idx


@pytest.mark.parametrize("name", ["wds/shards", "TFDS/cifar10", "hfids/someone/pets"])
def test_streaming_readers_become_streams(monkeypatch, name):
    class Stream(IterableDataset):
        reader = _Reader()

        def __iter__(self):
            return iter(())

    calls = _record(monkeypatch, Stream())
    if name.startswith("wds"):
        monkeypatch.setattr(timm_readers, "_check_wds_root", lambda *a: None)
        monkeypatch.setattr(timm_readers, "_check_wds_shards", lambda *a: None)
    ds = build_dataset(name, "train", 24, options={"train_num_samples": 10}, training=True, stream_batch_size=4)
    assert isinstance(ds, timm_readers.TimmStreamDataset) and ds.num_classes == 3
    assert calls[0][0] == name  # the prefix's case is timm's business: passed as given
    assert calls[0][1]["num_samples"] == 10 and calls[0][1]["batch_size"] == 4


def test_other_names_stay_unknown():
    with pytest.raises(ValueError, match="unknown dataset 'hfds/'"):
        get_dataset_info("hfds/")
    with pytest.raises(ValueError, match="unknown dataset"):
        get_dataset_info("s3/bucket")


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="Hugging Face datasets is installed")
def test_missing_backend_names_the_package():
    with pytest.raises(ImportError, match="pip install datasets") as e:
        build_dataset("hfds/someone/pets", "train", 24)
    assert "\n" not in str(e.value)


def test_a_reader_without_classes_needs_num_classes(monkeypatch):
    ds = _FakeMapDataset()
    ds.reader = None
    _record(monkeypatch, ds)
    with pytest.raises(ValueError, match="data.options.num_classes"):
        build_dataset("hfds/x", "train", 24)
    assert build_dataset("hfds/x", "train", 24, options={"num_classes": 7}).num_classes == 7
    assert torch.is_tensor(build_dataset("hfds/x", "train", 24, options={"num_classes": 7})[0][0])


def test_a_reader_of_the_other_kind_is_refused(monkeypatch):
    _record(monkeypatch, _FakeMapDataset())  # random access: not a stream
    with pytest.raises(ValueError, match="reads 'hfds/x' by index; it is a TimmReaderDataset, not a TimmStream"):
        timm_readers.TimmStreamDataset("hfds/x", None, "train", 24)
    assert len(timm_readers.TimmReaderDataset("hfds/x", None, "train", 24)) == 5
