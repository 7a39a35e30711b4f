"""SeqPE's training objectives (visionpe.pos.seqpe_losses): labels, samplers and losses against their definitions."""

import math

import pytest
import torch
import torch.nn.functional as F

from visionpe.pos.seqpe_losses import (
    LOCAL_SIDE,
    contrastive_loss,
    nearest_labels,
    sample_contrastive,
    sample_transfer,
    transfer_loss,
)


def test_the_label_is_the_nearest_candidate_by_squared_distance():
    pivots = torch.tensor([[5, 5], [0, 0]])
    cands = torch.tensor([[[9, 9], [5, 7], [6, 6], [0, 0]], [[3, 0], [2, 2], [0, 4], [1, 3]]])
    # (5, 5): distances 32, 4, 2, 50 -> 2; (0, 0): 9, 8, 16, 10 -> 1
    assert nearest_labels(pivots, cands).tolist() == [2, 1]


def test_contrastive_loss_is_the_cross_entropy_of_raw_dot_products():
    torch.manual_seed(0)
    piv, cand, labels = torch.randn(3, 5), torch.randn(3, 4, 5), torch.tensor([0, 3, 1])
    want = sum(-torch.log_softmax(cand[p] @ piv[p], 0)[labels[p]] for p in range(3)) / 3
    assert abs(float(contrastive_loss(piv, cand, labels) - want)) <= 1e-6


def test_contrastive_draws_exclude_the_pivot_stay_on_the_grid_and_repeat_from_the_seed():
    torch.manual_seed(3)
    piv, cand = sample_contrastive(200, 64, 100, 0.5)
    torch.manual_seed(3)
    piv2, cand2 = sample_contrastive(200, 64, 100, 0.5)
    assert torch.equal(piv, piv2) and torch.equal(cand, cand2)
    assert cand.min() >= 0 and cand.max() <= 99 and piv.max() <= 99
    assert not (cand == piv[:, None]).all(-1).any()  # the pivot is never its own candidate
    spread = (cand - piv[:, None]).abs().amax((1, 2))
    local = spread <= LOCAL_SIDE - 1  # a window's draws lie within 16 cells of the pivot
    assert 60 < int(local.sum()) < 140  # about half the pivots (local_rate 0.5), uniform draws spread wider


def test_transfer_blocks_lie_out_of_the_training_range_and_keep_the_cells():
    torch.manual_seed(0)
    teacher, student = sample_transfer(500, 64, (14, 14), 100)
    shift = student - teacher
    assert (shift == shift[:, :1]).all()  # one offset per block
    a, b = shift[:, 0, 0], shift[:, 0, 1]
    assert ((a >= 14) | (b >= 14)).all() and a.min() >= 0 and b.min() >= 0 and student.max() <= 99
    assert teacher.max() <= 13 and teacher.shape == (500, 64, 2)
    assert all(len(set(map(tuple, t.tolist()))) == 64 for t in teacher[:20])  # cells without repeats
    assert int((a < 14).sum()) > 0 and int((b < 14).sum()) > 0  # both kinds of offset are drawn
    with pytest.raises(ValueError, match="max_position >= 28.*raise max_position or set transfer_weight=0"):
        sample_transfer(2, 8, (14, 14), 27)


def test_transfer_loss_is_zero_for_the_teacher_itself_and_reaches_only_the_student():
    torch.manual_seed(0)
    t = torch.randn(2, 6, 8)
    assert abs(float(transfer_loss(t, t.clone()))) <= 1e-6
    s = torch.randn(2, 6, 8, requires_grad=True)
    t.requires_grad_(True)
    loss = transfer_loss(t, s)
    loss.backward()
    assert float(loss.detach()) > 0 and t.grad is None and s.grad.abs().sum() > 0
    log_t = (t.detach() @ t.detach().transpose(-1, -2)).log_softmax(-1)
    log_s = (s.detach() @ s.detach().transpose(-1, -2)).log_softmax(-1)
    kl = dict(log_target=True, reduction="sum")
    want = F.kl_div(log_s, log_t, **kl) + F.kl_div(log_t, log_s, **kl)  # KL(T || S) + KL(S || T)
    assert math.isclose(float(loss.detach()), float(want) / log_t.numel(), rel_tol=1e-5)
