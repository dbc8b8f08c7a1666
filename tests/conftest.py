import os

import pytest
from hypothesis import HealthCheck, settings

import neuroncc
from neuroncc.frontend.weight_layout import LAID_OUT
from neuroncc.runtime.cache import GRAPH_CACHE

settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def private_disk_cache(tmp_path_factory, monkeypatch):
    """Each test has its own empty persistent cache: none sees another's compiles, and none
    touches the user's cache directory."""
    root = tmp_path_factory.mktemp("neuroncc-cache")
    monkeypatch.setenv("NEURONCC_CACHE_DIR", str(root))
    return root


@pytest.fixture(autouse=True)
def checked_kernel_keys(monkeypatch):
    """Every compile checks its kernel keys (option check_reuse): a key's second kernel is
    emitted and compared with its template (tests/e2e asserts no mismatch)."""
    monkeypatch.setenv("NEURONCC_CHECK_REUSE", "1")


@pytest.fixture
def fresh():
    """Empty graph cache (and laid-out weights), zeroed stats and a reset Dynamo: each test
    compiles from scratch."""
    import torch._dynamo

    torch._dynamo.reset()
    GRAPH_CACHE.clear()
    LAID_OUT.clear()
    neuroncc.reset_stats()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="session")
def opinfo_ops():
    """PyTorch's OpInfo database by name (with its variant): the OpInfo tests' yardstick."""
    from torch.testing._internal.common_methods_invocations import op_db

    return {
        op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""): op for op in op_db
    }
