"""Bad or unusual inputs that used to give silently wrong results or a traceback: config values out of range, YAML
surprises, odd image folders, PE options that make NaNs, weight files of the wrong number kind, destinations that
cannot be written, attention backends that cannot run. Each is now one clear line or the correct behaviour."""

from __future__ import annotations

import dataclasses
import os
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file
from test_faults import _one_line_error, run, tiny

from visionpe.attention.backends import check_attn_backend
from visionpe.data import build_dataset
from visionpe.engine import CheckpointError, ConfigError, load_checkpoint, load_config, load_weights
from visionpe.engine.cli import eval_main
from visionpe.engine.config import Config, apply_overrides
from visionpe.engine.setup import build_model, check_resolutions
from visionpe.zoo.registry import FAMILIES, list_visionpe_models

# ----------------------------------------------------------------------------------- config values, checked per key

OUT_OF_RANGE = {
    "train.threads=-1": "train.threads must be >= 1, got -1",
    "train.max_steps_per_epoch=-1": "train.max_steps_per_epoch must be >= 0, got -1",
    "aug.label_smoothing=1.5": "aug.label_smoothing must be >= 0 and < 1, got 1.5",
    "model.drop_path=1.5": "model.drop_path must be >= 0 and < 1, got 1.5",
    "model.drop_path=-0.1": "model.drop_path must be >= 0 and < 1, got -0.1",
    "data.eval_batch_size=-1": "data.eval_batch_size must be >= 0, got -1",
    "train.ckpt_every_steps=-1": "train.ckpt_every_steps must be >= 0, got -1",
    "aug.mixup_mode=bogus": "aug.mixup_mode must be one of batch, pair, elem; got 'bogus'",
    "train.ema_decay=2": "train.ema_decay must be >= 0 and <= 1, got 2.0",
    "optim.lr=nan": "optim.lr must be a finite number, got nan",
    "eval.resolutions=16,0": "eval.resolutions[1] must be >= 1, got 0",
    "train.seed=-1": "train.seed must be >= 0 and < 2147483648, got -1",
    "train.seed=4294967296": "train.seed must be >= 0 and < 2147483648, got 4294967296",
    "aug.std=0.5,0": "aug.std[1] must be > 0, got 0.0",
}


@pytest.mark.parametrize("override", list(OUT_OF_RANGE))
def test_a_value_out_of_its_keys_declared_range_is_one_line(override, capsys, tmp_path):
    with pytest.raises(ConfigError, match=OUT_OF_RANGE[override].replace("[", r"\[").replace("]", r"\]")):
        load_config(None, [override])
    with pytest.raises(ConfigError, match="train.threads must be"):  # also a Config built in Python
        cfg = Config()
        cfg.train.threads = -1
        apply_overrides(cfg, [])


def test_every_integer_key_declares_its_range():
    """An int key without a declared range would reach torch/numpy unchecked (train.seed=-1 gave numpy's message)."""
    unbounded = []
    for section in dataclasses.fields(Config):
        schemas = [(section.name, type(getattr(Config(), section.name)))]
        for f in dataclasses.fields(schemas[0][1]):
            if f.metadata.get("schema"):
                schemas.append((f"{section.name}.{f.name}", f.metadata["schema"]))
        for prefix, schema in schemas:
            for f in dataclasses.fields(schema):
                bounded = {"ge", "gt", "le", "lt", "choices"} & set(f.metadata.get("check", {}))
                if "int" in str(f.type) and not bounded:
                    unbounded.append(f"{prefix}.{f.name}")
    assert not unbounded


def test_yaml_duplicate_sections_leading_zeros_and_other_encodings(tmp_path, capsys):
    dup = tmp_path / "dup.yaml"
    dup.write_text("train:\n  epochs: 3\ndata:\n  batch_size: 4\ntrain:\n  seed: 1\n")
    with pytest.raises(ConfigError, match=r"dup.yaml: key 'train' appears twice \(lines 1 and 5\)"):
        load_config(dup)
    octal = tmp_path / "octal.yaml"
    octal.write_text("train:\n  epochs: 010\n  run_name: 007\n")
    cfg = load_config(octal, ["train.seed=012"])
    assert (cfg.train.epochs, cfg.train.run_name, cfg.train.seed) == (10, "007", 12)  # as written, not octal 8
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("train:\n  run_name: caf\xe9\n".encode("latin-1"))
    line = _one_line_error(capsys, ["-c", str(latin)])
    assert f"{latin} is not UTF-8 text (byte 0xe9 at offset 22)" in line


