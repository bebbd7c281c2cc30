"""The simulated-driver ops suite (ctest name python_ops_simulated): collected only when FERRY_TEST_OPS_SIMULATED=1,
which its ctest entry sets, so that it runs in a process of its own. The simulation (testing.c's driver plus
ops_testing.c's operator entry points: an sm_90 device whose GEMM launches are computed on the CPU) is installed
here, before any test loads the driver. The target is the simulated device's (FERRY_ARCH is dropped) and the disk
cache starts empty in a directory of this run's own."""

import os
import shutil
import tempfile

import pytest

if os.environ.get("FERRY_TEST_OPS_SIMULATED") != "1":
    collect_ignore_glob = ["test_*.py"]
else:
    os.environ.pop("FERRY_ARCH", None)
    _cache_home = tempfile.mkdtemp(prefix="ferry-ops-simulated-")
    os.environ["XDG_CACHE_HOME"] = _cache_home

    from ferry import _ferry

    _ferry._sim_install()
    _ferry._ops_sim_install()

    def pytest_unconfigure(config):
        shutil.rmtree(_cache_home, ignore_errors=True)


@pytest.fixture(autouse=True)
def _clean_between_tests():
    from ferry import _ferry

    yield
    _ferry._sim_fault("", 0, 0)
    _ferry._ops_sim_compute(True)
