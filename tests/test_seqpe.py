"""SeqPE (`seqpe`): digit tokens, the causal encoder's CLS reading every digit, a cell's PE a function of its digits
alone, attn_mul against a hand computation, and the ViT at two resolutions in both position modes."""

import copy

import pytest
import timm
import torch

from visionpe.layout.tokens import image_layout
from visionpe.pos.seqpe import SeqPE, attn_mul
from visionpe.pos.seqpe_encoder import digit_tokens, digits_for
from visionpe.zoo.vit_family import VIT

EPS = torch.finfo(torch.float32).eps


def _model(**kw):
    torch.manual_seed(0)
    return timm.create_model("vit_n_seqpe", **{**VIT.tiny, **kw})


def _pe(model) -> SeqPE:
    return model.pe.encodings["seqpe"]


def test_digit_tokens_left_pad_row_then_column():
    assert digits_for(100) == 2 and digits_for(10) == 1 and digits_for(101) == 3 and digits_for(1000) == 3
    coords = torch.tensor([[2, 3], [0, 0], [99, 7], [10, 45]])
    assert digit_tokens(coords, 2).tolist() == [[0, 2, 0, 3], [0, 0, 0, 0], [9, 9, 0, 7], [1, 0, 4, 5]]
    assert digit_tokens(torch.tensor([[2, 3]]), 3).tolist() == [[0, 0, 2, 0, 0, 3]]


def test_the_cls_output_depends_on_every_digit_and_digits_on_no_later_token():
    enc = _pe(_model().eval()).encoder
    base = torch.tensor([[0, 2, 0, 3]])
    out = enc(base)
    for j in range(4):  # a different digit at any place (the padded leading 0s included) moves the CLS output
        changed = base.clone()
        changed[0, j] = 7
        assert (enc(changed) - out).abs().max() > 1e-3, j
    # causal: a digit's hidden state reads only the digits before it (perturb the last digit, the first stays)
    x = enc.token_embed(base) + enc.place_embed + enc.axis_embed[enc.axis_of]
    y = x.clone()
    y[0, 3] += 1.0
    block = enc.blocks[0]
    assert torch.equal(block(x)[0, :3], block(y)[0, :3]) and not torch.equal(block(x)[0, 3], block(y)[0, 3])


def test_a_cells_pe_is_a_function_of_its_digits_in_extrapolate_mode():
    pe = _pe(_model().eval())
    with torch.no_grad():
        small, large = pe.table(image_layout(4, 4, 1)), pe.table(image_layout(7, 9, 1))
    assert torch.equal(small[0], large[0]) and torch.equal(small[0], pe.cls_pos)  # the prefix: cls_pos
    cells_small, cells_large = small[1:].view(4, 4, -1), large[1:].view(7, 9, -1)
    assert (cells_small - cells_large[:4, :4]).abs().max() <= 16 * EPS * cells_small.abs().max()
    assert (cells_large[0, 1] - cells_large[1, 0]).abs().max() > 1e-3  # (0, 1) and (1, 0): different digits


def test_attn_mul_equals_the_hand_computation():
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    pe_q, pe_k = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    qm, km = attn_mul(q, pe_q), attn_mul(k, pe_k)
    for h in range(2):
        for i in range(3):
            for j in range(3):
                want = sum(q[0, h, i, c] * pe_q[h, i, c] * k[0, h, j, c] * pe_k[h, j, c] for c in range(4))
                assert abs(float((qm @ km.transpose(-1, -2))[0, h, i, j] - want)) <= 8 * EPS * (1 + abs(float(want)))


def test_the_layer_context_multiplies_q_and_k_by_its_own_projection_of_the_table():
    model = _model().eval()
    pe, own = _pe(model), model.blocks[1].attn.pos["seqpe"]
    layout = image_layout(4, 4, 1)
    q, k = torch.randn(2, 2, 17, 16), torch.randn(2, 2, 17, 16)
    with torch.no_grad():
        rq, rk = pe.context(1, layout, None, own).rotate(q, k)
        p = own.proj(pe.table(layout)).view(17, 2, 2, 16)  # [N, (q, k), H, d]
    torch.testing.assert_close(rq, q * p[:, 0].transpose(0, 1), atol=1e-6, rtol=0)
    torch.testing.assert_close(rk, k * p[:, 1].transpose(0, 1), atol=1e-6, rtol=0)
    assert own.proj.weight.shape == (2 * 32, 32)  # Linear(width, 2 * width): blocks.{i}.attn.pos.seqpe.proj


