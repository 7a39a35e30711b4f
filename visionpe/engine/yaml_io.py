"""Reading recipes and run configs: YAML with the surprises of YAML 1.1 taken out.

- A key given twice in one mapping (a second `train:` section, say) is an error naming both lines: PyYAML would keep
  the last one and silently drop the first.
- A number with a leading zero (`epochs: 010`) is read as written, in decimal (10), as YAML 1.2 does; YAML 1.1 would
  read it as octal (8). A string key keeps it as typed (`run_name: 007` is "007").
- A file that is not UTF-8 is an error naming the file and the first bad byte.
- Only `true`/`false` are booleans, as in YAML 1.2. YAML 1.1's yes/no/on/off are read as `YamlWord`s: strings that
  remember their old meaning. A key that takes a string gets the word as written (`amp: off` is "off", not False), a
  key that takes a bool reads it as one, and a free-form mapping (model.kwargs, data.options) gets the bool, as
  before (`yaml11_booleans`); the config does this when it reads each key.
- Anchors and aliases (`&a`, `*a`) work, but a document whose aliases expand to more than MAX_NODES values (a
  "billion laughs" bomb) or refer to a value holding them is an error before any Python object is built.
- `short_repr` gives a value's repr cut to a line's length, for error messages about values read from a file.
"""

from __future__ import annotations

import re
import reprlib
from pathlib import Path
from typing import Any

import yaml

__all__ = ["YamlError", "YamlWord", "load_yaml_text", "load_yaml_file", "short_repr", "yaml11_booleans", "MAX_NODES"]

MAX_NODES = 100_000  # values a document may hold once its aliases are expanded (a recipe holds a few hundred)


class YamlError(ValueError):
    """A recipe that cannot be read as intended; the message names the file, the line and the fix."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and reads leading-zero integers as decimal."""


# the SafeLoader's implicit int resolver, without YAML 1.1's octal (0755) and base-60 (1:30) forms: those stay
# strings here, and the config turns "010" into 10 for an int key and keeps it for a string key
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:int"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class YamlWord(str):
    """An unquoted yes/no/on/off (any of YAML 1.1's spellings): a string that YAML 1.1 would have read as a bool."""

    @property
    def truth(self) -> bool:
        return self.lower() in ("yes", "on")


def yaml11_booleans(value: Any) -> Any:
    """`value` with every YamlWord (in nested dicts and lists too) replaced by its YAML 1.1 bool."""
    if isinstance(value, YamlWord):
        return value.truth
    if isinstance(value, dict):
        return {yaml11_booleans(k): yaml11_booleans(v) for k, v in value.items()}
    if isinstance(value, list):
        return [yaml11_booleans(v) for v in value]
    return value


_WORD_TAG = "tag:visionpe:yaml11-word"
# booleans as in YAML 1.2 (true/false); YAML 1.1's other spellings become YamlWords
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in _Loader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(_WORD_TAG, re.compile(r"^(?:yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF)$"), list("yYnNoO"))
_Loader.add_constructor(_WORD_TAG, lambda loader, node: YamlWord(loader.construct_scalar(node)))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?(?:0|[1-9][0-9_]*))$"),
    list("-+0123456789"),
)


def _mapping_without_duplicates(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`, merged by construct_mapping below
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.setdefault(key, key_node.start_mark.line + 1)
        except TypeError:  # an unhashable key: let PyYAML report it
            continue
        if first != key_node.start_mark.line + 1:
            raise YamlError(
                f"{loader.name}: key {key!r} appears twice (lines {first} and {key_node.start_mark.line + 1}); "
                f"YAML would keep only the last one. Merge the two into one"
            )
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict, _SHORT.maxset = 3, 8, 8, 8, 8
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 120, 120, 60


def short_repr(value: Any) -> str:
    """repr(value) for an error message: long strings, numbers and containers are cut with '...' (never walked
    whole, so a huge value costs nothing)."""
    return _SHORT.repr(value)


def _expanded_size(node: yaml.Node, name: str, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """The number of values `node` stands for with every alias expanded (an alias is the anchored node itself in
    PyYAML's graph, so shared nodes are counted once per use, from `sizes`)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise YamlError(
            f"{name}: an alias refers to the value that holds it (line {node.start_mark.line + 1}); "
            f"a config must be a tree, write the value out"
        )
    open_nodes.add(key)
    children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else node.value
    total = 1
    if isinstance(node, yaml.CollectionNode):
        for child in children:
            total += _expanded_size(child, name, sizes, open_nodes)
            if total > MAX_NODES:
                raise YamlError(
                    f"{name} holds more than {MAX_NODES:,} values once its aliases (*name) are expanded (line "
                    f"{node.start_mark.line + 1}); a config needs far fewer: write the values out, use fewer aliases"
                )
    open_nodes.discard(key)
    sizes[key] = total
    return total


def load_yaml_text(text: str, name: str = "<text>"):
    """Parse YAML text (errors name `name`); aliases expanding beyond MAX_NODES values are refused first."""
    loader = _Loader(text)
    loader.name = name
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, name, {}, set())
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise YamlError(f"{name} is not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise YamlError(f"{name} nests lists or mappings too deeply to read (hundreds of levels)") from None
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path):
    """Parse a UTF-8 YAML file; a file in another encoding is an error naming it."""
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise YamlError(
            f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); save it as UTF-8"
        ) from None
    return load_yaml_text(text, str(path))
