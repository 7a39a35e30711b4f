"""One cache mechanism for PE tables (visionpe.pos.table_cache): a switch that changes nothing keeps the cached
tables; an update of the tensors they come from (an optimizer step, load_state_dict) invalidates them, so the
outputs then equal a fresh model's with the same weights."""

import timm
import torch

from visionpe.models.family import FAMILIES
from visionpe.pos.table_cache import TableCache


def _caches(model):
    return [v for m in model.modules() for v in vars(m).values() if isinstance(v, TableCache)]


def _liere():
    return timm.create_model("vit_n_liere", **FAMILIES["vit"].tiny).eval()


def test_eval_to_eval_keeps_the_cached_rotations():
    model, x = _liere(), torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        model(x)
    filled = sum(len(c) for c in _caches(model))
    assert filled >= 2  # one entry per layer
    model.train(False)  # what the speed command does before each step
    assert sum(len(c) for c in _caches(model)) == filled
    model.train(True)  # a switch that changes the mode forgets them
    assert sum(len(c) for c in _caches(model)) == 0


def _fresh_like(model):
    other = _liere()
    other.load_state_dict(model.state_dict())
    return other


def test_an_optimizer_step_invalidates_the_cached_rotations():
    model, x = _liere(), torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if "attn.pos" in n], lr=1.0)
    for p in opt.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    opt.step()  # still in eval mode: only the generators' versions say they changed
    with torch.no_grad():
        after, fresh = model(x), _fresh_like(model)(x)
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, fresh, rtol=0, atol=0)


def test_load_state_dict_invalidates_the_cached_rotations():
    model, x = _liere(), torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        model(x)
        torch.manual_seed(5)
        source = _liere()
        model.load_state_dict(source.state_dict())
        torch.testing.assert_close(model(x), source(x), rtol=0, atol=0)
