"""Datasets, transforms and multi-resolution batching."""

from . import (  # noqa: F401
    canvas,
    clipart,
    clipart_scenes,
    fashion_mnist,
    folders,
    image_text,
    native_canvas,
    synthetic_shapes,
    timm_readers,
    video_shapes,
)
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