def _alias_bomb(levels: int) -> str:
    """model.kwargs holding 10**levels copies of one word through nested aliases (a "billion laughs" file)."""
    lines = ["model:", "  kwargs:", "    l0: &l0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join([*lines, f"    depth: *l{levels - 1}", ""])


def test_yaml_alias_bomb_is_refused_before_it_is_built(tmp_path, capsys):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb(9))  # 10**9 values once expanded
    line = _one_line_error(capsys, ["-c", str(bomb)])
    assert "holds more than 100,000 values once its aliases (*name) are expanded" in line and len(line) < 300
    loop = tmp_path / "loop.yaml"
    loop.write_text("model:\n  kwargs: &k {again: *k}\n")
    with pytest.raises(ConfigError, match="an alias refers to the value that holds it"):
        load_config(loop)
    fine = tmp_path / "fine.yaml"  # aliases and merge keys within the bound read as YAML says
    fine.write_text("model:\n  kwargs: &k {depth: 1, num_heads: 2}\ndata:\n  options: {<<: *k, num_train: 8}\n")
    cfg = load_config(fine)
    assert cfg.data.options == {"depth": 1, "num_heads": 2, "num_train": 8} == {**cfg.model.kwargs, "num_train": 8}


def test_errors_show_a_long_value_cut_short():
    with pytest.raises(ConfigError, match=r"aug.hflip expects float, got 'yyy.*\.\.\..*yyy'$") as e:
        load_config(None, ["aug.hflip=" + "y" * 100_000])
    assert len(str(e.value)) < 300
    with pytest.raises(ConfigError, match="train.epochs expects int") as e:
        load_config(None, ["train.epochs=[" + ",".join(["[1,2,3]"] * 5000) + "]"])
    assert len(str(e.value)) < 400


def test_yaml_11_words_are_strings_for_string_keys_and_bools_for_bool_keys(tmp_path):
    recipe = tmp_path / "words.yaml"
    recipe.write_text(
        "train:\n  amp: off\n  run_name: no\n  ema: yes\n  progress: Off\n"
        "model:\n  kwargs: {class_token: no, dynamic_img_pad: on, global_pool: 'off'}\n"
    )
    cfg = load_config(recipe)
    assert (cfg.train.amp, cfg.train.run_name, cfg.train.ema, cfg.train.progress) == ("none", "no", True, False)
    assert cfg.model.kwargs == {"class_token": False, "dynamic_img_pad": True, "global_pool": "off"}
    assert load_config(None, ["train.amp=off"]).train.amp == load_config(None, ["train.amp=false"]).train.amp == "none"
    with pytest.raises(ConfigError, match="train.amp must be one of auto, bf16, fp16, none; got 'on'"):
        load_config(None, ["train.amp=on"])


# ------------------------------------------------------------------------------------------------- image folders


