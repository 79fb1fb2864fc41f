"""Notebooks saved before the layer folders keep working: every old flat name imports as the very module
it moved to (labkit.MOVED), so code and monkeypatches through either name meet one module."""
import importlib
import subprocess
import sys

import pytest

import labkit
from labkit import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_name_is_the_moved_module(old):
    new = importlib.import_module(f"labkit.{MOVED[old]}")
    assert importlib.import_module(f"labkit.{old}") is new
    assert getattr(labkit, old) is new
    assert new.__spec__.name == f"labkit.{MOVED[old]}"  # the alias does not rename the module


def test_old_from_imports_work_in_a_fresh_process():
    code = ("from labkit import memlab, kernels, diagnose; from labkit.device import PEAK_TABLE; "
            "import labkit.widgets, labkit.chapters.profiling as p; import labkit as lk; "
            "assert diagnose is p and memlab.__name__ == 'labkit.chapters.memlab' and PEAK_TABLE; "
            "assert callable(lk.predict) and lk.whatif.catalogue()['devices']; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_an_unknown_name_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("labkit.no_such_module")
    with pytest.raises(AttributeError):
        labkit.no_such_module  # noqa: B018
