"""The simulated-driver ops suite: collected only when FERRY_TEST_OPS_SIMULATED=1 (set by ../test_ops_simulated.py,
which runs it in its own process). The simulation (testing.c's driver plus ops_testing.c's operator entry points:
an sm_90 device whose GEMM launches are computed on the CPU) is installed here, before any test loads the driver."""

import os

import pytest

if os.environ.get("FERRY_TEST_OPS_SIMULATED") != "1":
    collect_ignore_glob = ["test_*.py"]
else:
    from ferry import _ferry

    _ferry._sim_install()
    _ferry._ops_sim_install()


@pytest.fixture(autouse=True)
def _clean_between_tests():
    from ferry import _ferry

    yield
    _ferry._sim_fault("", 0, 0)
    _ferry._ops_sim_compute(True)
