"""The command line (labkit/__main__.py): a number the CLI cannot read is one line naming the field (like every
ConfigError), exit status 2 -- not argparse's whole usage text; and `labkit sweep` counts, checks and writes
its rows before and after its runs (runs faked)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import labkit as lk
from labkit import __main__ as cli

from conftest import fill as _fill, mounted as _mounted, remount_ro as _remount_ro, temps as _temps

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


# ---- labkit sweep ----------------------------------------------------------------------------------


@pytest.fixture
def fake_runs(monkeypatch):
    """The CLI's sweep with its runs faked: counts what ran, costs no training."""
    ran = []

    def run(cfg, **kw):
        ran.append(cfg)
        return lk.Result(cfg, {"status": "completed", "accum": cfg.accum, "tokens_per_s": 1.0})

    monkeypatch.setattr(cli, "run", run)
    monkeypatch.setattr(cli, "check_device", lambda cfg: None)
    return ran


def _sweep(capsys, *args):
    rc = cli.main(["sweep", "--model", "tiny", "--steps", "1", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err.strip().splitlines()


def test_sweep_says_the_count_and_refuses_a_million_runs(fake_runs, capsys, monkeypatch):
    built = []
    monkeypatch.setattr(cli.itertools, "product", lambda *a: built.append(1) or iter(()))
    vals = ",".join(str(i) for i in range(1, 1001))
    rc, out, err = _sweep(capsys, "--grid", f"accum={vals}", "--grid", f"seed={vals}")
    assert rc == 2 and len(err) == 1 and "1,000,000 runs" in err[0] and "--max-runs 1000000" in err[0]
    assert built == [] and fake_runs == []  # refused before one configuration was built
    monkeypatch.undo()


def test_sweep_announces_the_count_and_the_time_left(fake_runs, capsys):
    rc, out, err = _sweep(capsys, "--grid", "accum=1,2,3")
    assert rc == 0 and len(fake_runs) == 3
    assert err[0].startswith("sweep: 3 runs (3 accum), 1 update each") and "estimated" in err[0]
    assert err[-1].startswith("sweep: 3/3 runs done in ")
    rc, _, err = _sweep(capsys, "--grid", "accum=1,2,3", "--max-runs", "2")
    assert rc == 2 and "at most 2 runs" in err[0]
    rc, _, err = _sweep(capsys, "--grid", "accum=1,2,3", "--max-runs", "3")
    assert rc == 0


@pytest.mark.parametrize("args, words", [
    (["--grid", "accum=1,2", "--grid", "accum=4"], "accum is already given by --grid accum=1,2"),
    (["--grid", "micro-batch=1", "--grid", "micro_batch=2"], "micro_batch is already given by --grid micro-batch=1"),
    (["--grid", "pin-memory=ture,flase"], "pin_memory='ture' is not allowed: true, false, on, off, 1 or 0"),
    (["--grid", "pin_memory=yes"], "true, false, on, off, 1 or 0"),
    (["--grid", "pin_memory=off,0"], "each value once: off and 0 are both False"),
    (["--max-runs", "0"], "max_runs=0"),
])
def test_sweep_refuses_repeated_fields_and_unreadable_booleans(fake_runs, capsys, args, words):
    rc, out, err = _sweep(capsys, *args)
    assert rc == 2 and len(err) == 1 and words in err[0], err
    assert fake_runs == [] and out == ""


def test_sweep_booleans_read_six_words(fake_runs, capsys):
    rc, out, err = _sweep(capsys, "--grid", "pin_memory=On,false")
    assert rc == 0 and [c.pin_memory for c in fake_runs] == [True, False]


@pytest.mark.parametrize("where", ["dir", "dev_full", "read_only", "missing"])
def test_sweep_checks_out_before_any_run(fake_runs, capsys, tmp_path, where):
    if where == "read_only":
        ctx = _mounted(tmp_path)
        mnt = ctx.__enter__()
        _remount_ro(mnt)
        out = mnt / "rows.csv"
    else:
        ctx = None
        out = {"dir": tmp_path, "dev_full": Path("/dev/full"), "missing": tmp_path / "no" / "rows.csv"}[where]
    try:
        rc, stdout, err = _sweep(capsys, "--grid", "accum=1,2", "--out", str(out))
    finally:
        if ctx:
            ctx.__exit__(None, None, None)
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"error: out='{out}' is not allowed"), err
    assert fake_runs == []
    assert Path("/dev/full").is_char_device()


def test_sweep_prints_the_rows_when_writing_fails_at_the_end(fake_runs, capsys, tmp_path, monkeypatch):
    with _mounted(tmp_path) as mnt:
        real = cli.run

        def run_then_fill(cfg, **kw):
            if len(fake_runs) == 1:
                _fill(mnt)  # the disk fills up while the sweep runs
            return real(cfg, **kw)

        monkeypatch.setattr(cli, "run", run_then_fill)
        rc, out, err = _sweep(capsys, "--grid", "accum=1,2", "--out", str(mnt / "rows.csv"))
        assert rc == 1 and any("No space left" in e and "rows follow on stdout" in e for e in err), err
        rows = json.loads(out)
        assert [r["accum"] for r in rows] == [1, 2]
        assert _temps(mnt) == [] and not (mnt / "rows.csv").exists()


def test_sweep_writes_csv_and_json_atomically(fake_runs, capsys, tmp_path):
    for name in ("rows.csv", "rows.json"):
        rc, out, err = _sweep(capsys, "--grid", "accum=1,2", "--out", str(tmp_path / name))
        assert rc == 0 and f"wrote 2 rows to {tmp_path / name}" in err
    assert (tmp_path / "rows.csv").read_text().splitlines()[0].startswith("status,accum")
    assert [r["accum"] for r in json.loads((tmp_path / "rows.json").read_text())] == [1, 2]
    assert _temps(tmp_path) == []
