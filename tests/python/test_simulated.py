"""Runs simulated/ in a fresh process that uses ferry's simulated driver (host memory playing device memory), so
the whole D2H/H2D path from Python is tested on a machine without a GPU. The simulation must be installed before
the driver is first loaded, hence the subprocess."""

import os
import pathlib
import subprocess
import sys

import pytest
from ferry import _ferry

HERE = pathlib.Path(__file__).parent


@pytest.mark.skipif(not hasattr(_ferry, "_sim_install"),
                    reason="ferry._ferry was built without FERRY_PYTHON_TEST_HOOKS (a wheel)")
def test_simulated_driver_suite():
    env = dict(os.environ, FERRY_TEST_SIMULATED="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "simulated")],
        env=env, capture_output=True, text=True, timeout=600)
    sys.stdout.write(proc.stdout[-20000:])
    sys.stderr.write(proc.stderr[-5000:])
    assert proc.returncode == 0, "the simulated-driver suite failed (its output is above)"
