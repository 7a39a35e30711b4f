"""Train any registered model: `python train.py -c quick [key=value ...] [--resume [RUN_DIR]]` (= `visionpe-train`).

Under `torchrun --nproc_per_node N train.py ...` the same command trains with DDP. `--help` lists every config key.
"""

from visionpe.engine.cli import train_main

if __name__ == "__main__":
    raise SystemExit(train_main())
