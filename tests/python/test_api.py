"""The package's surface: names, version, docstrings, stubs."""

import inspect
import pathlib
import re

import ferry
from ferry import _ferry

PACKAGE = pathlib.Path(ferry.__file__).parent


def test_version_matches_the_c_library_and_cmake_project():
    top = pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt"
    declared = re.search(r"project\(ferry VERSION ([0-9.]+)", top.read_text()).group(1)
    assert ferry.__version__ == declared


def test_public_names_are_exported():
    for name in ferry.__all__:
        assert hasattr(ferry, name), name


def test_dlpack_version_is_at_least_1_3():
    assert ferry.DLPACK_VERSION >= (1, 3)


def test_transfer_functions_have_signatures_and_contract_docstrings():
    for fn in (ferry.transfer_tensor_d2h, ferry.transfer_tensor_h2d,
               ferry.transfer_tensor_d2h_async, ferry.transfer_tensor_h2d_async):
        sig = inspect.signature(fn)
        assert list(sig.parameters) == ["batch", "device", "stream", "producer_event"]
        assert sig.parameters["batch"].kind is inspect.Parameter.POSITIONAL_ONLY
        for name in ("device", "stream", "producer_event"):
            assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
            assert sig.parameters[name].default is None
    doc = ferry.transfer_tensor_d2h.__doc__
    for phrase in ("LOCAL_RANK", "pinned", "same object", "ValueError", "RuntimeError", "slab"):
        assert phrase in doc, phrase


def test_error_class_is_a_runtime_error():
    assert issubclass(ferry.FerryError, RuntimeError)


def test_every_ferry_error_has_the_error_record_attributes():
    """Raised for a status or not (the operators' raw-launch timing raises one from a CUresult), a FerryError has
    status, cu_result, cu_name, call and where."""
    e = ferry.FerryError("no status")
    assert (e.status, e.cu_result, e.cu_name, e.call, e.where) == ("", 0, "", "", "")


def test_handle_and_exporter_cannot_be_constructed_directly():
    for cls in (ferry.Transfer, ferry.SlabTensor):
        try:
            cls()
        except TypeError:
            pass
        else:
            raise AssertionError(f"{cls} was constructible")


def test_stubs_cover_every_public_name():
    stub = (PACKAGE / "__init__.pyi").read_text()
    for name in ferry.__all__:
        if name in ("pool", "__version__"):
            continue
        assert re.search(rf"\b{name}\b", stub), name
    assert (PACKAGE / "py.typed").exists()
    assert (PACKAGE / "pool.pyi").exists() or (PACKAGE / "pool.py").exists()


def test_extension_exposes_no_public_test_hooks():
    public = [n for n in dir(_ferry) if not n.startswith("_")]
    assert not [n for n in public if "sim" in n.lower()]


def test_the_extension_refuses_to_load_in_a_subinterpreter_and_the_main_interpreter_keeps_working():
    """Its caches belong to the main interpreter: a subinterpreter gets an ImportError, not shared state that
    outlives it (which made the main interpreter's next transfer fail with the dead interpreter's objects)."""
    import subprocess
    import sys
    import textwrap

    sub = ("try:\n    import ferry._ferry\n    raise SystemExit('imported')\n"
           "except ImportError as e:\n    assert 'subinterpreter' in str(e), e\n")
    code = textwrap.dedent(f"""
        import sys
        try:
            import _testcapi
        except ImportError:
            print("SKIP no _testcapi"); sys.exit(0)
        import ferry
        import numpy as np
        ferry.transfer_tensor_d2h([np.arange(3)])
        assert _testcapi.run_in_subinterp({sub!r}) == 0
        out = ferry.transfer_tensor_d2h([np.arange(3)])
        assert out[0].tolist() == [0, 1, 2]
        print("OK")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if proc.stdout.startswith("SKIP"):
        import pytest

        pytest.skip(proc.stdout.strip())
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stdout + proc.stderr
