"""SeqPE on Swin and CvT (visionpe.pos.seqpe_grids): window-local / per-stage positions against the layer's own
grid, CvT's strided keys reading the query grid's PEs bilinearly, one table per layer in training (so gradient
checkpointing recomputes it inside the block), and the default max_position that holds the transfer blocks."""

import pytest
import timm
import torch

import visionpe  # noqa: F401  (registers the models)
from visionpe.layout.tokens import cell_centre_layout, image_layout, window_layout
from visionpe.pos.seqpe_grids import default_max_position, sample_cells, transfer_grid
from visionpe.zoo.cvt_family import CVT
from visionpe.zoo.swin_family import SWIN

EPS = torch.finfo(torch.float32).eps
QUIET = dict(dropout=0.0, contrastive_weight=0, transfer_weight=0)  # deterministic: no dropout, no draws


def _model(name, fam, **kw):
    torch.manual_seed(0)
    return timm.create_model(name, **{**fam.tiny, **kw})


def _layers(model):
    stages = model.layers if hasattr(model, "layers") else model.stages
    return [block.attn.pos["seqpe"] for stage in stages for block in stage.blocks]


def test_sample_cells_reads_cells_exactly_and_a_linear_field_bilinearly():
    h, w = 5, 7
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    # a field linear in (x, y), 3 channels: bilinear reads reproduce it at any point inside the grid
    cells = torch.stack([xx, yy, 2 * xx - 3 * yy + 1], -1).flatten(0, 1).float()
    ints = torch.stack([xx.flatten(), yy.flatten()], -1).float()
    assert torch.equal(sample_cells(cells, (h, w), ints), cells)
    pts = torch.tensor([[0.5, 0.5], [5.25, 3.75], [6.0, 0.5], [2.5, 4.0]])
    want = torch.stack([pts[:, 0], pts[:, 1], 2 * pts[:, 0] - 3 * pts[:, 1] + 1], -1)
    assert (sample_cells(cells, (h, w), pts) - want).abs().max() <= 8 * EPS * want.abs().max()
    # past the border: the edge cell (6.5 reads column 6; 4.5 reads row 4)
    edge = sample_cells(cells, (h, w), torch.tensor([[6.5, 4.5]]))
    assert torch.equal(edge, cells[4 * w + 6][None])


def test_the_transfer_grid_and_default_max_position_follow_the_layers_grids():
    swin_t, cvt_13 = timm.create_model("swin_t_seqpe"), timm.create_model("cvt_13_seqpe")
    assert transfer_grid(swin_t.pe.host) == (7, 7)  # the window, not the 56 x 56 patch grid
    assert transfer_grid(cvt_13.pe.host) == (56, 56)  # the first stage's query grid at 224 px
    assert swin_t.pe.encodings["seqpe"].max_position == 100
    pe = cvt_13.pe.encodings["seqpe"]
    assert pe.max_position == 1000 and pe.digits == 3 and pe.encoder.place_embed.shape == (6, 64)
    assert default_max_position((14, 14)) == 100 and default_max_position((50, 51)) == 1000
    assert timm.create_model("vit_s_seqpe").pe.encodings["seqpe"].max_position == 100  # the paper's, unchanged


def test_swin_layers_read_window_local_positions():
    model = _model("swin_n_seqpe", SWIN, pe_kwargs=QUIET).eval()
    pe, own = model.pe.encodings["seqpe"], _layers(model)[2]  # stage 1's first block (width 32, 2 heads)
    layout = window_layout(4, 4)
    q, k = torch.randn(3, 2, 16, 16), torch.randn(3, 2, 16, 16)
    with torch.no_grad():
        rq, rk = pe.context(2, layout, None, own).rotate(q, k)
        cells = pe.encode(layout.pos.flip(-1).long())  # (row, col) of every window cell through the digit encoder
        p = own.proj(cells).view(16, 2, 2, 16)  # [N, (q, k), H, d]
    tol = 64 * EPS * (q.abs().max() * p.abs().max())
    assert (rq - q * p[:, 0].transpose(0, 1)).abs().max() <= tol
    assert (rk - k * p[:, 1].transpose(0, 1)).abs().max() <= tol
    # window-local: the image's size does not enter; a model at 44 px gives every window the same table
    with torch.no_grad():
        assert torch.equal(pe.table(layout, (4, 4)), pe.table(window_layout(4, 4), (4, 4)))
    assert cells.shape == (16, 16) and (cells[1] - cells[4]).abs().max() > 1e-3  # (0, 1) and (1, 0) differ


