"""Datasets, transforms and multi-resolution batching."""

from .registry import DATASETS, DatasetInfo, get_dataset_info, register_dataset

__all__ = ["DATASETS", "DatasetInfo", "get_dataset_info", "register_dataset"]
