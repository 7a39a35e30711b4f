"""`python -m visionpe.bench <command>` (or `visionpe-bench`): the commands below, each with its own `--help`."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {  # command: (module, one line of help)
    "extrapolate": (
        "visionpe.bench.extrapolate",
        "train over seeds (image, video, image-text), evaluate at other sizes and clip lengths",
    ),
    "segment": (
        "visionpe.bench.segmentation.segment",
        "train a linear segmentation head over seeds, evaluate mIoU at other sizes and fields of view",
    ),
    "speed": ("visionpe.bench.perf.speed", "images/s, peak memory, parameters, GFLOPs: ratios vs a baseline and timm"),
    "gpu-check": (
        "visionpe.bench.perf.gpu_check",
        "attention backends agree per PE; ViT-B/16 images/s, memory per backend",
    ),
    "leaderboard": (
        "visionpe.bench.leaderboard",
        "rank every image PE per benchmark and protocol: results/leaderboard.md",
    ),
    "cards": ("visionpe.bench.cards", "write model_cards/<family>.md from the results under results/"),
    "fsdp-memory": (
        "visionpe.bench.perf.fsdp_memory",
        "bytes per rank of parameters, gradients and AdamW state under FSDP",
    ),
    "native-speed": ("visionpe.bench.perf.native_speed", "packed vs padded vs square-resized native batches: images/s"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        listed = "\n".join(f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items())
        print(f"usage: visionpe-bench {{{','.join(COMMANDS)}}} [options]\n\n{listed}\n\n"
              "`visionpe-bench <command> --help` lists the options of a command.")  # fmt: skip
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nerror: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    from visionpe.engine.cli import USER_ERRORS, user_error

    try:
        return int(importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:]) or 0)
    except USER_ERRORS as e:  # bad input: one line (VISIONPE_DEBUG=1 for the traceback)
        return user_error(e)


if __name__ == "__main__":
    raise SystemExit(main())
