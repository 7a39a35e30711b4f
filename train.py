"""Train any registered model: `python train.py -c configs/quick.yaml [key=value ...] [--resume [RUN_DIR]]`.

Under `torchrun --nproc_per_node N train.py ...` the same command trains with DDP. `--help` lists every config key.
"""

from visionpe.engine.cli import train_main

if __name__ == "__main__":
    raise SystemExit(train_main())
