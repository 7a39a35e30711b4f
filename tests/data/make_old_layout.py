"""Writes old_layout.json.gz: for every registered name, the state_dict keys and shapes of the layout before issue 43
(per-layer PE state in one model-level object) and the logits of its tiny model on a fixed input, with weights drawn
from the parameter names (`draw`, shared with tests/test_old_layout.py). Run once, at the old code; kept for the record.
"""

import gzip
import json
import sys
import zlib
from pathlib import Path

import timm
import torch

import visionpe
from visionpe.models.family import FAMILIES


def draw(name: str, shape) -> torch.Tensor:
    """A deterministic tensor for parameter `name`: N(0, 1/fan_in) (fan_in 16 for 1-D tensors)."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    z = torch.randn(shape, generator=g)
    fan_in = max(1, z.numel() // max(1, z.shape[0])) if z.ndim > 1 else 16
    return z / fan_in**0.5


def drawn(key: str, value: torch.Tensor, is_param: bool) -> torch.Tensor:
    """The fixture's value of a state_dict entry: parameters drawn, PE buffers drawn positive (FIRE's init_L), the
    backbone's buffers (batch-norm statistics, same keys in both layouts) the model's own."""
    if is_param:
        return draw(key, value.shape)
    if key.startswith("pe.") and value.is_floating_point():
        return draw(key, value.shape).abs() + 1
    return value


def family_of(name):
    return next(f for f in FAMILIES.values() if name.split("_")[0] == f.name)


def main(out: Path):
    shapes, entries = {}, {}
    for name in visionpe.list_visionpe_models():
        fam = family_of(name)
        torch.manual_seed(0)
        model = timm.create_model(name, **fam.tiny).eval()
        sd = model.state_dict()
        params = dict(model.named_parameters())
        keys = [[k, list(v.shape), k in params] for k, v in sd.items()]
        sig = json.dumps(keys)
        sid = shapes.setdefault(sig, len(shapes))
        with torch.no_grad():
            model.load_state_dict({k: drawn(k, v, k in params) for k, v in sd.items()})
            torch.manual_seed(1)
            inp = fam.example_input(fam.test_sizes[0], 1)
            out_ = model(**inp) if isinstance(inp, dict) else model(inp)
        assert torch.isfinite(out_).all(), name
        entries[name] = dict(keys=sid, logits=out_.flatten()[:6].tolist())
        print(name, sid, out_.flatten()[:3].tolist(), file=sys.stderr)
    data = dict(layouts=[json.loads(s) for s in shapes], models=entries)
    out.write_bytes(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0))


if __name__ == "__main__":
    main(Path(__file__).with_name("old_layout.json.gz"))
