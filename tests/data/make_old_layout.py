"""Writes old_layout.json.gz: for every registered name, the state_dict keys and shapes of the layout before issue 43
(per-layer PE state in one model-level object) and the logits of its tiny model on a fixed input, with weights drawn
from the parameter names (`draw`, shared with tests/test_old_layout.py). Run once, at the old code; kept for the record.
`--add-new-names` appends the entries of names registered since (e.g. vit_*_seqpe), written from the current code:
a PE added after the change has no old layout. `--move OLD:NEW ...` first gives a name's old entry to the name that
now builds that model (swin_*_irpe -> swin_*_irpe_k, cvt_*_irpe -> cvt_*_irpe_k, #43), so OLD is written anew.
"""

import gzip
import json
import sys
import zlib
from pathlib import Path

import timm
import torch

import visionpe
from visionpe.zoo.family import FAMILIES


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


def entry(name, shapes: dict) -> dict:
    """One name's fixture entry (its key layout's index in `shapes`, a JSON signature -> index map, and logits)."""
    fam = family_of(name)
    torch.manual_seed(0)
    model = timm.create_model(name, **fam.tiny).eval()
    sd = model.state_dict()
    params = dict(model.named_parameters())
    keys = [[k, list(v.shape), k in params] for k, v in sd.items()]
    sid = shapes.setdefault(json.dumps(keys), len(shapes))
    with torch.no_grad():
        model.load_state_dict({k: drawn(k, v, k in params) for k, v in sd.items()})
        torch.manual_seed(1)
        inp = fam.example_input(fam.test_sizes[0], 1)
        out_ = model(**inp) if isinstance(inp, dict) else model(inp)
    assert torch.isfinite(out_).all(), name
    print(name, sid, out_.flatten()[:3].tolist(), file=sys.stderr)
    return dict(keys=sid, logits=out_.flatten()[:6].tolist())


def write(out: Path, shapes: dict, entries: dict) -> None:
    data = dict(layouts=[json.loads(s) for s in shapes], models=entries)
    out.write_bytes(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0))


def main(out: Path):
    shapes = {}
    entries = {name: entry(name, shapes) for name in visionpe.list_visionpe_models()}
    write(out, shapes, entries)


def add_new_names(out: Path, moves: dict[str, str] | None = None):
    """Names registered after the layout change had no old layout: their entries are written from the current code
    (its keys and logits), appended to the fixture, whose other entries stay as the old code wrote them. moves:
    {old name: new name} whose old entry the new name takes (the old name is then written anew)."""
    data = json.loads(gzip.decompress(out.read_bytes()))
    shapes = {json.dumps(layout): i for i, layout in enumerate(data["layouts"])}
    entries = data["models"]
    for old, new in (moves or {}).items():
        entries[new] = entries.pop(old)
    for name in visionpe.list_visionpe_models():
        if name not in entries:
            entries[name] = entry(name, shapes)
    write(out, shapes, entries)


if __name__ == "__main__":
    target = Path(__file__).with_name("old_layout.json.gz")
    moved = dict(a.split(":") for a in sys.argv[sys.argv.index("--move") + 1 :]) if "--move" in sys.argv else {}
    add_new_names(target, moved) if "--add-new-names" in sys.argv else main(target)
