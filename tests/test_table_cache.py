"""One cache mechanism for PE tables (visionpe.pos.table_cache): a switch that changes nothing keeps the cached
tables; an update of the tensors they come from (an optimizer step, load_state_dict, a training step, a write the
version counter misses, a new position mode or host) invalidates them, so the outputs then equal those of a fresh
model with the same weights, bit for bit (the same operations on the same numbers)."""

import dataclasses

import pytest
import timm
import torch

from visionpe.layout.tokens import image_layout
from visionpe.pos.base import PEHost, PosEncoding
from visionpe.pos.table_cache import TableCache, invalidate_tables
from visionpe.zoo.family import FAMILIES

TINY = FAMILIES["vit"].tiny
# PEs whose tables are cached: learned (LieRE rotations, FIRE's MLP bias, SeqPE's table), bucket ids (iRPE, whose
# tables are read live), fixed (RoPE's cos / sin, LookHere's biases)
CACHED = ["vit_n_liere", "vit_n_fire2d", "vit_n_seqpe", "vit_n_irpe", "vit_n_rope2d", "vit_n_lookhere"]
LEARNED = CACHED[:4]


def _caches(model):
    return [v for m in model.modules() for v in vars(m).values() if isinstance(v, TableCache)]


def _filled(model, learned=None):
    return sum(len(c) for c in _caches(model) if learned is None or c.learned == learned)


def _model(name, **kw):
    """The tiny model with weights N(0, 1 / fan_in) (as tests/data/make_old_layout.py draws them): its logits are
    of order 1 and move visibly with every PE parameter (a fresh init's barely do)."""
    torch.manual_seed(0)
    model = timm.create_model(name, **{**TINY, **kw}).eval()
    with torch.no_grad():
        for p in model.parameters():
            fan_in = max(1, p[0].numel()) if p.ndim > 1 else 16
            p.copy_(torch.randn_like(p) / fan_in**0.5)
    return model


EPS = torch.finfo(torch.float32).eps


def _tol(b):
    return 16 * EPS * (1 + b.abs().max())  # a few float32 ulps of the logits' scale (sums in another order)


def _same(a, b):
    assert (a - b).abs().max() <= _tol(b)


def _moved(a, b):
    """a differs from b by far more than `_same` allows: a table stale by that change would fail `_same`."""
    assert (a - b).abs().max() > 64 * _tol(b)


def _fresh_like(model, name, **kw):
    """A new model of `name` with `model`'s weights (nothing cached), in eval mode."""
    other = _model(name, **kw)
    other.load_state_dict(model.state_dict())
    return other


