"""The model zoo: every backbone family x PE preset, registered with timm as `{family}_{size}_{pe}`.

- registry.py: size tables x presets -> pretrained cfgs -> timm registrations; name lookups
- family.py: what a family declares (`Family`); `*_family.py`: each family's sizes and PE variants
- pretrained_cfgs.py: the published weights each model loads; `*_weights.py`: each family's checkpoint
  filter, onto the helpers they share (checkpoint_filters.py)

Importing the zoo registers every model with timm.
"""

from .registry import (
    FAMILIES,
    Family,
    create_model,
    expand_models,
    family_of,
    list_visionpe_models,
    model_name,
    name_parts,
    register_family,
    timm_equivalent,
)

__all__ = [
    "FAMILIES",
    "Family",
    "create_model",
    "expand_models",
    "family_of",
    "list_visionpe_models",
    "model_name",
    "name_parts",
    "register_family",
    "timm_equivalent",
]
