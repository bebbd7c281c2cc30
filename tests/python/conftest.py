"""Shared fixtures for ferry's pytest suite.

Layout:
  test_api.py, test_arguments.py, test_nocuda.py  run in this process (CI has no GPU: no driver is loaded)
  simulated/, ops_simulated/, test_bad_inputs.py  the full D2H/H2D and operator paths on ferry's simulated driver;
                                                  each is a ctest entry of its own (python_simulated,
                                                  python_ops_simulated, python_bad_inputs_simulated), which sets
                                                  the variable that lets it collect: the simulation must be
                                                  installed before the driver is first loaded
  test_gpu_*.py                                   need a CUDA device; skipped without one
"""

import ferry
import pytest


@pytest.fixture(scope="session")
def cuda_available() -> bool:
    return ferry.device_count() > 0


@pytest.fixture
def no_cuda(cuda_available):
    """Skip unless this process has no CUDA driver or device (the CI machine)."""
    if cuda_available:
        pytest.skip("a CUDA device is present; this test is about the no-CUDA behaviour")