def _perturb(model):
    """Every PE parameter (per layer and model-level) moved by a training-like amount."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "attn.pos" in n or n.startswith("pe."):
                p.add_(0.5 * torch.randn_like(p))


X = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", CACHED)
def test_eval_to_eval_keeps_every_table_and_a_mode_switch_forgets_only_learned_ones(name):
    model = _model(name)
    with torch.no_grad():
        y = model(X)
    filled, fixed = _filled(model), _filled(model, learned=False)
    assert filled >= 1
    model.train(False)  # what the speed command does before each step
    model.eval()
    assert _filled(model) == filled
    with torch.no_grad():
        assert torch.equal(model(X), y) and _filled(model) == filled  # served from the cache: nothing added
    model.train(True)  # a switch that changes the mode forgets the learned tables, keeps the fixed ones
    assert _filled(model, learned=True) == 0 and _filled(model, learned=False) == fixed


@pytest.mark.parametrize("name", LEARNED)
def test_an_optimizer_step_in_training_never_leaves_a_stale_table(name):
    model = _model(name)
    with torch.no_grad():
        before = model(X)  # eval: tables cached
    model.train()
    params = [p for n, p in model.named_parameters() if "attn.pos" in n or n.startswith("pe.")]
    opt = torch.optim.Adam(params, lr=0.05)  # every PE parameter moves by about lr a step
    for _ in range(2):  # training forwards read the parameters as they are after each step
        loss = model(X).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            fresh = _fresh_like(model, name).train()
            torch.manual_seed(7)  # the same dropout draws (SeqPE's encoder) in both
            y = model(X)
            torch.manual_seed(7)
            _same(y, fresh(X))
    model.eval()
    with torch.no_grad():
        after, fresh = model(X), _fresh_like(model, name)(X)
    _moved(after, before)  # the step changed the output...
    _same(after, fresh)  # ...to a fresh model's with these weights


@pytest.mark.parametrize("name", LEARNED)
def test_an_optimizer_step_in_eval_mode_invalidates_the_cached_tables(name):
    model = _model(name)
    with torch.no_grad():
        before = model(X)
        _perturb(model)  # in place, still in eval mode: only the versions say the parameters changed
        after = model(X)
    _moved(after, before)
    _same(after, _fresh_like(model, name)(X))


@pytest.mark.parametrize("name", ["vit_n_liere", "vit_n_fire2d", "vit_n_seqpe"])
def test_a_write_the_version_misses_is_seen_after_the_training_that_made_it(name):
    model = _model(name)
    with torch.no_grad():
        model(X)
    model.train()
    with torch.no_grad():  # FSDP's all-gather into a reused buffer writes like this (no version bump)
        for n, p in model.named_parameters():
            if "attn.pos" in n or n.startswith("pe."):
                p.data.add_(0.1 * torch.randn_like(p))
    model.eval()
    with torch.no_grad():
        _same(model(X), _fresh_like(model, name)(X))


@pytest.mark.parametrize("name", LEARNED)
def test_load_state_dict_invalidates_the_cached_tables(name):
    model = _model(name)
    with torch.no_grad():
        model(X)
        source = _fresh_like(model, name)
        _perturb(source)
        model.load_state_dict(source.state_dict())
        _same(model(X), source(X))


def test_a_new_position_mode_reads_the_new_tables_and_the_old_mode_returns_exactly():
    name, big = "vit_n_rope2d", torch.randn(1, 3, 96, 80, generator=torch.Generator().manual_seed(4))
    model = _model(name)
    with torch.no_grad():
        y = model(big)
        model.set_position_mode("ntk")
        scaled = model(big)
        _moved(scaled, y)
        _same(scaled, _fresh_like(model, name, position_mode="ntk")(big))
        model.position_mode = "extrapolate"  # the property is the same setter
        torch.testing.assert_close(model(big), y, rtol=0, atol=0)


def test_seqpe_serves_the_table_of_the_current_mode():
    model, layout = _model("vit_n_seqpe"), image_layout(12, 10, 1)
    pe = model.pe.encodings["seqpe"]
    with torch.no_grad():
        raw = pe._table(layout)  # kept (eval, no autograd)
        model.set_position_mode("interpolate")
        rescaled = pe._table(layout)
        _moved(rescaled, raw)
        torch.testing.assert_close(rescaled, pe.table(layout), rtol=0, atol=0)  # what it computes now
        model.set_position_mode("extrapolate")
        torch.testing.assert_close(pe._table(layout), raw, rtol=0, atol=0)


def test_rebuilt_buffers_and_a_new_host_forget_every_table():
    model = _model("vit_n_rope2d")
    with torch.no_grad():
        y = model(X)
    assert _filled(model) >= 1
    model.init_non_persistent_buffers()
    assert _filled(model) == 0
    with torch.no_grad():
        torch.testing.assert_close(model(X), y, rtol=0, atol=0)
    model.set_input_size(img_size=(48, 48))
    assert _filled(model) == 0


def test_entries_are_found_by_key_positions_and_source_versions():
    cache, pos, w = TableCache(size=2), torch.arange(6.0).view(3, 2), torch.ones(2)
    cache.put("k", "table", (pos,), (w,))
    assert cache.get("k", (pos,), (w,)) == "table"
    assert cache.get("other", (pos,), (w,)) is None
    assert cache.get("k", (pos.clone(),), (w,)) is None  # positions by identity...
    values = TableCache(by_value=True)
    values.put("k", "table", (pos,))
    assert values.get("k", (pos.clone(),)) == "table"  # ...or, by_value, by their values
    assert values.get("k", (pos + 1,)) is None
    assert cache.get("k", (pos,), (w.clone(),)) is None  # a source by identity (a rebuilt buffer is another)
    w.mul_(2)  # an in-place write bumps its version
    assert cache.get("k", (pos,), (w,)) is None
    cache.put("a", 1)
    cache.put("b", 2)
    assert len(cache) == 2 and cache.get("a") == 1  # the last `size` entries, least recently used out first
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1
    with torch.inference_mode():  # made outside inference mode and autograd: usable in training afterwards
        t = cache.lookup("t", lambda: torch.ones(2, requires_grad=True) * 2)
    assert not t.is_inference() and not t.requires_grad
    learned = TableCache(learned=True)
    holder = torch.nn.Module()
    holder.fixed, holder.learned = cache, learned
    learned.put("x", 1)
    invalidate_tables(holder, learned_only=True)
    assert len(learned) == 0 and len(cache) == 2


def test_the_position_mode_is_runtime_state_of_every_pe_not_of_the_host():
    model = _model("vit_n_rope2d_ape")
    host = model.pe.host
    model.set_position_mode("yarn")
    assert model.pe.host is host and "position_mode" not in {f.name for f in dataclasses.fields(PEHost)}
    assert {m.position_mode for m in model.pe.modules() if isinstance(m, PosEncoding)} == {"yarn"}
    with pytest.raises(ValueError, match="position_mode must be one of"):
        model.set_position_mode("riflex")  # a video mode: the ViT keeps its own
    assert model.position_mode == "yarn"
