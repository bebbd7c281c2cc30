"""Shared fixtures for ferry's pytest suite.

Layout:
  test_api.py, test_arguments.py, test_nocuda.py  run in this process (CI has no GPU: no driver is loaded)
  test_simulated.py                               runs simulated/ in a subprocess with ferry's simulated driver
  simulated/                                      the full D2H/H2D path on the CPU (collected only in that subprocess)
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
