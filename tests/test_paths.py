"""labkit.base.paths: atomic writes (write_atomic, write_json_atomic), read_json, the private per-user
folder and the cache folders, and the temporary files a killed write leaves behind (swept on next use).

File faults are made real where root's permissions would hide them: a 64 KiB tmpfs fills up, a tmpfs
remounted read-only refuses writes, a folder chowned to uid 65534 belongs to someone else."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.engine import data as data_mod
from labkit.engine import device as device_mod
from labkit.base import paths

from conftest import fill as _fill, mounted as _mounted, remount_ro as _remount_ro, temps as _temps


# ---- write_atomic / write_json_atomic / read_json ------------------------------------------------------

def test_write_atomic_full_disk_keeps_old_file_and_leaves_no_temp(tmp_path):
    with _mounted(tmp_path) as mnt:
        target = mnt / "history.json"
        paths.write_json_atomic(target, {"runs": [1]})
        _fill(mnt)
        with pytest.raises(OSError) as e:
            paths.write_atomic(target, "x" * 200_000)
        msg = str(e.value)
        assert "\n" not in msg and str(target) in msg and "No space left" in msg
        assert e.value.errno == 28  # ENOSPC kept for callers
        assert paths.read_json(target) == {"runs": [1]}  # the good file is whole
        assert _temps(mnt) == []


def test_write_atomic_read_only_place(tmp_path):
    with _mounted(tmp_path) as mnt:
        (mnt / "old.csv").write_text("a,b\n")
        _remount_ro(mnt)
        with pytest.raises(OSError) as e:
            paths.write_atomic(mnt / "old.csv", "c,d\n")
        assert "Read-only" in str(e.value) and "\n" not in str(e.value)
        assert (mnt / "old.csv").read_text() == "a,b\n"


@pytest.mark.parametrize("kind", ["dir", "dev", "symlink"])
def test_write_atomic_refuses_what_is_not_a_regular_file(tmp_path, kind):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    if kind == "dir":
        target = tmp_path / "out"
        target.mkdir()
    elif kind == "dev":
        target = Path("/dev/full")
    else:
        target = tmp_path / "link"
        target.symlink_to(victim)
    before = os.lstat(target)
    with pytest.raises(ValueError) as e:
        paths.write_atomic(target, "x")
    assert str(target) in str(e.value) and "\n" not in str(e.value)
    after = os.lstat(target)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode)  # the device node is still a device
    assert victim.read_text() == "precious"


def test_write_atomic_never_follows_a_planted_temp_name(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    monkeypatch.setattr(paths.secrets, "token_hex", lambda n: "abcd")
    planted = tmp_path / f"trace.json.{os.getpid()}-abcd.tmp"
    planted.symlink_to(victim)  # what another user would plant in a shared folder
    with pytest.raises(OSError):
        paths.write_atomic(tmp_path / "trace.json", "mine")
    assert victim.read_text() == "precious"


def test_write_atomic_replaces_a_regular_file_and_keeps_its_mode(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("old")
    p.chmod(0o640)
    paths.write_atomic(p, b"new")
    assert p.read_bytes() == b"new" and stat.S_IMODE(p.stat().st_mode) == 0o640
    assert _temps(tmp_path) == []


@pytest.mark.parametrize("content, why", [(b"{\"a\": ", "not valid JSON"), (b"[" * 100_000, "nested too deeply"),
                                          (b"\xff\xfe{}", "not UTF-8")])
def test_read_json_damaged_file_is_one_line(tmp_path, content, why):
    p = tmp_path / "h.json"
    p.write_bytes(content)
    with pytest.raises(ValueError) as e:
        paths.read_json(p, what="history")
    msg = str(e.value)
    assert msg.startswith(f"history {p} is damaged: ") and why in msg and "\n" not in msg


# ---- a private per-user folder, never a planted shared one ---------------------------------------

@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """tempfile.gettempdir() pointed at a fresh folder, so the private root can be planted."""
    monkeypatch.setattr(paths.tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path / f"labkit-{os.getuid()}"


def test_private_dir_is_private(temp_root):
    d = paths.private_dir("cache")
    assert d == temp_root / "cache"
    for p in (temp_root, d):
        st = os.lstat(p)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()


@pytest.mark.parametrize("plant", ["mode0777", "other_uid", "symlink", "child_symlink", "child_0777"])
def test_private_dir_refuses_a_planted_folder(temp_root, tmp_path, plant):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if plant == "mode0777":
        temp_root.mkdir()
        temp_root.chmod(0o777)
    elif plant == "other_uid":
        temp_root.mkdir(mode=0o700)
        os.chown(temp_root, 65534, 65534)  # nobody: we run as root, so ownership must be checked, not access
    elif plant == "symlink":
        temp_root.symlink_to(elsewhere)
    elif plant == "child_symlink":
        temp_root.mkdir(mode=0o700)
        (temp_root / "cache").symlink_to(elsewhere)
    else:
        temp_root.mkdir(mode=0o700)
        (temp_root / "cache").mkdir()
        (temp_root / "cache").chmod(0o777)
    with pytest.raises(OSError) as e:
        paths.private_dir("cache")
    assert "\n" not in str(e.value) and "labkit-" in str(e.value)
    assert list(elsewhere.iterdir()) == []


def test_cache_fallback_is_private_and_skips_a_planted_one(temp_root, tmp_path, monkeypatch):
    """With data/ and ~/.cache unwritable, the cache lands in the private folder; a planted one is refused."""
    monkeypatch.setattr(paths, "cache_dirs", lambda: [Path("/proc/no-such/labkit"), temp_root / "cache"])
    assert paths.cache_dir() == temp_root / "cache"
    assert stat.S_IMODE(os.lstat(temp_root).st_mode) == 0o700
    os.chmod(temp_root, 0o777)
    assert not paths.usable_dir(temp_root / "cache")


def test_cache_dirs_has_no_fixed_shared_name():
    assert not any(str(d).endswith("labkit-cache") for d in paths.cache_dirs())
    assert paths.cache_dirs()[-1] == paths.private_root() / "cache"


# ---- cache litter: temporary files of killed or failed writes ------------------------------------


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid  # reaped: no process has this pid now (reuse within the test is vanishingly unlikely)


def _age(path: Path, seconds: float = 3600) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t), follow_symlinks=False)


def test_peak_cache_on_a_full_disk_leaves_no_temp_file(tmp_path, monkeypatch):
    with _mounted(tmp_path) as mnt:
        monkeypatch.setenv("LABKIT_DATA_DIR", str(mnt))
        device_mod._write_cache("k", "fp32", {"flops": 1e9})  # a plausible peak: an absurd one is dropped on read
        good = (mnt / "peak_flops.json").read_bytes()
        _fill(mnt)
        for i in range(3):  # "every process on a full disk": each used to leave a 0-byte <pid>.tmp
            device_mod._write_cache("k" * 5000 + str(i), "fp32", {"flops": 2e9})
        assert _temps(mnt) == [] and (mnt / "peak_flops.json").read_bytes() == good
        assert device_mod._read_cache() == {"k": {"fp32": {"flops": 1e9}}}


def test_a_killed_cache_builds_temp_files_are_swept_when_the_folder_is_next_used(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    dead, alive = _dead_pid(), os.getppid()
    litter = [f"stdlib-cpython-3.12.3.tmp{dead}", f"stdlib-cpython-3.12.3.json.tmp{dead}",
              f"peak_flops.json.{dead}.tmp", f"user-0123.bin.{dead}-1a2b3c4d.tmp"]
    kept = [f"peak_flops.json.{alive}.tmp",           # a live process may still be writing it
            f"roofline_probe.json.{dead}-99aa00bb.tmp",  # too young: maybe another pid namespace's live write
            "notes.tmp", "history.json"]               # not labkit's temp names
    for name in litter + kept:
        (cache / name).write_bytes(b"")
        if name != kept[1]:
            _age(cache / name)
    monkeypatch.setenv("LABKIT_DATA_DIR", str(cache))
    monkeypatch.setattr(paths, "_SWEPT", set())
    assert paths.cache_dir() == cache
    assert sorted(p.name for p in cache.iterdir()) == sorted(kept)


def test_a_corpus_build_on_a_full_disk_falls_back_without_litter(tmp_path, monkeypatch, capsys):
    text = tmp_path / "text.txt"
    text.write_text("hello world, " * 20_000)  # 260 kB: more than the 64 kB tmpfs holds
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with _mounted(tmp_path) as mnt:
        monkeypatch.setenv("LABKIT_DATA_DIR", str(mnt))
        path = data_mod.corpus_path(text)
        assert path.parent == tmp_path / "home" / ".cache" / "labkit"
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "No space left" in err[0] and str(mnt) in err[0]
        assert list(mnt.iterdir()) == []


def test_a_build_killed_mid_write_leaves_litter_that_the_next_use_removes(tmp_path):
    """SIGKILL a process inside write_atomic (after its temp file exists): the next cache use sweeps it."""
    cache = tmp_path / "cache"
    cache.mkdir()
    code = ("import os, signal, sys\nfrom labkit.base import paths\n"
            "real = paths._write_all\n"
            "def die(fd, blob):\n    os.write(fd, blob[:10])\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            "paths._write_all = die\n"
            f"paths.write_atomic({str(cache / 'stdlib-x.bin')!r}, b'x' * 1000)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert r.returncode == -9
    left = _temps(cache)
    assert len(left) == 1 and left[0].startswith("stdlib-x.bin.")
    _age(cache / left[0])
    assert paths.sweep_stale_temps(cache) == left and _temps(cache) == []


def test_write_atomic_under_a_file_size_limit(tmp_path):
    """ulimit -f (RLIMIT_FSIZE), which root cannot bypass: EFBIG, old file kept, no temp file."""
    target = tmp_path / "rows.csv"
    target.write_text("old\n")
    code = ("import resource, sys\nfrom labkit.base import paths\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            f"try:\n    paths.write_atomic({str(target)!r}, 'x' * 100_000)\n"
            "except OSError as e:\n    print(e)\n    sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "File too large" in r.stdout and str(target) in r.stdout and len(r.stdout.strip().splitlines()) == 1
    assert target.read_text() == "old\n" and _temps(tmp_path) == []
