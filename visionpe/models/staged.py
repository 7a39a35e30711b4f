"""What the staged backbones (Swin, CvT) share of timm's feature API: per-stage intermediates and pruning.

A subclass names its stage list (`stage_attr`) and their widths (`width_attr`), the output formats it takes and the
pool a head pruned to an earlier stage gets, and runs one stage at a time: `_begin(x)` (checks, embedding),
`_run_stage(s, x) -> (stage features in the model's own form, input of the next stage)` and `_format(y, nxt, s,
output_fmt)` (features -> the requested format).
"""

from __future__ import annotations

import torch
from timm.models._features import feature_take_indices
from torch import nn

from .construction import ContractModel

__all__ = ["StagedModel"]


class StagedModel(ContractModel):
    stage_attr = "stages"  # attribute holding the nn.ModuleList of stages
    width_attr = "dims"  # attribute holding each stage's width
    pruned_pool = ""  # the head's pool after pruning to an earlier stage

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str | None = None,
        intermediates_only: bool = False,
        output_dict: bool = False,
    ):
        """Per-stage features (timm's API) in `output_fmt` (default the first of `intermediate_formats`); `norm`
        applies the final norm to the last stage; output_dict: timm's dict form (`image_intermediates`,
        `image_features`)."""
        output_fmt = self.intermediate_format(output_fmt)
        n = len(getattr(self, self.stage_attr))
        take_indices, max_index = feature_take_indices(n, indices)
        last = max_index if stop_early else n - 1
        x = self._begin(x)
        intermediates = []
        for s in range(last + 1):
            y, x = self._run_stage(s, x)
            if s in take_indices:
                intermediates.append(self._format(self.norm(y) if norm and s == n - 1 else y, x, s, output_fmt))
        final = None if intermediates_only else self.norm(y) if last == n - 1 else y
        if output_dict:
            return dict(image_intermediates=intermediates) | ({} if final is None else dict(image_features=final))
        return intermediates if intermediates_only else (final, intermediates)

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head=True):
        """Keep the stages up to the last of `indices` (timm's API); each block's PE state goes with it."""
        stages = getattr(self, self.stage_attr)
        take_indices, max_index = feature_take_indices(len(stages), indices)
        prune_end = max_index < len(stages) - 1
        setattr(self, self.stage_attr, stages[: max_index + 1])
        self.stage_starts = self.stage_starts[: max_index + 1]
        self.set_pe_host(self._host(), tuple(b.attn.pos for b in self._blocks()))  # stage-shared PE state goes too
        if prune_norm or prune_end:
            self.norm = nn.Identity()
        if prune_end:
            self.num_features = self.head_hidden_size = getattr(self, self.width_attr)[max_index]
        if prune_head or prune_end:
            self.reset_classifier(0, self.pruned_pool if prune_end else "")
        return take_indices
