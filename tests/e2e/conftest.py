"""Every end-to-end test checks what ran (issue 19: "tests check what runs"): after the test,
nothing failed inside neuroncc, no op fell back to PyTorch, no kernel key was found wanting, and
if Dynamo handed neuroncc any graph, something was compiled (or found in the cache). A test that expects otherwise says so:

    @pytest.mark.expect_fallback("aten.special_bessel_j0.default")   # ops that run eagerly
    @pytest.mark.expect_compiler_errors("program")                    # stages that failed
    @pytest.mark.compiles_nothing("why")  # graphs recorded for warmup, or rejected on purpose
"""

import pytest

import neuroncc


def pytest_configure(config):
    config.addinivalue_line("markers", "expect_fallback(*ops): ops the test lets run eagerly")
    config.addinivalue_line(
        "markers", "expect_compiler_errors(*stages): internal errors the test provokes"
    )
    config.addinivalue_line("markers", "compiles_nothing(why): no graph is meant to compile")


def _expected(request, name: str) -> set[str]:
    marker = request.node.get_closest_marker(name)
    return set(marker.args) if marker else set()


@pytest.fixture(autouse=True)
def checks_what_ran(request):
    neuroncc.reset_stats()
    yield
    s = neuroncc.stats()
    assert set(s["compiler_errors"]) == _expected(request, "expect_compiler_errors"), s
    assert set(s["fallback_nodes"]) == _expected(request, "expect_fallback"), s
    # a kernel key that misses what its emitter reads (Note [kernel reuse]) loses reuse only,
    # but it is a bug in the key: every model the tests compile proves its keys
    assert s["kernel_key_mismatches"] == 0, s
    on_purpose = request.node.get_closest_marker("compiles_nothing") is not None
    if s["dynamo_graphs"] and not s["compiler_errors"] and not on_purpose:
        ran = s["compiles"] + s["cache_hits_memory"] + s["cache_hits_disk"]
        assert ran > 0, f"Dynamo handed over {s['dynamo_graphs']} graphs, none compiled: {s}"
