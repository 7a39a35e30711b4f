"""The training/evaluation config: dataclasses with defaults, a YAML recipe on top, dotted `key=value` overrides last.

    cfg = load_config("configs/quick.yaml", ["model.name=vit_n_ape", "train.epochs=2", "model.kwargs.depth=2"])

Every key has a default and a one-line help (`python train.py --help` prints them). An unknown key, in a file or an
override, is an error naming the nearest valid key; values are converted to the key's type (`1e-3` is a float,
`32,48,64` a list) or rejected with the expected type. This module reads, overrides, checks, saves and lists configs;
the sections and their keys are declared in config_sections.py (and re-exported here).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from .config_sections import (
    STRATEGIES,
    AugConfig,
    Config,
    DataConfig,
    EvalConfig,
    FsdpConfig,
    ModelConfig,
    NativeConfig,
    OptimConfig,
    TrainConfig,
    check_run_name,
    setting,
)
from .yaml_io import YamlError, load_yaml_file, load_yaml_text, short_repr, yaml11_booleans

__all__ = [
    "Config",
    "ModelConfig",
    "DataConfig",
    "NativeConfig",
    "native_settings",
    "AugConfig",
    "OptimConfig",
    "TrainConfig",
    "EvalConfig",
    "FsdpConfig",
    "STRATEGIES",
    "check_run_name",
    "ConfigError",
    "load_config",
    "apply_overrides",
    "config_from_dict",
    "read_section",
    "setting",
    "config_to_dict",
    "config_keys",
    "format_config_help",
    "save_config",
    "check_training_config",
]


class ConfigError(ValueError):
    """A config key or value that cannot be used; the message names the fix."""


# ------------------------------------------------------------------------------------------------------- keys, types


def _sections(root: type = Config) -> dict[str, type]:
    """section name -> its dataclass, for `Config` or a config with more sections (e.g. a benchmark file's)."""
    hints = typing.get_type_hints(root)
    return {f.name: hints[f.name] for f in dataclasses.fields(root)}


def config_keys(root: type = Config) -> list[tuple[str, Any, str, Any]]:
    """(dotted key, default, help, type) for every key."""
    out = []
    for section, cls in _sections(root).items():
        hints = typing.get_type_hints(cls)
        default = cls()
        for f in dataclasses.fields(cls):
            out.append((f"{section}.{f.name}", getattr(default, f.name), f.metadata.get("help", ""), hints[f.name]))
    return out


def _key_types(root: type = Config) -> dict[str, Any]:
    return {k: tp for k, _, _, tp in config_keys(root)}


def nearest_key(key: str, keys: list[str]) -> str:
    leaf = key.split(".")[-1]
    same_leaf = [k for k in keys if k.split(".")[-1] == leaf]
    if same_leaf:
        return same_leaf[0]
    return difflib.get_close_matches(key, keys, n=1, cutoff=0.0)[0]


def _unknown(key: str, where: str, root: type = Config) -> ConfigError:
    keys = list(_key_types(root))
    return ConfigError(
        f"unknown config key {short_repr(key)}{where}; did you mean {nearest_key(key, keys)!r}? "
        f"(`{root.HELP}` lists every key)"
    )


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp, key: str) -> Any:
    """Convert `value` (from YAML or a command line) to the type `tp` of `key`, or raise a ConfigError."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in ("null", "none", "~", "")):
            return None
        return coerce(value, args[0], key)
    bad = ConfigError(f"{key} expects {_type_name(tp)}, got {short_repr(value)}")
    if value is None:
        raise bad
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise bad
    if tp is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(value) if isinstance(value, (int, str)) else _raise(bad)
        except ValueError:
            raise bad from None
    if tp is float:
        if isinstance(value, bool):
            raise bad
        try:
            return float(value) if isinstance(value, (int, float, str)) else _raise(bad)
        except ValueError:
            raise bad from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise bad
        return str(value)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):
            text = value.strip().strip("[]()")
            value = [v.strip() for v in text.split(",") if v.strip()]
        elif not isinstance(value, (list, tuple)):
            value = [value]
        return [coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover (a new field of an unhandled type)


def expand_home(value: Any) -> Any:
    """`~` (and `~user`) at the start of a path, or of each path of a dict or list, as the home folder."""
    if isinstance(value, str):
        return os.path.expanduser(value)
    if isinstance(value, dict):
        return {k: expand_home(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_home(v) for v in value]
    return value


def _raise(e: Exception):
    raise e


_BOUNDS = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b)}
_BOUNDS |= {"le": ("<=", lambda v, b: v <= b), "lt": ("<", lambda v, b: v < b)}


def describe_check(check: dict) -> str:
    """A key's declared range for --help, e.g. '  [>= 0, < 1]' ('' when it declares none)."""
    parts = [f"{sign} {check[b]}" for b, (sign, _) in _BOUNDS.items() if b in check]
    parts += [text for name, text in (("nonempty", "at least one"), ("unique", "each once")) if check.get(name)]
    if "choices" in check:
        parts.append(" | ".join(map(str, check["choices"])))
    parts += [f"{k} = {v}" for k, v in check.get("synonyms", {}).items()]
    return f"  [{', '.join(parts)}]" if parts else ""


