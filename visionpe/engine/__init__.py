"""Training and evaluation: configs, the training loop, checkpoints, distributed setup, multi-resolution evaluation.

from visionpe.engine import load_config, train, evaluate_checkpoint
run_dir = train(load_config("configs/quick.yaml", ["train.epochs=2"]))
rows = evaluate_checkpoint(run_dir, resolutions=[24, 32, 48])  # [{"resolution", "top1", "top5", "loss", ...}]
"""

from .checkpoint import CheckpointError, find_checkpoint, load_weights
from .config import Config, ConfigError, apply_overrides, config_keys, format_config_help, load_config
from .distributed import DistContext, init_distributed
from .evaluate import (
    evaluate_checkpoint,
    evaluate_loader,
    evaluate_model,
    evaluate_resolutions,
    format_table,
    load_checkpoint,
)
from .trainer import SkippedImagesWarning, Trainer, train

__all__ = [
    "CheckpointError",
    "Config",
    "ConfigError",
    "DistContext",
    "SkippedImagesWarning",
    "Trainer",
    "apply_overrides",
    "config_keys",
    "evaluate_checkpoint",
    "evaluate_loader",
    "evaluate_model",
    "evaluate_resolutions",
    "find_checkpoint",
    "format_config_help",
    "format_table",
    "init_distributed",
    "load_checkpoint",
    "load_config",
    "load_weights",
    "train",
]
