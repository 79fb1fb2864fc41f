"""The record and summary schema (labkit.base.schema) is what runs produce, and all their readers ask for."""
import ast
import threading
from pathlib import Path

import pytest

import labkit as lk
from labkit.tools import compare, plots
from labkit.base import schema

LABKIT = Path(lk.__file__).resolve().parent
# Modules that read records and summaries, and the names they give them.
READERS = ("tools/plots/live.py", "tools/plots/versus.py",
           "tools/plots/figure.py", "panel/parts.py", "panel/lab.py", "__main__.py", "tools/compare.py")
NAMES = {"s", "r", "rec", "record", "summary", "last"}
# Keys a reader may meet that no run writes: a label the caller puts into a summary (plots.run_label).
BY_THE_CALLER = {"label"}
KNOWN = set(schema.RECORD_KEYS) | set(schema.SUMMARY_KEYS) | set(schema.keys(schema.StoppedSummary))


@pytest.fixture(scope="module")
def tiny_run():
    return lk.run(lk.Config(model="tiny", steps=2, accum=2))


def test_a_run_produces_exactly_the_schema(tiny_run):
    for rec in tiny_run.records:
        assert set(rec) == set(schema.RECORD_KEYS)
    assert set(tiny_run.summary) == set(schema.SUMMARY_KEYS)
    s = tiny_run.summary
    assert s["tokens_per_update"] == s["tokens_per_step"] == tiny_run.config.tokens_per_update
    assert schema.tokens_per_update({"tokens_per_step": 5}) == 5  # a summary saved before the new name


def test_a_stopped_run_reports_the_stopped_schema():
    stop = threading.Event()
    r = lk.run(lk.Config(model="tiny", steps=50), on_step=lambda rec: stop.set(), stop=stop)
    assert set(r.summary) == set(schema.keys(schema.StoppedSummary)) and r.summary["status"] == "stopped"


def _keys_read(path: Path) -> set:
    """String keys a module reads from its records and summaries: s["key"], r.get("key"), x.summary["key"]."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        target, key = None, None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target, key = node.value, node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            target, key = node.func.value, node.args[0].value
        is_reader = ((isinstance(target, ast.Name) and target.id in NAMES)
                     or (isinstance(target, ast.Attribute) and target.attr == "summary"))
        if is_reader and isinstance(key, str):
            found.add(key)
    return found


@pytest.mark.parametrize("module", READERS)
def test_readers_ask_only_for_schema_keys(module):
    unknown = _keys_read(LABKIT / module) - KNOWN - BY_THE_CALLER
    assert not unknown, f"{module} reads keys no run produces: {sorted(unknown)}"


def test_key_lists_name_schema_keys():
    listed = ([k for k, _ in plots.RATIO_METRICS] + [k for k, _ in plots.MEMORY_PARTS] + list(compare.METRICS)
              + list(compare.EXACT_KEYS))
    assert set(listed) <= KNOWN, sorted(set(listed) - KNOWN)
