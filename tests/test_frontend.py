"""base.frontend: ``Progress`` is silent for a fast job, one line in place after that -- on stderr in a terminal,
as a display handle (stdout) in a notebook, never both -- and closed on exit, also after an error."""
from __future__ import annotations

import sys
import types

import pytest

from labkit.base import frontend
from labkit.base.runtime import ConfigError
from labkit.base.frontend import Progress


def test_a_job_faster_than_the_delay_shows_nothing(capsys):
    with Progress(5, "quick") as bar:
        for i in range(5):
            bar.update(i + 1)
    out = capsys.readouterr()
    assert out.err == "" and out.out == ""


def test_in_a_terminal_one_line_is_rewritten_on_stderr_and_closed(capsys, monkeypatch):
    monkeypatch.setattr(frontend, "MIN_INTERVAL_S", 0.0)
    with Progress(3, "sweep", delay=0) as bar:
        for i in range(3):
            bar.update(i + 1, note=f"run {i + 1}")
    out = capsys.readouterr()
    assert out.out == ""  # stdout stays clean for a CLI's JSON
    assert out.err.count("\r") >= 3 and out.err.endswith("\n") and out.err.count("\n") == 1
    last = out.err.rstrip("\n").split("\r")[-1]
    assert last.startswith("sweep [") and "3/3" in last and last.rstrip().endswith("run 3")


def test_a_shorter_line_covers_the_longer_one_it_overwrites(capsys, monkeypatch):
    monkeypatch.setattr(frontend, "MIN_INTERVAL_S", 0.0)
    with Progress(2, "x", delay=0) as bar:
        bar.update(1, note="a long note " * 3)
        bar.update(2)
    frames = capsys.readouterr().err.rstrip("\n").split("\r")[1:]
    assert len(frames[-1]) >= len(frames[0])


def test_the_line_is_closed_when_the_work_raises(capsys):
    with pytest.raises(ZeroDivisionError):
        with Progress(4, "failing", delay=0) as bar:
            bar.update(1)
            1 / 0
    err = capsys.readouterr().err
    assert "1/4" in err and err.endswith("\n")  # the traceback starts on a line of its own


class _FakeHandle:
    def __init__(self, calls):
        self.calls = calls

    def update(self, obj):
        self.calls.append(("update", repr(obj)))


def test_in_a_notebook_it_updates_one_display_handle_and_never_writes_stderr(capsys, monkeypatch):
    calls = []

    def display(obj, display_id=False):
        assert display_id is True  # a handle, so later states replace this one in place
        calls.append(("display", repr(obj)))
        return _FakeHandle(calls)

    monkeypatch.setattr(frontend, "in_notebook", lambda: True)
    monkeypatch.setattr(frontend, "MIN_INTERVAL_S", 0.0)
    import IPython.display
    monkeypatch.setattr(IPython.display, "display", display)
    with Progress(2, "loader", delay=0) as bar:
        bar.update(1)
        bar.update(2, note="done")
    assert capsys.readouterr().err == ""
    assert [c[0] for c in calls][0] == "display" and {c[0] for c in calls[1:]} == {"update"}
    assert len([c for c in calls if c[0] == "display"]) == 1
    assert "2/2" in calls[-1][1] and "done" in calls[-1][1]


def test_outside_a_kernel_it_is_not_a_notebook(monkeypatch):
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert frontend.in_notebook() is False
    fake = types.SimpleNamespace(get_ipython=lambda: types.SimpleNamespace())  # a terminal IPython: no kernel
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert frontend.in_notebook() is False
    fake.get_ipython = lambda: types.SimpleNamespace(kernel=object())
    assert frontend.in_notebook() is True


def test_done_is_clamped_and_the_bar_fills(monkeypatch):
    with Progress(4, "x", delay=60) as bar:
        bar.update(9)
        assert bar.done == 4 and "[" + "#" * frontend.WIDTH + "]" in bar.text()
        bar.update(-3)
        assert bar.done == 0 and "0/4" in bar.text()


@pytest.mark.parametrize("kwargs, field", [
    (dict(total=-1, label="x"), "total"), (dict(total=2.5, label="x"), "total"), (dict(total=True, label="x"), "total"),
    (dict(total=3, label=None), "label"), (dict(total=3, label="x", delay=float("nan")), "delay"),
])
def test_bad_arguments_are_refused_by_name(kwargs, field):
    with pytest.raises(ConfigError, match=f"^{field}="):
        Progress(**kwargs)


def test_update_outside_the_block_is_an_error():
    with pytest.raises(RuntimeError, match="outside its `with` block"):
        Progress(2, "x").update(1)


class RecordingProgress:
    """Stands in for Progress in other tests (monkeypatch it into the module under test): records each bar
    made (``made``), its total, label, delay and every ``update``."""
    made = []

    def __init__(self, total, label, delay=1.0):
        self.total, self.label, self.delay, self.updates, self.notes = total, label, delay, [], []
        RecordingProgress.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, done, note=""):
        self.updates.append(done)
        self.notes.append(note)