def check_value(value: Any, check: dict, key: str, help: str = "") -> None:  # noqa: A002
    """Raise a ConfigError unless `value` (each item of a list) meets the key's declared `check` (see `setting`)."""
    if isinstance(value, list) and not value and check.get("nonempty"):
        raise ConfigError(f"{key} is empty; list at least one, e.g. {key}={check['nonempty']}")
    repeated = sorted({str(v) for v in value if value.count(v) > 1}) if check.get("unique") else []
    if repeated:
        raise ConfigError(f"{key} lists {', '.join(repeated)} more than once")
    for i, v in enumerate(value if isinstance(value, list) else [value]):
        where = f"{key}[{i}]" if isinstance(value, list) else key
        if v is None or isinstance(v, (bool, dict)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{where} must be a finite number, got {v}")
        if "choices" in check and v not in check["choices"]:
            raise ConfigError(f"{where} must be one of {', '.join(map(str, check['choices']))}; got {short_repr(v)}")
        try:
            check.get("parse", str)(v)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        failed = [f"{sign} {check[b]}" for b, (sign, ok) in _BOUNDS.items() if b in check and not ok(v, check[b])]
        if failed:
            allowed = " and ".join(f"{sign} {check[b]}" for b, (sign, _) in _BOUNDS.items() if b in check)
            raise ConfigError(f"{where} must be {allowed}, got {short_repr(v)}" + (f" ({help})" if help else ""))


# --------------------------------------------------------------------------------------------- dicts, files, overrides


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def config_from_dict(data: dict | None, where: str = "", root: type = Config) -> Config:
    """A Config (or a `root`: Config with more sections) from a nested dict (YAML); unknown sections/keys are errors
    naming the nearest key."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping of sections{where}, got {type(data).__name__}")
    sections = _sections(root)
    kwargs = {}
    for section, values in data.items():
        if section not in sections:
            raise _unknown(str(section), where, root)
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"config section {section!r}{where} must be a mapping of keys, got {short_repr(values)}")
        kwargs[section] = read_section(sections[section], values, section, where, root)
    return root(**kwargs)


def read_section(cls: type, values: dict, section: str, where: str = "", root: type = Config) -> Any:
    """One section (a dataclass of `setting`s) from a dict: every key converted to its type and checked against its
    declaration; an unknown key is an error naming the nearest key of `root`."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    converted = {}
    for k, v in values.items():
        if k not in fields:
            raise _unknown(f"{section}.{k}", where, root)
        meta = fields[k].metadata
        converted[k] = _spelled(coerce(v, hints[k], f"{section}.{k}"), meta)
        if meta.get("path"):
            converted[k] = expand_home(converted[k])
        check_value(converted[k], meta.get("check", {}), f"{section}.{k}", meta.get("help", ""))
        if meta.get("schema") is not None:
            converted[k] = check_schema(converted[k], meta["schema"], f"{section}.{k}")
        elif isinstance(converted[k], dict):  # free-form (model.kwargs, data.options): yes/no/on/off as YAML 1.1 bools
            converted[k] = yaml11_booleans(converted[k])
    return cls(**converted)


def _spelled(value: Any, meta: Any) -> Any:
    """A string key's value with its declared `synonyms` (see `setting`) replaced by the value they stand for."""
    synonyms = meta.get("check", {}).get("synonyms", {})
    return synonyms.get(value.lower(), value) if isinstance(value, str) else value


def check_schema(values: dict, schema: type, key: str) -> dict:
    """The entries of a dict-valued key, each converted and checked as the `schema` dataclass declares it; an
    unknown entry is an error naming the nearest one."""
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    out = {}
    for name, value in values.items():
        if name not in fields:
            near = difflib.get_close_matches(str(name), list(fields), n=1, cutoff=0.0)
            raise ConfigError(f"unknown config key {key}.{name}; did you mean {key}.{near[0]}?")
        meta = fields[name].metadata
        out[name] = _spelled(coerce(value, hints[name], f"{key}.{name}"), meta)
        check_value(out[name], meta.get("check", {}), f"{key}.{name}", meta.get("help", ""))
    return out


def native_settings(cfg: Config) -> NativeConfig | None:
    """data.native with its defaults filled in; None when it is off (empty)."""
    return NativeConfig(**cfg.data.native) if cfg.data.native else None


def apply_overrides(cfg: Config, overrides: list[str] | tuple[str, ...]) -> Config:
    """Apply `section.key=value` strings; `section.dictkey.sub=value` sets an entry of a dict-valued key. `cfg` may
    be a Config with more sections (e.g. a benchmark file's); an empty value sets a list-valued key to []."""
    data, root = config_to_dict(cfg), type(cfg)
    key_types = _key_types(root)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {short_repr(item)} is not key=value (e.g. train.epochs=2)")
        key, raw = item.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        base = ".".join(parts[:2])
        if base not in key_types:
            raise _unknown(key, " on the command line", root)
        tp = key_types[base]
        section, name = parts[0], parts[1]
        if len(parts) > 2:
            if not (tp is dict or typing.get_origin(tp) is dict):
                raise _unknown(key, " on the command line", root)
            target = data[section][name]
            for p in parts[2:-1]:
                target = target.setdefault(p, {})
            target[parts[-1]] = _override_value(raw, item)
            continue
        union = typing.get_origin(tp) in (typing.Union, types.UnionType)
        plain = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
        if plain[0] is str and raw.strip().lower() not in ("null", "none", "~", ""):
            value = raw  # strings stay as typed: run_name=007 is "007"
        elif typing.get_origin(plain[0]) is list and not raw.strip():
            value = []
        else:
            value = _override_value(raw, item)
        data[section][name] = coerce(value, tp, base)
    return config_from_dict(data, root=root)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the YAML file at `path` (a file or a packaged recipe name; if any), then the overrides."""
    cfg = Config()
    if path is not None:
        from ..recipes import resolve_recipe

        path = resolve_recipe(path)  # a file, or a packaged recipe name such as "quick"
        cfg = config_from_dict(read_yaml(path), f" in {path}")
        if cfg.train.run_name is None:
            cfg.train.run_name = f"{path.stem}-{{model}}"
    return apply_overrides(cfg, list(overrides))


def _override_value(raw: str, item: str):
    if not raw.strip():
        return None
    try:
        return load_yaml_text(raw, f"override {short_repr(item)}")
    except YamlError as e:
        raise ConfigError(str(e)) from None


def read_yaml(path: str | Path):
    """A recipe or run config file (YAML, UTF-8; duplicate keys refused, see yaml_io.py), as a ConfigError."""
    try:
        return load_yaml_file(path)
    except YamlError as e:
        raise ConfigError(str(e)) from None


def check_training_config(cfg: Config) -> None:
    """The checks across keys a training run needs before any work (each key's own range is checked when the
    config is read, from its declaration in config_sections.py)."""
    if cfg.data.native and cfg.data.patch_sizes:
        raise ConfigError(
            f"data.patch_sizes={','.join(map(str, cfg.data.patch_sizes))} does not apply with data.native (its patches "
            "come at data.native.patch_size); drop one of them"
        )
    if cfg.data.patch_sizes and max(cfg.data.patch_sizes) > min(cfg.train_resolutions()):
        raise ConfigError(
            f"data.patch_sizes={','.join(map(str, cfg.data.patch_sizes))} has patches larger than the "
            f"{min(cfg.train_resolutions())} px images; use patch sizes up to the smallest training resolution"
        )
    if (cfg.aug.mixup > 0 or cfg.aug.cutmix > 0) and cfg.data.batch_size % 2:
        raise ConfigError(f"mixup/cutmix pair up images: data.batch_size must be even, got {cfg.data.batch_size}")
    if cfg.data.native and len(set(cfg.data.train_resolutions)) > 1:
        raise ConfigError(
            f"data.train_resolutions={','.join(map(str, cfg.data.train_resolutions))} does not apply with data.native: "
            f"each image keeps its aspect and is resized to a token budget; vary the sizes with data.native.seq_lens "
            f"(e.g. data.native.seq_lens=16,36) and drop data.train_resolutions"
        )


def save_config(cfg: Config, path: str | Path) -> None:
    from .checkpoint import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def format_config_help(sections: dict[str, type] | None = None) -> str:
    """Every key with its default and help, grouped by section (`sections`: name -> dataclass; default: Config's)."""
    lines = []
    for section, cls in (sections or _sections()).items():
        lines.append(f"\n{section}: {(cls.__doc__ or '').strip()}")
        default = cls()
        for f in dataclasses.fields(cls):
            value = yaml.safe_dump(getattr(default, f.name), default_flow_style=True).strip().removesuffix("...")
            allowed = describe_check(f.metadata.get("check", {}))
            lines.append(f"  {section}.{f.name} = {value.strip()}{allowed}\n      {f.metadata.get('help', '')}")
            schema = f.metadata.get("schema")
            for g in dataclasses.fields(schema) if schema is not None else ():
                value = yaml.safe_dump(getattr(schema(), g.name), default_flow_style=True).strip().removesuffix("...")
                allowed = describe_check(g.metadata.get("check", {}))
                lines.append(
                    f"    {section}.{f.name}.{g.name} = {value.strip()}{allowed}\n        {g.metadata['help']}"
                )
    return "\n".join(lines)