@pytest.mark.parametrize("hw", [32, 48])
def test_the_vit_trains_at_two_resolutions_and_computes_the_table_once_per_forward(hw):
    model = _model(pe_kwargs=dict(contrastive_weight=0, transfer_weight=0)).train()  # (objectives: below)
    pe = _pe(model)
    calls = []
    pe.encoder.register_forward_hook(lambda *a: calls.append(1))
    out = model(torch.randn(2, 3, hw, hw))
    out.sum().backward()
    assert out.shape == (2, 10) and torch.isfinite(out).all() and len(calls) == 1
    assert all(p.grad is not None for p in pe.encoder.parameters())
    assert model.blocks[0].attn.pos["seqpe"].proj.weight.grad.abs().sum() > 0
    assert model.pe.aux_loss() is None


def test_a_training_forward_leaves_its_objectives_for_the_trainer_once():
    model = _model().train()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    aux = model.pe.aux_loss()
    # at init the contrastive term is about log(64) (64 near-equal candidates), the transfer term small
    assert aux.ndim == 0 and 0.1 * 3.0 < float(aux.detach()) < 0.1 * 6.0 and model.pe.aux_loss() is None
    aux.backward()
    assert _pe(model).encoder.token_embed.weight.grad.abs().sum() > 0
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    assert model.pe.aux_loss() is None  # no autograd: no objectives


def test_a_model_copies_after_a_training_forward():
    model = _model().train()
    model(torch.randn(2, 3, 32, 32))  # leaves this forward's table and objectives (graph tensors) on the PE
    twin = copy.deepcopy(model).eval()  # e.g. an EMA copy
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(twin(x), model.eval()(x))


def test_eval_keeps_the_table_until_a_parameter_changes():
    model = _model().eval()
    pe, x = _pe(model), torch.randn(1, 3, 32, 32)
    calls = []
    pe.encoder.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        a = model(x)
        b = model(x)
        assert len(calls) == 1 and torch.equal(a, b)
        pe.encoder.cls_embed.add_(torch.randn(32))  # (a constant shift would vanish in the LayerNorms)
        c = model(x)
    assert len(calls) == 2 and not torch.equal(a, c)


def test_interpolate_mode_resizes_the_reference_grids_table():
    model = _model(position_mode="interpolate").eval()
    pe = _pe(model)
    with torch.no_grad():
        ref = pe.table(model.layout((4, 4)))
        big = pe.table(model.layout((8, 8)))
        same = pe.table(model.layout((4, 4)))
        out = model(torch.randn(1, 3, 64, 64))
    assert torch.equal(ref, same) and big.shape == (65, 32) and torch.isfinite(out).all()
    # bicubic 4 -> 8 (align_corners False): the mean over the grid is kept up to the kernel's overshoot at borders
    assert (big[1:].mean(0) - ref[1:].mean(0)).abs().max() < 0.2 * ref[1:].abs().max()


def test_positions_beyond_max_position_name_the_option():
    with pytest.raises(ValueError, match="needs max_position >= 8.*set transfer_weight=0"):
        _model(pe_kwargs=dict(max_position=5))  # the transfer objective's shifted 4 x 4 blocks do not fit
    model = _model(pe_kwargs=dict(max_position=5, transfer_weight=0)).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 40, 40))  # 5 x 5 patches: positions 0..4
        with pytest.raises(ValueError, match=r"max_position=5.*raise max_position"):
            model(torch.randn(1, 3, 48, 48))
    assert _pe(model).digits == 1 and _pe(model).encoder.place_embed.shape == (2, 32)


def test_sizes_follow_the_model_width_and_heads():
    model = timm.create_model("vit_s_seqpe", img_size=32, num_classes=0)
    enc = _pe(model).encoder
    assert enc.token_embed.weight.shape == (10, 384) and enc.blocks[0].heads == 6 and len(enc.blocks) == 2
    assert enc.out_proj.weight.shape == (384, 384) and model.blocks[3].attn.pos["seqpe"].proj.weight.shape == (768, 384)
    with pytest.raises(ValueError, match="not divisible"):
        _model(pe_kwargs=dict(width=30, heads=4))


def test_the_trainer_adds_the_objectives_of_every_step(tmp_path, monkeypatch):
    from tiny_runs import tiny_run

    from visionpe.engine import train

    seen = []
    original = SeqPE.aux_loss

    def recorded(self):
        out = original(self)
        seen.append(None if out is None else float(out.detach()))
        return out

    monkeypatch.setattr(SeqPE, "aux_loss", recorded)
    data = ["data.name=synthetic-shapes", "data.options.num_train=32", "data.options.num_val=16", "data.batch_size=16"]
    train(None, tiny_run(tmp_path, data, "model.name=vit_n_seqpe", "train.epochs=1", "eval.resolutions=16"))
    assert len(seen) == 2 and all(v is not None and v > 0 for v in seen)  # 2 steps, each with its own objectives
