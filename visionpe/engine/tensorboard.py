"""Optional TensorBoard logging (`train.log_tensorboard=true`): scalars into `<run dir>/tensorboard`.

Train loss, learning rate and throughput at each metrics line (`train.log_every`), evaluation top-1 / top-5 / loss per
resolution at each evaluation. The `tensorboard` package is optional (`pip install visionpe[tensorboard]`); only the
main process writes.
"""

from __future__ import annotations

from pathlib import Path

from .config import ConfigError

__all__ = ["open_tensorboard", "TENSORBOARD_DIR"]

TENSORBOARD_DIR = "tensorboard"


def open_tensorboard(run_dir: Path, enabled: bool, is_main: bool = True):
    """A SummaryWriter logging into `run_dir/tensorboard`, or None when off or not the main process."""
    if not enabled:
        return None
    try:
        import tensorboard  # noqa: F401  (SummaryWriter imports it lazily; fail before training starts)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "train.log_tensorboard=true needs the tensorboard package: pip install tensorboard "
            "(or pip install visionpe[tensorboard]), or set train.log_tensorboard=false"
        ) from None
    return SummaryWriter(str(Path(run_dir) / TENSORBOARD_DIR)) if is_main else None
