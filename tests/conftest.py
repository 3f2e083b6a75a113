"""Shared fixtures: offline environment, the tiny model, the data root."""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
from support.budget import budget_verdict  # noqa: E402

from cipr.data.paths import data_root  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is available on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_stale_log_handlers():
    """Remove the root StreamHandlers a test added (a command run in process calls logging.basicConfig on the
    stream pytest captured for that test): a later test's server thread logging through one would write to a
    closed stream ('ValueError: I/O operation on closed file' in the output)."""
    import logging

    root = logging.getLogger()
    before = list(root.handlers)
    yield
    for handler in list(root.handlers):
        if handler not in before and type(handler) is logging.StreamHandler:
            root.removeHandler(handler)


LEFT_OUT: set[str] = set()
"""The `extended(name=...)` tests this session's time budget skipped (support/budget.py)."""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """`extended(seconds=S, name=N, after=A)`: where CIPR_TEST_DEADLINE (Unix time) is set, a test that may
    not finish before it is skipped with the numbers (support/budget.py). CI sets the deadline from its own
    budget; without it every test runs."""
    mark = item.get_closest_marker("extended")
    deadline = os.environ.get("CIPR_TEST_DEADLINE")
    if mark is None or not deadline:
        return
    reason = budget_verdict(float(deadline) - time.time(), float(mark.kwargs["seconds"]),
                            mark.kwargs.get("after"), LEFT_OUT)
    if reason is not None:
        if mark.kwargs.get("name"):
            LEFT_OUT.add(mark.kwargs["name"])
        pytest.skip(reason)


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
