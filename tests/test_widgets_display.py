"""Every object the course shows as a widget displays as one, on the ipywidgets the learner has: 8 here, 7.7.1
on Colab (`.ci/widgets7` runs this file in a venv with ipywidgets 7.7.1). On 7 a widget has no
``_repr_mimebundle_``; the objects used to call it and showed a traceback and their text repr instead.

Each object is the last line of a cell run by IPython, as in a chapter: what the notebook receives
(display_data and execute_result alike) must carry the widget mime type, with nothing on stderr. With
ipywidgets 7 one chapter that shows widgets is also executed in a kernel of this Python with nbclient
(under ipywidgets 8 nbval already runs it in the main suite)."""
import json
import os
import re
import sys
from pathlib import Path

import ipywidgets
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import labkit as lk

WIDGET = "application/vnd.jupyter.widget-view+json"
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
IPYWIDGETS_MAJOR = int(ipywidgets.__version__.split(".")[0])
# the cheapest chapter that shows widgets (the quiz, a drill, a gauntlet): nothing trains until a click
CHAPTER = NOTEBOOKS / "interview_questions.ipynb"


def shown(obj) -> tuple:
    """(the mime bundles a notebook gets when ``obj`` is a cell's last line, what went to stdout/stderr)."""
    shell = InteractiveShell.instance()
    results = []
    hook = shell.displayhook
    real = hook.write_format_data
    hook.write_format_data = lambda format_dict, md_dict=None: results.append(format_dict)  # execute_result
    try:
        with capture_output() as cap:  # display_data
            shell.user_ns["shown_object"] = obj
            run = shell.run_cell("shown_object", store_history=False)
    finally:
        hook.write_format_data = real
        shell.user_ns.pop("shown_object", None)
    assert run.error_in_exec is None, run.error_in_exec
    return [o.data for o in cap.outputs] + results, cap.stdout + cap.stderr


def assert_displays_as_widget(obj):
    bundles, printed = shown(obj)
    assert [WIDGET in b for b in bundles] == [True], (bundles, printed)  # one output: the widget
    view = bundles[0][WIDGET]
    assert view["model_id"] == getattr(obj, "widget", obj).model_id and view["version_major"] == 2, view
    assert "Traceback" not in printed and "Error" not in printed, printed


def chapter_presets(name: str) -> list:
    """The presets of the panels a chapter builds (``lk.Lab(preset="...")`` in its code cells)."""
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    presets = re.findall(r"lk\.Lab\(preset=\"(\w+)\"", code)
    assert presets, f"{name} builds no lk.Lab(preset=...)"
    return presets


@pytest.mark.parametrize("chapter", ["00_start_here.ipynb", "02_mixed_precision.ipynb"])
def test_the_panel_displays_as_a_widget(chapter):
    for preset in chapter_presets(chapter):
        assert_displays_as_widget(lk.Lab(preset=preset, model="tiny", steps=3))


def test_the_quiz_displays_as_a_widget():
    from labkit.content.quiz import Quiz

    assert_displays_as_widget(Quiz())
    assert_displays_as_widget(Quiz(topic="memory", shuffle=True, seed=1))


def test_a_drill_and_a_gauntlet_display_as_widgets():
    assert_displays_as_widget(lk.drills.Drill(seed=0))
    assert_displays_as_widget(lk.drills.Gauntlet(seed=0, n=2))


def test_chapter_10s_layout_widget_displays_as_a_widget():
    """An ipywidgets box itself (chapter 10 shows it with display())."""
    from labkit.chapters import ch10_parallel as parallel

    assert_displays_as_widget(parallel.layout_widget())


def test_display_also_shows_the_widget():
    """``display(obj)`` (not only a cell's last line) publishes the widget."""
    from IPython.display import display

    InteractiveShell.instance()
    quiz = lk.quiz.Quiz()
    with capture_output() as cap:
        display(quiz)
    assert [WIDGET in o.data for o in cap.outputs] == [True] and not cap.stderr, (cap.outputs, cap.stderr)


@pytest.mark.skipif(IPYWIDGETS_MAJOR >= 8, reason="with ipywidgets 8 nbval runs this chapter in the main suite")
def test_a_chapter_runs_with_its_widgets_in_a_kernel_of_this_python(tmp_path):
    """The chapter executed by nbclient in a kernel of this Python (so of its ipywidgets): no error output,
    and every widget it shows is a widget output."""
    import nbformat
    from nbclient import NotebookClient

    spec = tmp_path / "kernels" / "labkit-here"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "labkit (this Python)", "language": "python"}))
    nb = nbformat.read(CHAPTER, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import ipywidgets\nprint(ipywidgets.__version__)"))
    here = str(Path(lk.__file__).resolve().parent.parent)  # the kernel imports the labkit this test imported
    path = os.pathsep.join(filter(None, (here, os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "LABKIT_MODE": "short", "JUPYTER_PATH": str(tmp_path), "PYTHONPATH": path}
    old = os.environ.copy()
    os.environ.update(env)  # the kernel inherits this environment
    try:
        NotebookClient(nb, kernel_name="labkit-here", timeout=600, resources={"metadata": {"path": str(tmp_path)}}
                       ).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.output_type == "error" or o.get("name") == "stderr"]
    assert not errors, errors
    widgets = [o for o in outputs if WIDGET in o.get("data", {})]
    last_lines = [c for c in nb.cells if c.cell_type == "code"
                  and re.search(r"\n(quiz|memory_round|drill|gauntlet)\s*$", "".join(c.source))]
    assert len(widgets) == len(last_lines) == 4, (len(widgets), len(last_lines))
    assert nb.cells[-1].outputs[0]["text"].strip() == ipywidgets.__version__  # the kernel's ipywidgets is ours
