"""labkit on a real JupyterHub (issue 49): the files of hub/ that the kit's "Running it on a JupyterHub" points to,
and .ci/hub, which runs a class with those very files -- a hub on 127.0.0.1, local users, nbgrader's exchange.

The real run (``test_a_class_on_a_real_jupyterhub``) creates system users and installs two environments from the
package registries: it runs in CI's hub leg (.ci/run sets ``LABKIT_HUB=1``) or by hand with that variable, as
root, with npm and the registries reachable. The other tests read the files and need nothing.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HUB = ROOT / "hub"
KIT = ROOT / "notebooks" / "README.md"
GRADING_TOOLS = {"nbgrader", "otter-grader", "playwright"}


def settings(source) -> dict:
    """{"Section.name": value} of a Jupyter config file's plain ``c.Section.name = <literal>`` lines (a path, or
    the file's text)."""
    out = {}
    for node in ast.parse(source.read_text() if isinstance(source, Path) else source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            target = ast.unparse(node.targets[0])
            if target.startswith("c."):
                try:
                    out[target[2:]] = ast.literal_eval(node.value)
                except ValueError:
                    out[target[2:]] = ast.unparse(node.value)
    return out


def requirements(path: Path) -> dict:
    """{package name: its line} of a requirements file, the files it reads with ``-r`` included."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r"):
            out.update(requirements(path.parent / line[2:].strip()))
        elif line:
            out[re.match(r"[A-Za-z0-9_.-]+", line).group(0).lower()] = line
    return out


def kit_section() -> str:
    text = KIT.read_text(encoding="utf-8")
    start = text.index("\n## Running it on a JupyterHub")
    return text[start:text.index("\n## ", start + 1)]


# ---- the files -------------------------------------------------------------------------------------------------

def test_the_hubs_nbgrader_settings_are_the_courses():
    from labkit.instructor import assignments

    course = settings(assignments.CONFIG)
    hub = settings(HUB / "nbgrader_config.py")
    for name in ("CourseDirectory.course_id", "Execute.timeout", "Execute.iopub_timeout"):
        assert hub[name] == course[name], name
    assert hub["Execute.timeout"] == 600 and hub["Execute.iopub_timeout"] == 60
    assert "Exchange.root" in hub


def test_the_single_user_server_reads_the_chapters_as_course_py_lab_does():
    from labkit.base import jupyter_contents

    got = settings(HUB / "jupyter_server_config.py")["ServerApp.contents_manager_class"]
    assert jupyter_contents.OPTION == f"--ServerApp.contents_manager_class={got}"
    assert got in (ROOT / "course.py").read_text()
    module, name = got.rsplit(".", 1)
    assert getattr(__import__(module, fromlist=[name]), name) is jupyter_contents.KernelLanguageContents
    cls = jupyter_contents.KernelLanguageContents  # named by the path the setting gives, as a module-level class
    assert f"{cls.__module__}.{cls.__qualname__}" == got


def test_each_role_installs_its_own_tools_and_the_hub_one_version():
    learner = requirements(HUB / "requirements-learner.txt")
    instructor = requirements(HUB / "requirements-instructor.txt")
    lab = requirements(ROOT / "requirements.txt")
    assert not GRADING_TOOLS & set(learner) and not GRADING_TOOLS & set(lab)
    assert {"nbgrader", "otter-grader"} <= set(instructor) and set(learner) <= set(instructor)
    assert set(lab) <= set(learner) and {"torch", "jupyterlab", "ipywidgets"} <= set(lab)
    hub = requirements(HUB / "requirements-hub.txt")
    assert re.fullmatch(r"jupyterhub==[\d.]+", hub["jupyterhub"]) and learner["jupyterhub"] == hub["jupyterhub"]
    proxy = json.loads((HUB / "package.json").read_text())["dependencies"]["configurable-http-proxy"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", proxy)  # an exact version: the one the hub leg ran
    assert set(requirements(ROOT / "requirements-test.txt")) >= {"nbgrader", "otter-grader", "pytest", "nbval"}


DOCKER_INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
                       "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def dockerfile_problems(text: str, context: Path) -> list:
    """A small lint of a Dockerfile: known instructions, a pinned base image, COPY sources that exist (the
    wheel's dist/ aside: it is built first), a non-root USER before an exec-form CMD."""
    lines, buf = [], ""
    for raw in text.splitlines():
        if not buf and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        buf += raw.rstrip("\\").strip() + " "
        if not raw.rstrip().endswith("\\"):
            lines.append(buf.strip())
            buf = ""
    problems = [f"an unfinished line: {buf}"] if buf else []
    keys = [ln.split()[0].upper() for ln in lines]
    problems += [f"unknown instruction {k}" for k in keys if k not in DOCKER_INSTRUCTIONS]
    if not keys or keys[0] not in ("FROM", "ARG"):
        problems.append("does not start with FROM")
    for ln in lines:
        key, rest = ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else ""
        if key == "FROM" and (":" not in rest or rest.split(":")[1].split()[0] == "latest"):
            problems.append(f"base image not pinned: {rest}")
        if key in ("COPY", "ADD"):
            for src in [s for s in rest.split() if not s.startswith("--")][:-1]:
                if not src.startswith("dist/") and not (context / src).exists():
                    problems.append(f"{key} {src}: no such file in the build context")
        if key == "CMD":
            try:
                json.loads(rest)
            except ValueError:
                problems.append("CMD is not in exec form")
    users = [ln.split()[1] for ln in lines if ln.upper().startswith("USER ")]
    if not users or users[-1] in ("root", "0") or keys.index("USER") > keys.index("CMD"):
        problems.append("no non-root USER before CMD")
    return problems


def test_the_single_user_dockerfile_lints_and_says_it_is_unbuilt_without_docker():
    text = (HUB / "Dockerfile").read_text()
    assert dockerfile_problems(text, ROOT) == []
    if shutil.which("docker") is None:
        assert "UNBUILT" in text
    for req in re.findall(r"COPY (\S*requirements\S*)", text):
        assert (ROOT / req).is_file()
    broken = dockerfile_problems("FROM python\nCOPY no/such/file /x\nUSER root\nCMD python -m x\n", ROOT)
    assert len(broken) == 4, broken  # the lint catches what it checks


def test_the_kit_points_at_every_file_the_hub_leg_uses():
    section = kit_section()
    for f in sorted(HUB.iterdir()):
        assert f"hub/{f.name}" in section, f.name
    assert ".ci/hub" in section and "tests/test_hub.py" in section


# ---- the real run ----------------------------------------------------------------------------------------------

@pytest.mark.skipif(os.environ.get("LABKIT_HUB") != "1",
                    reason="the real hub (users, two environments, a JupyterHub) runs in CI's hub leg or with LABKIT_HUB=1")
def test_a_class_on_a_real_jupyterhub(tmp_path):
    report_file = tmp_path / "report.json"
    # its progress lines go to the terminal as they come (CI's hub leg runs pytest with -s)
    done = subprocess.run([sys.executable, str(ROOT / ".ci" / "hub"), "--report", str(report_file)],
                          stderr=subprocess.PIPE, text=True, timeout=3600)
    report = json.loads(report_file.read_text())
    if done.returncode == 77:
        pytest.skip(f"hub: {report['skipped']}")
    assert done.returncode == 0, done.stderr[-5000:]
    scores = report["scores"]
    assert scores["lklearner1"]["exported"] == report["max"] > 0  # all right
    assert 0 < scores["lklearner2"]["exported"] < report["max"]  # some right
    assert scores["lklearner3"]["exported"] == 0  # none right
    assert all(s["exported"] == s["expected"] and s["feedback"] for s in scores.values())
    assert report["grading_tools"]["learner"] == [] and "nbgrader" in report["grading_tools"]["instructor"]
    assert report["memory"]["lklearner1"]["peak_mib"] > 0 and report["memory"]["lklearner1"]["kernel_mib"] > 0
    assert report["contents"]["served"] and report["contents"]["served"] != report["contents"]["on_disk"]
    clean = report["cleanup"]
    assert clean["leftover_processes"] == 0 and clean["users_left"] == [] and clean["work_removed"], clean
