"""Reading torch.distributed.checkpoint (DCP) folders without running code from them.

DCP keeps its index (`.metadata`) as a pickle and non-tensor values (optimizer hyperparameters) as torch.save
pickles, and its FileSystemReader and default load planner unpickle both without restriction: a crafted checkpoint
would run code the moment it is loaded. Here the index is read by an unpickler that admits only the classes DCP's own
index holds (as today's torch writes it), the files it names must be plain names inside the folder, and values are
read with torch.load(weights_only=True); anything else is a CheckpointError naming the file.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from .checkpoint import CheckpointError, is_plain_name

__all__ = ["read_dcp_metadata", "dcp_load"]

METADATA_FILE = ".metadata"

# what a `.metadata` pickle names (found by listing the globals of one written by torch 2.x's dcp.save)
_DCP_CLASSES = (
    "Metadata",
    "MetadataIndex",
    "ChunkStorageMetadata",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "TensorProperties",
    "StorageMeta",
    "_MEM_FORMAT_ENCODING",
)
_ALLOWED = {("torch.distributed.checkpoint.metadata", n) for n in _DCP_CLASSES} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name (torch.strided)
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
    ("pathlib", "PurePosixPath"),
}


class _IndexUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) not in _ALLOWED:
            raise CheckpointError(
                f"refusing {self.path}: it names {module}.{name}, which a checkpoint's index never holds (a crafted "
                f"file, possibly made to run code); load only checkpoints this project wrote"
            )
        return super().find_class(module, name)


def read_dcp_metadata(folder: str | os.PathLike) -> Metadata:
    """The DCP index of a checkpoint folder, unpickled with only DCP's own classes admitted."""
    path = Path(folder) / METADATA_FILE
    try:
        with open(path, "rb") as f:
            meta = _IndexUnpickler(f, path).load()
    except CheckpointError:
        raise
    except Exception as e:  # truncated or foreign bytes: pickle raises many kinds of error
        raise CheckpointError(f"cannot read {path} ({type(e).__name__}: {e})") from None
    if not isinstance(meta, Metadata) or not isinstance(meta.state_dict_metadata, dict):
        raise CheckpointError(f"{path} is not a DCP checkpoint index (it holds a {type(meta).__name__})")
    for info in (meta.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not is_plain_name(name):
            raise CheckpointError(f"refusing {path}: it names data file {name!r}, not a plain name in {folder}")
    return meta


class _Reader(FileSystemReader):
    """DCP's file reader, handed the index read by read_dcp_metadata."""

    def __init__(self, folder: str | os.PathLike, meta: Metadata):
        super().__init__(folder)
        self.meta = meta

    def read_metadata(self) -> Metadata:  # no **kwargs: DCP then never falls back to per-rank index files
        meta = self.meta
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta


class _Planner(DefaultLoadPlanner):
    """DCP's default load planner, non-tensor values read with weights_only=True."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            with warnings.catch_warnings():  # a crafted value's pickle protocol is not worth a warning
                warnings.simplefilter("ignore")
                obj = torch.load(value, map_location="cpu", weights_only=True)
        except Exception:  # torch's message suggests weights_only=False: the one thing not to do here
            raise CheckpointError(
                f"refusing the value {read_item.dest_index.fqn} of a checkpoint: it is not plain data (numbers, "
                f"strings, tensors) and may be crafted to run code; load only checkpoints this project wrote"
            ) from None
        plain = io.BytesIO()  # handed on re-saved, so DCP's own unrestricted torch.load sees only plain data
        torch.save(obj, plain)
        plain.seek(0)
        super().load_bytes(read_item, plain)


def dcp_load(state: dict, folder: str | os.PathLike, no_dist: bool = False) -> None:
    """dcp.load into `state` from `folder` with the restricted reader and planner; our errors come out as they are
    (DCP wraps every failure in a multi-line CheckpointException)."""
    meta = read_dcp_metadata(folder)  # a refused index fails here, before DCP logs its own warnings about it
    try:
        dcp.load(state, storage_reader=_Reader(folder, meta), planner=_Planner(), no_dist=no_dist)
    except CheckpointException as e:
        for exc, _ in e.failures.values():
            if isinstance(exc, CheckpointError):
                raise CheckpointError(str(exc)) from None
        raise
