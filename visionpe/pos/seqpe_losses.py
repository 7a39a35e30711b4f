"""SeqPE's two training objectives on its position embeddings (Li et al., arXiv 2506.13277), and their samplers.

- contrastive: for each pivot position, candidates (the pivot excluded) drawn uniformly over the max_position^2
  grid or, with probability `local_rate`, from a window of side 17 around it; the label is the candidate nearest the
  pivot (squared Euclidean distance, the first one on ties), the logits the raw dot products pivot . candidate, the
  loss their cross-entropy.
- transfer (distillation): a block of the reference grid's size shifted out of the training range (offset row or
  column >= the grid's side), `num_cells` of its cells; the teacher is the same cells of the block at the origin,
  detached. Per block, the softmax over each row of the cells' dot-product matrix for the teacher T and the student S;
  the loss is KL(T || S) + KL(S || T) with T fixed, averaged over every entry (PyTorch's 'mean' reduction).

Every draw comes from the torch RNG (of the positions' device), with tensor ops only (no rejection loops).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "contrastive_loss",
    "nearest_labels",
    "sample_contrastive",
    "sample_transfer",
    "transfer_loss",
]

LOCAL_SIDE = 17  # the official window: max(14, sqrt(5 * 64)) rounded down


def nearest_labels(pivots: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Pivots [P, 2] and candidates [P, C, 2] -> the index [P] of each pivot's nearest candidate."""
    return (candidates.float() - pivots.float()[:, None]).square().sum(-1).argmin(-1)


def contrastive_loss(pivot_pe: torch.Tensor, candidate_pe: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the raw dot products pivot [P, D] . candidates [P, C, D] against labels [P]."""
    logits = torch.einsum("pd,pcd->pc", pivot_pe.float(), candidate_pe.float())
    return F.cross_entropy(logits, labels)


def transfer_loss(teacher_pe: torch.Tensor, student_pe: torch.Tensor) -> torch.Tensor:
    """KL(T || S) + KL(S || T) of the row softmaxes of the cells' dot products, teacher [B, n, D] detached; mean over
    the B * n * n entries. 0 when the student's similarities equal the teacher's."""
    t = teacher_pe.detach().float()
    s = student_pe.float()
    log_t = (t @ t.transpose(-1, -2)).log_softmax(-1)
    log_s = (s @ s.transpose(-1, -2)).log_softmax(-1)
    return (log_t.exp() * (log_t - log_s) + log_s.exp() * (log_s - log_t)).mean()


def _skip(index: torch.Tensor, excluded: torch.Tensor) -> torch.Tensor:
    """A uniform draw `index` from n - 1 values mapped onto n values without `excluded`."""
    return index + (index >= excluded).long()


def sample_contrastive(
    num_pivots: int, num_candidates: int, max_position: int, local_rate: float, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pivots [P, 2] and candidates [P, C, 2] (integer (row, col) in 0 .. max_position - 1)."""
    m, c = max_position, num_candidates
    flat = torch.randint(m * m, (num_pivots,), device=device)
    pivots = torch.stack([flat // m, flat % m], -1)
    uniform = _skip(torch.randint(m * m - 1, (num_pivots, c), device=device), flat[:, None])
    uniform = torch.stack([uniform // m, uniform % m], -1)
    w = min(LOCAL_SIDE, m)
    start = (pivots - w // 2).clamp(0, m - w)  # the window inside the grid, around the pivot where it fits
    inside = (pivots - start)[:, 0] * w + (pivots - start)[:, 1]
    j = _skip(torch.randint(w * w - 1, (num_pivots, c), device=device), inside[:, None])
    local = start[:, None] + torch.stack([j // w, j % w], -1)
    use_local = torch.rand(num_pivots, device=device) < local_rate
    return pivots, torch.where(use_local[:, None, None], local, uniform)


def sample_transfer(
    num_blocks: int, num_cells: int, grid: tuple[int, int], max_position: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(teacher cells, student cells), each [B, n, 2]: n cells of the block at the origin, and the same cells of a
    block shifted by an offset (a, b) in [0, max_position - side]^2 with a >= side or b >= side (out of the training
    range), drawn uniformly among those. side: the grid's larger side (the official square grid's)."""
    h, w = grid
    side, span = max(h, w), max_position - max(h, w)  # offsets 0 .. span per axis
    if span < side:
        raise ValueError(
            f"SeqPE's transfer loss shifts the {h} x {w} grid by at least {side} cells and needs max_position >= "
            f"{2 * side}, it is {max_position}; raise max_position or set transfer_weight=0 (pe_kwargs)"
        )
    wide = (span - side + 1) * (span + 1)  # offsets with a >= side
    u = torch.randint(wide + side * (span - side + 1), (num_blocks,), device=device)
    v = u - wide
    a = torch.where(u < wide, side + u // (span + 1), v // (span - side + 1))
    b = torch.where(u < wide, u % (span + 1), side + v % (span - side + 1))
    n = min(num_cells, h * w)
    picked = torch.rand(num_blocks, h * w, device=device).argsort(-1)[:, :n]
    teacher = torch.stack([picked // w, picked % w], -1)
    return teacher, teacher + torch.stack([a, b], -1)[:, None]
