"""STRING (Cayley / Circulant) and Spiral RoPE: the papers' properties and the official Spiral code's maths."""

from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn.functional as F

from visionpe.layout.tokens import image_layout
from visionpe.pos.base import AttnSpec, PEHost
from visionpe.pos.rope2d_spiral import RoPE2DSpiral, spiral_frequencies
from visionpe.pos.string import STRING, cayley, circulant_basis, circulant_sines


def _host(d: int = 16, heads: int = 2, depth: int = 2) -> PEHost:
    return PEHost(dim=d * heads, grid=(5, 5), num_prefix=0, layers=(AttnSpec(d * heads, heads, d, None),) * depth)


def _rope(r: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Block-diagonal RoPE [d, d] at position r [2] for frequencies [2, d/2] (pair (a, b) -> rotation by +angle)."""
    angles = (r.to(freqs) @ freqs).detach()
    out = torch.zeros(2 * len(angles), 2 * len(angles), dtype=freqs.dtype)
    for j, a in enumerate(angles):
        out[2 * j : 2 * j + 2, 2 * j : 2 * j + 2] = torch.tensor([[a.cos(), -a.sin()], [a.sin(), a.cos()]])
    return out


def _circulant(c: torch.Tensor) -> torch.Tensor:
    """C with C z = c (circular convolution) z: C[n, j] = c[(n - j) mod d]."""
    d = len(c)
    idx = (torch.arange(d)[:, None] - torch.arange(d)[None, :]) % d
    return c[idx]


def test_circulant_string_is_the_exponential_of_its_generators():
    """exp(sum_k r_k (C_k - C_k^T)) = B^T RoPE(r) B with frequencies c @ W: 2 dead dims, c_0 has no effect."""
    torch.manual_seed(0)
    d = 12
    c = torch.randn(2, d, dtype=torch.float64)
    basis, freqs = circulant_basis(d), c @ circulant_sines(d)
    torch.testing.assert_close(basis @ basis.T, torch.eye(d, dtype=torch.float64))
    worst = 0.0
    for r in (torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.0]), torch.tensor([2.5, -3.0]), torch.randn(2) * 4):
        gen = sum(rk * (_circulant(ck) - _circulant(ck).T) for rk, ck in zip(r.double(), c))
        exact = torch.linalg.matrix_exp(gen)
        ours = basis.T @ _rope(r.double(), freqs) @ basis
        worst = max(worst, (exact - ours).abs().max().item())
    assert worst < 1e-12, worst  # measured: ~4e-14
    assert (freqs[:, -1] == 0).all()  # DC and Nyquist: never rotated
    bumped = c.clone()
    bumped[:, 0] += 1.0
    torch.testing.assert_close(bumped @ circulant_sines(d), freqs)


def test_cayley_is_orthogonal_and_identity_at_zero():
    torch.manual_seed(0)
    a = torch.randn(3, 8, 8, dtype=torch.float64)
    p = cayley(a - a.transpose(-1, -2))
    torch.testing.assert_close(p.transpose(-1, -2) @ p, torch.eye(8, dtype=torch.float64).expand(3, 8, 8))
    torch.testing.assert_close(torch.linalg.det(p), torch.ones(3, dtype=torch.float64))
    s = a - a.transpose(-1, -2)
    eye = torch.eye(8, dtype=torch.float64)
    torch.testing.assert_close(p, (eye - s) @ torch.linalg.inv(eye + s))  # the paper's (I - S)(I + S)^-1
    torch.testing.assert_close(cayley(torch.zeros(8, 8)), torch.eye(8))


@pytest.mark.parametrize("variant", ["cayley", "circulant"])
def test_string_is_relative(variant):
    """R(x)^T R(y) = R(y - x) with R = P^T RoPE P (trained-like random parameters), and the module's q . k depends
    only on the offset (positions shifted by a constant give the same logits)."""
    torch.manual_seed(0)
    pe = STRING(_host(), variant=variant)
    own = pe.layer(1)
    with torch.no_grad():
        for p in own.parameters():
            p.normal_(0, 0.3)
    basis, freqs = (t.double() for t in pe.layer_parts(1, own))
    rot = lambda r, h: basis[min(h, len(basis) - 1)].T @ _rope(r, freqs[:, h]) @ basis[min(h, len(basis) - 1)]  # noqa: E731
    worst = 0.0
    for _ in range(5):
        x, y = torch.randn(2) * 5, torch.randn(2) * 5
        for h in range(2):
            worst = max(worst, (rot(x, h).T @ rot(y, h) - rot(y - x, h)).abs().max().item())
    assert worst < 1e-5, worst  # fp32 parameters; measured ~5e-7
    layout = image_layout(4, 5)
    q, k = torch.randn(2, 2, 20, 16), torch.randn(2, 2, 20, 16)
    logits = [
        (lambda qk: qk[0] @ qk[1].transpose(-1, -2))(pe.context(1, lay, None, own).rotate(q, k))
        for lay in (layout, layout.with_pos(layout.pos + torch.tensor([3.0, -7.0])))
    ]
    torch.testing.assert_close(logits[0], logits[1], atol=2e-4, rtol=1e-4)


def test_cayley_string_at_zero_skew_is_rope_mixed():
    """S = 0: vit_n_string_cayley with rope2d_mixed's frequencies gives rope2d_mixed's output exactly."""
    torch.manual_seed(0)
    mixed = timm.create_model("vit_n_rope2d_mixed", num_classes=3).eval()
    string = timm.create_model("vit_n_string_cayley", num_classes=3).eval()
    state = {k: v for k, v in mixed.state_dict().items() if "freqs" not in k}
    string.load_state_dict(state, strict=False)
    pe = string.pe.encodings["string"]
    own = [b.attn.pos["string"] for b in string.blocks]
    with torch.no_grad():
        for o, b in zip(own, mixed.blocks):
            o.freqs.copy_(b.attn.pos["rope2d"].freqs)
    x = torch.randn(2, 3, 40, 32)  # off the reference size too
    with torch.no_grad():
        torch.testing.assert_close(string(x), mixed(x), atol=1e-5, rtol=1e-5)
        q = torch.randn(1, 4, 16, 24)
        before = pe.context(0, image_layout(4, 4), None, own[0]).rotate(q, q)[0]
        own[0].skews.normal_()
        after = pe.context(0, image_layout(4, 4), None, own[0]).rotate(q, q)[0]
        assert (after - before).abs().max() > 0.1  # a learned P acts
    string.train()
    string(x).sum().backward()
    params = [p for o in own for p in o.parameters()]
    assert params and all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    assert {"blocks.0.attn.pos.string.skews", "blocks.0.attn.pos.string.freqs"} <= string.no_weight_decay()


def test_circulant_string_starts_at_rope_mixed_frequencies():
    torch.manual_seed(0)
    pe = STRING(_host(), variant="circulant")
    torch.manual_seed(0)
    own = pe.layer(0)  # layer 0's c, drawn as a construction draws it
    torch.manual_seed(0)
    from visionpe.pos.rope2d import mixed_frequencies

    want = mixed_frequencies(16, 1, 2, 10.0)[:, 0]
    _, freqs = pe.layer_parts(0, own)
    torch.testing.assert_close(freqs[..., :-1], want[..., :-1], atol=1e-5, rtol=1e-5)
    assert freqs[..., -1].abs().max() < 1e-5


# ------------------------------------------------------------------------------------------------- Spiral RoPE


def _official_ladder(dim: int, max_freq: float, theta: float) -> torch.Tensor:
    """The official frequency rule (rotate > 0, same_theta False, min 0): a geometric ladder from min to max."""
    low = max_freq / theta ** ((dim - 2) / dim)
    half = dim // 2
    return low * (max_freq / low) ** (torch.arange(half - 1, -1, -1, dtype=torch.float64) / (half - 1))


def _official_angle_map(n: int, head_dim: int, rotate: int, max_freq: float, theta: float) -> torch.Tensor:
    """The official construction re-derived: per-axis angles t * f on adjacent pairs, the row half then the column
    half, channel groups of 4R whose sub-block i is rotated as an image by i * 90 / R degrees (bilinear, border)."""
    dim = head_dim // 2
    f = _official_ladder(dim, max_freq, theta).float().repeat_interleave(2)  # [dim]
    t = torch.arange(n, dtype=torch.float32)
    rows = (t[:, None, None] * f).expand(n, n, dim)  # varies with the first (row) index
    cols = (t[None, :, None] * f).expand(n, n, dim)
    ang = torch.cat([rows, cols], -1).reshape(n, n, -1, 4 * rotate).clone()
    for i in range(1, rotate):
        a = math.radians(i * 90 / rotate)
        block = ang[..., 4 * i : 4 * i + 4].reshape(n, n, -1).permute(2, 0, 1)[None]
        mat = torch.tensor([[[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]]])
        grid = F.affine_grid(mat, list(block.shape), align_corners=True)
        out = F.grid_sample(block, grid, mode="bilinear", padding_mode="border", align_corners=True)
        ang[..., 4 * i : 4 * i + 4] = out[0].permute(1, 2, 0).reshape(n, n, -1, 4)
    return ang.reshape(n, n, head_dim)[..., 0::2]  # one angle per pair


def test_spiral_frequencies_follow_the_official_rule():
    freqs = spiral_frequencies(64, rotate=2, max_freq=1.5, theta=10000.0)
    ladder = _official_ladder(32, 1.5, 10000.0)
    magnitude = freqs.double().norm(dim=0)
    torch.testing.assert_close(magnitude, ladder.repeat(2), rtol=1e-6, atol=0)
    assert abs(ladder[0].item() - 1.5) < 1e-12 and abs(ladder[1].item() - 0.8435) < 1e-4
    # directions from the row axis toward the column axis: 0, 45 (row half), 90, 135 degrees (column half)
    phi = torch.rad2deg(torch.atan2(freqs[0], freqs[1])).round() % 180
    want = torch.tensor([[0, 0, 45, 45][p % 4] + 90 * (p >= 16) for p in range(32)], dtype=phi.dtype)
    assert torch.equal(phi, want)
    axial = spiral_frequencies(16, rotate=1)  # R = 1: axial RoPE, rows then columns
    assert (axial[0, :4] == 0).all() and (axial[1, 4:] == 0).all()


@pytest.mark.parametrize("rotate", [2, 3])
def test_spiral_matches_the_official_angles_inside_the_grid(rotate):
    """Angle differences between tokens equal the official grid_sample route's wherever its rotated source lies
    inside the grid (its border clamping is the named deviation);
    measured: 2e-6 rad inside, up to 4 rad at the corners."""
    n, d = 14, 12 * rotate
    official = _official_angle_map(n, d, rotate, 1.5, 10000.0).reshape(n * n, -1)
    pos = image_layout(n, n).pos  # (x = column, y = row)
    ours = pos @ spiral_frequencies(d, rotate)  # [N, d/2]
    norm = pos * 2 / (n - 1) - 1
    inside = torch.ones(n * n, dtype=torch.bool)
    for i in range(1, rotate):
        a = math.radians(i * 90 / rotate)
        src = torch.stack(
            [math.cos(a) * norm[:, 0] - math.sin(a) * norm[:, 1], math.sin(a) * norm[:, 0] + math.cos(a) * norm[:, 1]],
            -1,
        )
        inside &= (src.abs() <= 1 + 1e-6).all(-1)
    assert 0 < inside.sum() < n * n  # the border does clamp somewhere
    diff = (official - ours)[inside]
    assert (diff - diff[:1]).abs().max() < 1e-4  # the same up to one constant per pair (cancels in q . k)
    assert ((official - ours)[~inside] - diff[:1]).abs().max() > 0.1  # corners: the official clamped angles


def test_spiral_is_relative_and_skips_prefix_tokens():
    torch.manual_seed(0)
    host = PEHost(dim=48, grid=(6, 6), num_prefix=1, layers=(AttnSpec(48, 2, 24, None),))
    pe = RoPE2DSpiral(host)
    layout = image_layout(4, 6, num_prefix=1)
    q, k = torch.randn(1, 2, 25, 24), torch.randn(1, 2, 25, 24)
    rq, rk = pe.context(0, layout).rotate(q, k)
    torch.testing.assert_close(rq[:, :, 0], q[:, :, 0])  # CLS not rotated
    sq, sk = pe.context(0, layout.with_pos(layout.pos + torch.tensor([2.0, 5.0]))).rotate(q, k)
    torch.testing.assert_close(
        rq[:, :, 1:] @ rk[:, :, 1:].transpose(-1, -2),
        sq[:, :, 1:] @ sk[:, :, 1:].transpose(-1, -2),
        atol=1e-4,
        rtol=1e-4,
    )
    with pytest.raises(ValueError, match="divisible by 4 \\* rotate"):
        RoPE2DSpiral(host, rotate=4)


@pytest.mark.parametrize("name", ["vit_n_string_cayley", "swin_n_string_circulant", "cvt_n_rope2d_spiral"])
def test_coordinate_augmentation_and_bad_options(name):
    kind = "rope2d_spiral" if "spiral" in name else "string"
    model = timm.create_model(name, num_classes=3, pe_kwargs={kind: {"shift_coords": 2.0}}).train()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    bad = {"rotate": 0} if kind == "rope2d_spiral" else {"variant": "fft"}
    with pytest.raises(ValueError, match="rotate|variant"):
        timm.create_model(name, pe_kwargs={kind: bad})
