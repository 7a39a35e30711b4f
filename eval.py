"""Evaluate a checkpoint at several resolutions:
`python eval.py --checkpoint RUN_DIR_OR_FILE --resolutions 28,42,56 [key=value ...] [--json PATH] [--csv PATH]`
(= `visionpe-eval`).
"""

from visionpe.engine.cli import eval_main

if __name__ == "__main__":
    raise SystemExit(eval_main())
