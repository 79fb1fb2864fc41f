"""How many cores this process may use: its CPU affinity, and the CPU quota of its cgroup.

A container limited by a CFS quota (Kubernetes' ``cpu`` limit, KubeSpawner's ``cpu_limit``, Docker's ``--cpus``)
still sees every core of the node in its affinity: a learner limited to 2 CPUs on a 64-core node who starts 64
threads gets 2 cores' worth of time, sliced 32 ways, and so does every classmate on that node. The quota is read
from cgroup v2 (``cpu.max``: "max 100000" or "200000 100000") or v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``,
-1 for none), in this process's own cgroup and every one above it (the smallest limit wins).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_paths(proc_cgroup: str) -> dict:
    """{'v2': '/a/b', 'v1': '/a/b'}: this process's cgroup per hierarchy, from /proc/self/cgroup's lines."""
    out = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        num, controllers, path = parts
        if num == "0" and controllers == "":
            out["v2"] = path
        elif "cpu" in controllers.split(","):
            out["v1"] = path
    return out


def _upwards(mount: Path, path: str):
    """The cgroup's folder and each one above it, up to the mount (inside a container's cgroup namespace the
    own path is '/', and the mount is the container's own cgroup)."""
    parts = [p for p in path.strip("/").split("/") if p]
    for i in range(len(parts), -1, -1):
        yield mount.joinpath(*parts[:i])


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _v2_limit(folder: Path):
    text = _read(folder / "cpu.max")
    if not text:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return (quota / period, f"{folder / 'cpu.max'}: {text}") if quota > 0 and period > 0 else None


def _v1_limit(folder: Path):
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    try:
        quota, period = int(quota), int(period)
    except (TypeError, ValueError):
        return None
    if quota <= 0 or period <= 0:  # -1: no quota
        return None
    return quota / period, f"{folder / 'cpu.cfs_quota_us'}: {quota} per {period} µs"


def quota(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None):
    """(cores the quota allows, where it was read), or None when no quota limits this process."""
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup")) or ""
    own = _own_paths(proc_cgroup)
    limits = []
    if "v2" in own or (root / "cpu.max").exists():
        limits += [lim for f in _upwards(root, own.get("v2", "/")) if (lim := _v2_limit(f))]
    for mount in (root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"):
        if mount.is_dir():
            limits += [lim for f in _upwards(mount, own.get("v1", "/")) if (lim := _v1_limit(f))]
            break
    return min(limits) if limits else None


def affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def usable(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> tuple:
    """(cores, where the figure came from): the affinity's count, or the quota's (rounded up: 1.5 cores of time
    keep 2 threads busy part of the time) when that is smaller."""
    n = affinity()
    limit = quota(root, proc_cgroup)
    if limit is not None and math.ceil(limit[0]) < n:
        return max(1, math.ceil(limit[0])), f"the cgroup's CPU quota ({limit[1]}); {n} in the affinity"
    return n, "CPU affinity" + (f" (the cgroup's quota, {limit[1]}, allows more)" if limit else "")
