"""Old home of the CPE kind: `PEG` is now `visionpe.pos.cpe.CPE` (alias kept)."""

from .cpe import CPE, PEG, grid_tokens, tokens_from_grid

__all__ = ["CPE", "PEG", "grid_tokens", "tokens_from_grid"]
