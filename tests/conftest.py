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


def write_fashion_idx(root, n_train: int = 256, n_val: int = 64, seed: int = 0):
    """Fashion-MNIST's four IDX files (uint8, uncompressed) under `root`: 28 x 28 images where a bright bar's row
    encodes the class (of 10) on a noisy dark background, so a tiny model can learn them. Returns `root`."""
    import numpy as np

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", n_train), ("t10k", n_val)):
        labels = rng.permutation(np.arange(n) % 10).astype(np.uint8)
        images = rng.integers(0, 40, (n, 28, 28), dtype=np.uint8)
        for i, y in enumerate(labels):
            images[i, 1 + 2 * int(y) : 3 + 2 * int(y), 4:24] = 255
        for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
            header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
            (root / f"{prefix}-{kind}-ubyte").write_bytes(header + arr.tobytes())
    return root


@pytest.fixture(scope="session")
def fashion_root(tmp_path_factory) -> str:
    """A small Fashion-MNIST-format folder (256 train / 64 test items) for `data.root`: the tests never need
    Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist)."""
    return str(write_fashion_idx(tmp_path_factory.mktemp("fashion-mnist")))


@pytest.fixture(scope="session", autouse=True)
def _no_installed_fashion_mnist(tmp_path_factory):
    """Hide Debian's Fashion-MNIST from the data factories, so a test that forgets `data.root` fails on CI as it would
    on a fresh machine (tests take `fashion_root`; the one test of the package itself reads DEFAULT_ROOT directly)."""
    import visionpe.data.datasets.fashion_mnist as fm

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fm, "DEFAULT_ROOT", str(tmp_path_factory.getbasetemp() / "use-the-fashion_root-fixture"))
        yield
