"""Writes run_dirs.tar.gz: two run directories as the engine wrote them before issue 46 (one checkpoint path), each
killed after its first checkpoint (step 2 of 8, mid-epoch): `plain` (one process, safetensors) and `sharded`
(train.strategy=fsdp on one process, torch.distributed.checkpoint). tests/test_checkpoint_compat.py resumes them with
today's code. Run once, at the old code, from the repository root: `python tests/data/make_run_dirs.py`.
"""

import io
import multiprocessing
import os
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from test_checkpoint_compat import ARGS  # noqa: E402  (the overrides the test resumes with)


def _train_then_die(out: str, name: str) -> None:
    from visionpe.attention.backends import attn_backend
    from visionpe.engine import train

    os.environ["VISIONPE_FAULT_KILL_AT"] = "pruned,1"  # the first checkpoint written: the run stops there
    with attn_backend("sdpa"):
        train(None, [*ARGS[name], f"train.output_dir={out}", f"train.run_name={name}"])


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        for name in ARGS:
            child = multiprocessing.get_context("spawn").Process(target=_train_then_die, args=(out, name))
            child.start()
            child.join(300)
            assert child.exitcode == -9, child.exitcode
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tar:
            for name in ARGS:
                for p in sorted((Path(out) / name).rglob("*")):
                    if p.name != ".lock":
                        tar.add(p, arcname=str(p.relative_to(out)), recursive=False)
        (HERE / "run_dirs.tar.gz").write_bytes(buf.getvalue())
        print(f"wrote {HERE / 'run_dirs.tar.gz'} ({len(buf.getvalue()) // 1024} KiB)")


if __name__ == "__main__":
    main()
