"""`data.native` resolved once for a model: the `NativePlan`, whose mode picks its sampler.

    plan = native_plan(settings, patch=4)  # settings: data.native (engine/config_sections.py NativeConfig)
    plan.sampler                           # PackedSampler | PaddedSampler | AspectBucketSampler

Everything that differs between the modes is a property or method of the sampler class (its batches, its evaluation
and trial keys, its checks, whether its items are patches); no other code reads the mode's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .buckets import DEFAULT_ASPECTS, AspectBucketSampler
from .sampler import PackedSampler, PaddedSampler

__all__ = ["NATIVE_MODES", "NativePlan", "native_mode", "native_plan"]

NATIVE_MODES = {"packed": PackedSampler, "padded": PaddedSampler, "buckets": AspectBucketSampler}


def native_mode(name: str) -> type:
    """The sampler class of data.native.mode `name`."""
    if name not in NATIVE_MODES:
        raise ValueError(f"data.native.mode must be one of {', '.join(NATIVE_MODES)}, got {name!r}")
    return NATIVE_MODES[name]


@dataclass(frozen=True)
class NativePlan:
    """How batches are formed (the resolved data.native settings)."""

    patch: int
    mode: str  # packed | padded | buckets: picks `sampler`
    budgets: tuple[int, ...]  # per-image (packed) or per-batch (padded) token budgets
    tokens_per_batch: int
    row_tokens: int  # packed: tokens per row
    buffer: int
    aspects: tuple[float, ...] = ()  # buckets: aspect ratios W / H
    loader: str = "visionpe"  # or timm (timm_naflex.py)
    eval_tokens: tuple[int, ...] = ()  # budgets evaluated; empty: the largest budget
    sampler: type = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "sampler", native_mode(self.mode))

    @property
    def rows(self) -> int:
        return max(1, self.tokens_per_batch // self.row_tokens)

    @property
    def eval_budgets(self) -> list[int]:
        return list(self.eval_tokens) or [max(self.budgets)]

    def tokens(self, size: tuple[int, int]) -> int:
        """Patches of an image drawn at `size` (px)."""
        return (size[0] // self.patch) * (size[1] // self.patch)


def native_plan(settings, patch: int) -> NativePlan:
    """The NativePlan of data.native settings (a NativeConfig) for a model of `patch` px patches; settings its
    sampler cannot batch (a row too short for the largest budget, a batch shorter than a row, timm's loader for rows
    it does not make) are a one-line error."""
    budgets = tuple(int(b) for b in settings.seq_lens) or (int(settings.max_tokens),)
    plan = NativePlan(
        int(patch),
        settings.mode,
        budgets,
        int(settings.tokens_per_batch),
        int(settings.row_tokens or max(budgets)),
        int(settings.buffer),
        tuple(float(a) for a in settings.aspects) or DEFAULT_ASPECTS,
        settings.loader,
        tuple(int(t) for t in settings.eval_tokens),
    )
    if plan.loader == "timm" and not plan.sampler.naflex:
        raise ValueError("data.native.loader=timm pads every image to its batch's length; set data.native.mode=padded")
    plan.sampler.check_plan(plan)
    return plan
