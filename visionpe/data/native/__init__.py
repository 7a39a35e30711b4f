"""Native-resolution batching (`data.native`): the plan (plan.py) picks the sampler of its mode (packed, padded:
sampler.py, pack.py; buckets: buckets.py); items are drawn at the size a key names (items.py, resize.py,
folder_items.py), collated into timm's NaFlex dict (collate.py) by the loaders (loader.py, timm_naflex.py)."""
