"""base/runtime.py: the cores a process may use under a cgroup CPU quota, read from fake cgroup folders."""
from __future__ import annotations

import pytest

from labkit.base import runtime
from labkit.engine import device


def _v2(tmp_path, own="/", **files):
    for rel, text in files.items():
        f = tmp_path / rel.replace("__", "/") / "cpu.max" if rel != "root" else tmp_path / "cpu.max"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path, f"0::{own}\n"


def _v1(tmp_path, quota, period=100000, own="/"):
    folder = tmp_path / "cpu,cpuacct" / own.strip("/")
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (folder / "cpu.cfs_period_us").write_text(f"{period}\n")
    return tmp_path, f"4:cpu,cpuacct:{own}\n1:name=systemd:/\n"


@pytest.fixture
def many_cores(monkeypatch):
    monkeypatch.setattr(runtime, "affinity", lambda: 64)


def test_a_v2_quota_of_two_cpus_on_a_64_core_node_gives_two(tmp_path, many_cores):
    root, own = _v2(tmp_path, root="200000 100000")
    n, source = runtime.usable(root, own)
    assert n == 2 and "cpu.max" in source and "64 in the affinity" in source


def test_the_smallest_limit_above_the_process_wins(tmp_path, many_cores):
    root, own = _v2(tmp_path, own="/kubepods/pod1", root="max 100000", kubepods="400000 100000",
                    kubepods__pod1="150000 100000")
    assert runtime.usable(root, own)[0] == 2  # 1.5 cores of time: two threads, rounded up


def test_a_v1_quota_is_read_too(tmp_path, many_cores):
    root, own = _v1(tmp_path, 300000, own="/docker/abc")
    n, source = runtime.usable(root, own)
    assert n == 3 and "cfs_quota_us" in source


def test_a_v1_quota_is_named_by_the_numbers_read(tmp_path):
    root, own = _v1(tmp_path, "0150000")  # as read: the whole number, not the file's spelling of it
    cores, where = runtime.quota(root, own)
    assert cores == 1.5 and where.endswith("cpu.cfs_quota_us: 150000 per 100000 µs")


@pytest.mark.parametrize("text", ["max 100000", "", "garbage", "0 100000", "-5 100000"])
def test_no_quota_or_an_unreadable_one_leaves_the_affinity(tmp_path, many_cores, text):
    root, own = _v2(tmp_path, root=text)
    assert runtime.usable(root, own) == (64, "CPU affinity")


def test_v1_minus_one_is_no_quota_and_a_large_quota_leaves_the_affinity(tmp_path, many_cores):
    assert runtime.usable(*_v1(tmp_path / "a", -1)) == (64, "CPU affinity")
    n, source = runtime.usable(*_v1(tmp_path / "b", 12800000))
    assert n == 64 and "allows more" in source


def test_a_fraction_of_a_core_still_gives_one_thread(tmp_path, many_cores):
    assert runtime.usable(*_v2(tmp_path, root="50000 100000"))[0] == 1


def test_the_engine_and_labkit_env_use_it(monkeypatch):
    monkeypatch.setattr(runtime, "usable", lambda *a, **k: (3, "the cgroup's CPU quota (test)"))
    assert device.cores() == 3
