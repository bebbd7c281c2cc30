"""Runs ops_simulated/ in a fresh process on ferry's simulated driver with the operator entry points added
(_ops_sim_install): GEMM launches are computed on the CPU from the kernel parameter ferry built, so runs, the fast
launcher and graphs are checked end to end, results included, on a machine without a GPU. The simulation must be
installed before the driver is first loaded, hence the subprocess."""

import os
import pathlib
import subprocess
import sys

import pytest
from ferry import _ferry

HERE = pathlib.Path(__file__).parent


@pytest.mark.skipif(not hasattr(_ferry, "_ops_sim_install"),
                    reason="ferry._ferry was built without FERRY_PYTHON_TEST_HOOKS (a wheel)")
def test_ops_simulated_driver_suite(tmp_path):
    env = dict(os.environ, FERRY_TEST_OPS_SIMULATED="1", XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("FERRY_ARCH", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(HERE / "ops_simulated")],
        env=env, capture_output=True, text=True, timeout=900)
    sys.stdout.write(proc.stdout[-20000:])
    sys.stderr.write(proc.stderr[-5000:])
    assert proc.returncode == 0, "the simulated-driver ops suite failed (its output is above)"
