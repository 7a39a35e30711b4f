"""Position ids of interleaved text / visual sequences: re-exported from `visionpe.pos.mm_positions`, where they
live with the RoPE-ND PE that reads them. Kept so `from visionpe.segments import ...` goes on working."""

from .pos.mm_positions import *  # noqa: F403
from .pos.mm_positions import __all__  # noqa: F401
