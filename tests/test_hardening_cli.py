"""A number the CLI cannot read is one line naming the field (like every ConfigError), exit status 2 --
not argparse's whole usage text."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def labkit(*args):
    return subprocess.run([sys.executable, "-m", "labkit", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args,words", [
    (["run", "--micro-batch", "abc"], "micro_batch='abc' is not allowed: an integer"),
    (["run", "--seq-len", "nan"], "seq_len='nan' is not allowed: an integer"),
    (["run", "--lr", ""], "lr='' is not allowed: a number"),
    (["run", "--grad-clip", "x"], "grad_clip='x' is not allowed"),
    (["sweep", "--grid", "lr=abc"], "lr='abc' is not allowed"),
])
def test_a_bad_number_is_one_line(args, words):
    out = labkit(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], out.stderr
    assert "usage:" not in out.stderr and out.stdout == ""


def test_numbers_still_parse():
    from labkit.__main__ import _float, _int, _opt_float

    assert _int("8") == 8 and _float("3e-4") == 3e-4 and _opt_float("off") is None and _opt_float("0.5") == 0.5