def test_cvt_keys_read_the_mean_of_the_query_cells_they_cover():
    model = _model("cvt_n_seqpe", CVT, pe_kwargs=QUIET).eval()
    pe, own = model.pe.encodings["seqpe"], _layers(model)[1]  # stage 1 (width 32, 2 heads)
    h = w = 5  # odd: the last key's cells stick out of the grid by one row / column
    q_layout, kv_layout = image_layout(h, w), cell_centre_layout(3, 3, 2)
    q, k = torch.randn(1, 2, 25, 16), torch.randn(1, 2, 9, 16)
    with torch.no_grad():
        _, rk = pe.context(1, q_layout, kv_layout, own).rotate(q, k)
        cells = pe.table(q_layout, (8, 8)).view(h, w, -1)
        keys = []
        for i in range(3):
            for j in range(3):  # the 2 x 2 cells key (i, j) covers, those inside the grid
                keys.append(cells[2 * i : 2 * i + 2, 2 * j : 2 * j + 2].mean((0, 1)))
        pe_k = own.proj(torch.stack(keys)).view(9, 2, 2, 16)[:, 1].transpose(0, 1)
    assert (rk - k * pe_k).abs().max() <= 64 * EPS * (k.abs().max() * pe_k.abs().max())


@pytest.mark.parametrize("name, fam", [("swin_n_seqpe", SWIN), ("cvt_n_seqpe", CVT)])
def test_training_computes_one_table_per_layer_and_trains_the_encoder(name, fam):
    model = _model(name, fam).train()
    pe = model.pe.encodings["seqpe"]
    calls = []
    pe.encoder.register_forward_hook(lambda *a: calls.append(1))
    for hw in (32, 44):
        calls.clear()
        out = model(torch.randn(2, 3, hw, hw))
        aux = model.pe.aux_loss()
        (out.sum() + aux).backward()
        # one table per layer, then the objectives' three encodings (contrastive; transfer teacher, student)
        assert len(calls) == len(_layers(model)) + 3 and torch.isfinite(out).all() and float(aux.detach()) > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in pe.encoder.blocks.parameters())
    calls.clear()
    with torch.no_grad():
        model.eval()(torch.randn(1, 3, 32, 32))
        model(torch.randn(1, 3, 32, 32))
    # eval: one table per distinct grid, kept (Swin's stages share the 4 x 4 window; CvT's 3 stage grids differ)
    assert len(calls) == (1 if name.startswith("swin") else 3)


@pytest.mark.parametrize("name, fam", [("swin_n_seqpe", SWIN), ("cvt_n_seqpe", CVT)])
def test_gradient_checkpointing_gives_the_same_gradients(name, fam):
    grads = []
    for ckpt in (False, True):
        model = _model(name, fam, pe_kwargs=QUIET, drop_path_rate=0.0).train()
        model.set_grad_checkpointing(ckpt)
        torch.manual_seed(1)
        model(torch.randn(2, 3, 32, 32)).square().sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.pe.encodings["seqpe"].encoder.parameters()]))
    scale = grads[0].abs().max()
    assert scale > 0 and (grads[0] - grads[1]).abs().max() <= 256 * EPS * scale


def test_prefix_tokens_read_a_zero_pe_the_layers_projection_bias():
    # CvT's CLS joins the last stage alone (and goes when it is pruned): no cls_pos; its pe_q, pe_k are the bias
    model = _model("cvt_n_seqpe", CVT, pe_kwargs=QUIET).eval()
    pe, own = model.pe.encodings["seqpe"], _layers(model)[2]
    assert pe.cls_pos is None and not any("cls_pos" in k for k in model.state_dict())
    with torch.no_grad():
        own.proj.bias.normal_()
        q, k = torch.randn(1, 4, 17, 16), torch.randn(1, 4, 17, 16)
        rq, rk = pe.context(2, image_layout(4, 4, 1), None, own).rotate(q, k)
    bias = own.proj.bias.view(2, 4, 16)  # [(q, k), H, d]
    assert torch.equal(rq[0, :, 0], q[0, :, 0] * bias[0]) and torch.equal(rk[0, :, 0], k[0, :, 0] * bias[1])
