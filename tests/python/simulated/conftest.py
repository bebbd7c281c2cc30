"""The simulated-driver suite (ctest name python_simulated): collected only when FERRY_TEST_SIMULATED=1, which its
ctest entry sets, so that it runs in a process of its own. The simulation is installed here, before any test can
load the driver."""

import os

import pytest

if os.environ.get("FERRY_TEST_SIMULATED") != "1":
    collect_ignore_glob = ["test_*.py"]
else:
    from ferry import _ferry

    _ferry._sim_install()


@pytest.fixture(autouse=True)
def _no_fault_or_hold_leaks_between_tests():
    from ferry import _ferry

    yield
    _ferry._sim_fault("", 0, 0)
    _ferry._sim_hold(False)

