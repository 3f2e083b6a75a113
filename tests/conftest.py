"""Shared fixtures: offline environment, the tiny model, the data root."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from cipr.data.paths import data_root  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is available on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data():
    """The real data root (../shared/data or $CIPR_DATA_ROOT); the tests on real data need it."""
    root = data_root()
    if not root.is_dir():
        pytest.fail(f"data root {root} is missing: set CIPR_DATA_ROOT to the shared data copy")
    return root


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from support.tiny_models import tiny_tokenizer as build

    return build()


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    from support.tiny_models import tiny_model as build

    return build(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A saved tiny model folder (tokenizer + weights) for commands that take a model path."""
    from support.tiny_models import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run faster on one thread than on two contended ones (`usefixtures` per module)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
