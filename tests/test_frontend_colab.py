"""Colab, simulated on the CPU: its runtime sets COLAB_RELEASE_TAG and its kernel imports google.colab. Colab shows
a widget's changes made from a background thread only when another cell runs (colabtools issue 3373, open), so
there the panel's Run button and a drill's Start/Reveal work on the kernel's own thread, the panel's charts are
drawn when the run ends, and the panel says so in a line. Elsewhere nothing changes."""
import sys
import threading
import types

import pytest

import labkit as lk
from labkit.base import frontend


@pytest.fixture
def not_colab(monkeypatch):
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if frontend.on_colab():
        pytest.skip("google.colab is installed in this Python: Colab cannot be simulated away")


@pytest.fixture
def colab(monkeypatch, not_colab):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-simulated")


def test_colab_is_told_by_its_variable_or_its_module(monkeypatch, not_colab):
    assert not frontend.on_colab() and not frontend.threads_draw_late()
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-simulated")
    assert frontend.on_colab() and frontend.threads_draw_late()
    monkeypatch.delenv("COLAB_RELEASE_TAG")
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))  # its kernel imports it
    assert frontend.on_colab()


def _foreground_lines(lab) -> list:
    return [w for w in lab.widget.children if "labkit-foreground" in str(getattr(w, "value", ""))]


def test_elsewhere_the_run_button_trains_on_a_thread_with_live_charts(not_colab):
    lab = lk.Lab(model="tiny", steps=3)
    assert not lab.foreground and not _foreground_lines(lab)
    thread = lab.start()
    assert isinstance(thread, threading.Thread) and lab.wait(300)
    assert len(lab.history) == 1 and lab._charts.renders >= 2  # drawn mid-run, and at the end


def test_on_colab_the_run_button_trains_here_and_draws_at_the_end(colab):
    lab = lk.Lab(model="tiny", steps=3)
    assert lab.foreground and len(_foreground_lines(lab)) == 1  # the panel says so, in one line
    here, seen = threading.get_ident(), []
    real = lab._on_step
    lab._on_step = lambda rec: (seen.append(threading.get_ident()), real(rec))
    assert lab.start() is None  # no thread: the run is over when the click returns
    assert len(lab.history) == 1 and seen == [here] * 3
    assert lab._charts.renders == 1  # the final picture only
    assert lab.run(steps=2).summary["status"] == "completed" and lab._charts.renders >= 2  # code: live as before


def test_a_drill_works_on_the_kernels_thread_on_colab(monkeypatch, not_colab):
    drill = lk.drills.Drill(seed=0, timer=None)
    ran = []
    thread = drill._background(lambda: ran.append(threading.get_ident()))
    assert isinstance(thread, threading.Thread) and drill.wait(60) and ran != [threading.get_ident()]
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-simulated")
    ran.clear()
    assert drill._background(lambda: ran.append(threading.get_ident())) is None
    assert ran == [threading.get_ident()]