def _images(folder: Path, n: int, seed: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (18, 18, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def test_symlinks_are_followed_without_loops_and_hidden_folders_are_skipped(tmp_path):
    root = tmp_path / "d"
    for c in ("a", "b"):
        _images(root / "val" / c, 4)
    os.symlink(root / "val", root / "val" / "a" / "loop")  # a loop back to the split
    os.symlink(root / "val" / "b", root / "val" / "b2")  # a second way to the same folder
    _images(tmp_path / "elsewhere" / "c", 2)
    os.symlink(tmp_path / "elsewhere" / "c", root / "val" / "c")  # a class kept elsewhere: followed
    _images(root / "val" / ".ipynb_checkpoints", 3)  # a tool's side folder: not a class
    (root / "val" / "a" / ".hidden.png").write_bytes((root / "val" / "a" / "0.png").read_bytes())
    ds = build_dataset("imagefolder", "val", 16, root=str(root))
    assert ds.class_to_idx == {"a": 0, "b": 1, "c": 2} and len(ds) == 10


def test_class_folders_differing_only_in_unicode_normalisation_match(tmp_path):
    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    root = tmp_path / "d"
    for split, name in (("train", nfc), ("val", nfd)):
        _images(root / split / name, 2)
        _images(root / split / "zebra", 2)
    train = build_dataset("imagefolder", "train", 16, root=str(root), training=True)
    val = build_dataset("imagefolder", "val", 16, root=str(root), class_map=train.class_to_idx)
    assert val.class_to_idx == train.class_to_idx == {nfc: 0, "zebra": 1}
    assert [t for _, t in val.base.reader.samples] == [0, 0, 1, 1]


# ------------------------------------------------------------------------------------------------ models, weights


@pytest.mark.parametrize("pe_kwargs", [dict(theta=0), dict(theta=-1.0), dict(theta=float("nan"))])
def test_pe_options_that_would_make_nans_are_refused_at_build(pe_kwargs):
    with pytest.raises(ValueError, match="RoPE2D option theta=.* must be a finite number > 0"):
        timm.create_model("vit_n_rope2d", pe_kwargs=pe_kwargs)
    with pytest.raises(ValueError, match="reg_tokens .* must be >= 0, got -1"):
        timm.create_model("vit_n_ape", reg_tokens=-1)


OVERFLOWING = [  # (model, pe_kwargs, what the message names): finite options whose numbers overflow float32
    ("vit_n_alibi2d", dict(slope_scale=1e300), r"ALiBi2D with slope_scale=1e\+300: its logits bias at layer 0"),
    ("vit_n_lookhere", dict(global_slope=1e300), "LookHere with .*global_slope=1e\\+300.*: its logits bias"),
    ("vit_n_rope2d", dict(rescale_coords=1e300), "RoPE2D with .*rescale_coords=1e\\+300: its rotated queries"),
    ("vit_n_ape", dict(std=1e300), "LearnedAPE with std=1e\\+300: its 'pos_embed' is not finite"),
    ("vit_n_irpe", dict(init_std=1e300), "IRPE with .*init_std=1e\\+300: at layer 0 its 'k' is not finite"),
]


@pytest.mark.parametrize("name, pe_kwargs, message", OVERFLOWING, ids=[c[0] for c in OVERFLOWING])
def test_pe_options_that_overflow_float32_are_refused_at_build(name, pe_kwargs, message):
    tiny_vit = {k: v for k, v in FAMILIES["vit"].tiny.items()}
    with pytest.raises(ValueError, match=message + ".*an option overflows float32; use smaller values"):
        timm.create_model(name, pe_kwargs=pe_kwargs, **tiny_vit)
    timm.create_model(name, pe_kwargs={k: 4.0 for k in pe_kwargs}, **tiny_vit)  # a large but sane value builds


def test_the_pe_probe_leaves_the_random_state_as_it_was(monkeypatch):
    """The probe runs the PE's training-mode coordinate jitter: a model built from a seed draws what it drew."""
    import visionpe.pos.presets as presets

    def build_and_draw():
        torch.manual_seed(0)
        model = timm.create_model("vit_n_rope2d_dinov3_aug", **FAMILIES["vit"].tiny)
        return torch.cat([p.detach().flatten() for p in model.parameters()] + [torch.rand(3)])

    probed = build_and_draw()
    monkeypatch.setattr(presets, "probe_pe", lambda pe, options: None)
    assert torch.equal(probed, build_and_draw())


def _tiny_weights(tmp_path, name: str, dtype=None, **kwargs) -> Path:
    model = timm.create_model("vit_n_ape", **{**FAMILIES["vit"].tiny, **kwargs})
    state = {k: v if dtype is None else (v * 1000).to(dtype) for k, v in model.state_dict().items()}
    torch.save(state, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_timm_overlay_refuses_integer_weights_like_the_engines_loader(tmp_path, dtype):
    path = _tiny_weights(tmp_path, "ints.pth", dtype)
    tiny_vit = FAMILIES["vit"].tiny
    kind = f"is {str(dtype)[6:]} \\(the model's is float32\\)"
    with pytest.raises(ValueError, match=f"tensor\\(s\\) of another kind of number .*{kind}"):
        timm.create_model("vit_n_ape", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **tiny_vit)
    cfg = load_config(None, ["model.name=vit_n_ape", "model.kwargs.pretrained=true", "data.resolution=32"])
    cfg.model.kwargs.update(pretrained_cfg_overlay=dict(file=str(path)), patch_size=8, embed_dim=32, depth=2)
    cfg.model.kwargs.update(num_heads=2)
    with pytest.raises(ValueError, match=kind):  # the engine's model.kwargs route
        build_model(cfg, 10, 3)


def test_timm_overlay_of_another_classifier_size_names_num_classes(tmp_path):
    path = _tiny_weights(tmp_path, "w16.pth", num_classes=16)
    tiny_vit = {k: v for k, v in FAMILIES["vit"].tiny.items() if k != "num_classes"}  # timm's default: 1000
    with pytest.raises(ValueError, match="'head' has 16 classes, the model 1000: add num_classes=16 to pretrained_cfg"):
        timm.create_model("vit_n_ape", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **tiny_vit)
    overlay = dict(file=str(path), num_classes=16)  # the fix: the model has 16 classes and loads them
    model = timm.create_model("vit_n_ape", pretrained=True, pretrained_cfg_overlay=overlay, **tiny_vit)
    assert torch.equal(model.head.weight, torch.load(path)["head.weight"])
    model = timm.create_model("vit_n_ape", pretrained=True, pretrained_cfg_overlay=overlay, num_classes=7, **tiny_vit)
    assert model.head.weight.shape == (7, 32)  # num_classes of its own: a new classifier


def test_model_drop_path_zero_is_honoured_for_swin():
    def rates(drop_path):
        cfg = load_config(None, ["model.name=swin_t_rpb", f"model.drop_path={drop_path}"])
        kwargs = {k: v for k, v in FAMILIES["swin"].tiny.items() if k not in ("img_size", "num_classes")}
        cfg.model.kwargs = kwargs
        model = build_model(cfg, 10, 3)
        return [m.drop_prob for m in model.modules() if type(m).__name__ == "DropPath"]

    assert rates(0.0) == []  # no stochastic depth at all (Swin's own default is 0.1)
    assert max(rates(0.2)) == pytest.approx(0.2)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_integer_or_bool_tensors_where_float_weights_belong_are_refused(tmp_path, dtype):
    out = run(tiny(tmp_path, "train.run_name=w", "train.epochs=1"))
    path = next((out / "checkpoints").glob("*.safetensors"))
    tensors, meta = load_weights(path)
    tensors = {k: v.clone() for k, v in tensors.items()}
    key = next(k for k, v in tensors.items() if v.is_floating_point())
    tensors[key] = (tensors[key] * 1000).to(dtype)
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(CheckpointError, match=f"{key} is {str(dtype)[6:]} \\(the model's is float32\\)"):
        load_checkpoint(tmp_path / "bad.safetensors")


def test_cvt_takes_a_batch_of_zero_images_like_vit_and_swin():
    for family in ("cvt", "vit", "swin"):
        fam = FAMILIES[family]
        name = list_visionpe_models(f"{family}_*")[0]
        model = timm.create_model(name, **fam.tiny).eval()
        out = model(torch.zeros(0, 3, 32, 32))
        assert out.shape == (0, fam.tiny.get("num_classes", 1000)), family


# ------------------------------------------------------------------------------------- destinations and backends


def test_eval_json_into_a_missing_folder_is_refused_before_evaluating(tmp_path, capsys, monkeypatch):
    from visionpe.engine import evaluate

    monkeypatch.setattr(evaluate, "evaluate_checkpoint", lambda *a, **k: pytest.fail("evaluated first"))
    assert eval_main(["--checkpoint", str(tmp_path), "--json", str(tmp_path / "missing" / "r.json")]) == 2
    assert f"folder {tmp_path / 'missing'} does not exist" in capsys.readouterr().err


def test_attention_backend_errors_name_the_backend_not_a_resolution(monkeypatch):
    monkeypatch.setenv("VISIONPE_ATTN", "bogus")
    with pytest.raises(ValueError, match="VISIONPE_ATTN='bogus' is not a backend"):
        check_attn_backend(torch.device("cpu"))
    monkeypatch.setenv("VISIONPE_ATTN", "xformers")
    with pytest.raises(ValueError, match="VISIONPE_ATTN=xformers (runs on CUDA only|but xformers is not installed)"):
        check_resolutions(torch.nn.Identity(), "m", {}, torch.device("cpu"), None)


def test_a_resolution_too_large_for_memory_is_one_line_about_memory():
    class Huge(torch.nn.Module):
        def forward(self, x):
            raise MemoryError

    ds = build_dataset("synthetic-shapes", "val", 16, options=dict(num_train=4, num_val=4))
    with pytest.raises(ValueError, match="at resolution 16 needs more memory than cpu has; choose smaller"):
        check_resolutions(Huge(), "m", {16: ds}, torch.device("cpu"), None)
