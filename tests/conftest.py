import os

import pytest
import torch

# VISIONPE_TEST_THREADS pins the torch threads (e.g. 1 to check the suite single-threaded); else the 2 cores are shared
# between the xdist workers
_workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
_threads = os.environ.get("VISIONPE_TEST_THREADS")
torch.set_num_threads(int(_threads) if _threads else max(1, min(2, os.cpu_count() or 1) // _workers))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def one_per_pe(names: list[str]) -> list[str]:
    """One name per family x PE (the nano one where it exists). Every size of a PE builds the same model under a
    family's `tiny` kwargs (they set every dimension a size sets), so the tiny-model tests run each once."""
    chosen: dict[tuple[str, str], str] = {}
    for name in names:
        family, size, *pe = name.split("_")
        key = (family, "_".join(pe))
        if key not in chosen or size == "n":
            chosen[key] = name
    return sorted(chosen.values())
