"""Reading recipes and run configs: YAML with the surprises of YAML 1.1 taken out.

- A key given twice in one mapping (a second `train:` section, say) is an error naming both lines: PyYAML would keep
  the last one and silently drop the first.
- A number with a leading zero (`epochs: 010`) is read as written, in decimal (10), as YAML 1.2 does; YAML 1.1 would
  read it as octal (8). A string key keeps it as typed (`run_name: 007` is "007").
- A file that is not UTF-8 is an error naming the file and the first bad byte.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

__all__ = ["YamlError", "load_yaml_text", "load_yaml_file"]


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
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?(?:0|[1-9][0-9_]*))$"),
    list("-+0123456789"),
)


def _mapping_without_duplicates(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
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


def load_yaml_text(text: str, name: str = "<text>"):
    """Parse YAML text (errors name `name`)."""
    loader = _Loader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise YamlError(f"{name} is not valid YAML: {' '.join(str(e).split())}") from None
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
