"""Data: datasets by name (datasets/, registered on import), native-resolution batching (native/), and what every
loader shares: the registry, the loaders, splits, seeding, multi-resolution batches and streams."""

from . import datasets  # noqa: F401  (registers every dataset)
from .loader import build_dataset, build_eval_loader, build_train_loader, dataset_num_classes
from .multires import Batch, ResolutionBatchSampler, collate_to_resolution, resize_to
from .registry import DATASETS, DatasetInfo, get_dataset_info, register_dataset

__all__ = [
    "DATASETS",
    "Batch",
    "DatasetInfo",
    "ResolutionBatchSampler",
    "build_dataset",
    "build_eval_loader",
    "build_train_loader",
    "collate_to_resolution",
    "dataset_num_classes",
    "get_dataset_info",
    "register_dataset",
    "resize_to",
]
