"""Command lines of train.py and eval.py (kept here so that they are importable and testable)."""

from __future__ import annotations

import argparse
import errno
import os
import sys

from .checkpoint import CheckpointError
from .config import ConfigError, format_config_help
from .destinations import DestinationError, check_destination
from .distributed import CollectiveError
from .interrupt import TrainingInterrupted

__all__ = ["train_main", "eval_main", "user_error", "USER_ERRORS"]

USER_ERRORS = (ConfigError, CheckpointError, FileNotFoundError, ValueError, FloatingPointError, CollectiveError)


def user_error(e: Exception) -> int:
    """Report a bad input or a known failure in one line (the traceback with VISIONPE_DEBUG=1); exit status 2."""
    if os.environ.get("VISIONPE_DEBUG"):
        raise e
    if getattr(e, "every_rank", False) and os.environ.get("RANK", "0") != "0":
        return 2  # the same line as rank 0's
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        e = f"disk full writing {e.filename or 'a file'} ({e.strerror}); free space and rerun (--resume continues)"
    print(f"error: {e}\n(set VISIONPE_DEBUG=1 for the traceback)", file=sys.stderr)
    return 2


def _is_disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def _parse_resolutions(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").strip("[]").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--resolutions takes integers like 28,42,56, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"--resolutions takes positive integers like 28,42,56, got {text!r}")
    return values


def positive_int(text: str) -> int:
    """An argparse type: a whole number above 0 (a size, a count)."""
    value = int(text) if text.strip().isdigit() else 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"takes whole numbers above 0, got {text!r}")
    return value


def train_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Train a registered model: a YAML recipe, then key=value overrides "
        "(e.g. model.name=vit_n_rope2d data.root=/data/imagenet train.epochs=2). Works under torchrun.",
        epilog="config keys (default, then help):\n" + format_config_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-c", "--config", help="YAML file or packaged recipe name (e.g. quick); defaults apply without one"
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="RUN_DIR",
        type=os.path.expanduser,
        help="continue the run the config names, or the given run directory (with its saved config)",
    )
    parser.add_argument(
        "--accept-changes",
        action="store_true",
        help="with --resume: continue with overrides that change what was trained (optimizer, lr, data, ...); "
        "the change and its step are recorded in the run's config_changes.jsonl",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    args = parser.parse_args(argv)
    if isinstance(args.resume, str) and "=" in args.resume:  # `--resume key=value ...`: an override, not a run dir
        args.overrides.insert(0, args.resume)
        args.resume = True
    from .trainer import train  # after argparse: --help stays fast

    try:
        train(args.config, args.overrides, resume=args.resume, accept_changes=args.accept_changes)
    except TrainingInterrupted as e:  # SIGTERM / SIGINT: a checkpoint was written at the step it arrived
        if os.environ.get("RANK", "0") == "0":
            print(e, file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:  # Ctrl-C before training started (or a second one): nothing new was saved
        print("interrupted (Ctrl-C) before a checkpoint could be written; nothing new was saved", file=sys.stderr)
        return 130
    except USER_ERRORS as e:
        return user_error(e)
    except OSError as e:
        if not _is_disk_full(e):
            raise
        return user_error(e)
    return 0


def eval_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Evaluate a checkpoint at several resolutions: top-1, top-5 and loss per resolution. "
        "Overrides (key=value) are applied to the checkpoint's config, e.g. data.root=... data.eval_batch_size=256.",
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        type=os.path.expanduser,
        help="a run directory (its latest checkpoint) or .safetensors",
    )
    parser.add_argument(
        "--resolutions",
        type=_parse_resolutions,
        default=None,
        help="comma-separated resolutions, e.g. 28,42,56 (default: the run's eval.resolutions)",
    )
    parser.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    parser.add_argument(
        "--json",
        type=os.path.expanduser,
        help="write the results as a JSON list of {resolution, top1, top5, loss, images}",
    )
    parser.add_argument("--csv", type=os.path.expanduser, help="write the results as CSV with the same columns")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (data.*, train.device)")
    args = parser.parse_args(argv)
    from .distributed import init_distributed, shutdown
    from .evaluate import evaluate_checkpoint, format_table, write_csv, write_json

    ctx = None
    try:
        for flag, dest in (("--json", args.json), ("--csv", args.csv)):  # before the evaluation, not after it
            if dest:
                check_destination(dest, flag, create=False)
        device = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("train.device=")), "auto")
        ctx = init_distributed(device)
        rows = evaluate_checkpoint(args.checkpoint, args.resolutions, args.overrides, args.ema, ctx)
    except USER_ERRORS as e:
        return user_error(e)
    finally:
        if ctx is not None:
            shutdown(ctx)
    if ctx.is_main:
        print(format_table(rows, f"{args.checkpoint}{' (EMA)' if args.ema else ''}:"))
        try:
            if args.json:
                write_json(rows, args.json, "--json")
            if args.csv:
                write_csv(rows, args.csv, "--csv")
        except DestinationError as e:  # e.g. the disk filled up during the evaluation: the table is printed above
            return user_error(e)
    return 0
