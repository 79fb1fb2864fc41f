"""Issue 25 (hardening, third round), the files/CLI part, and the comparison's wording (#23 item 4).

File faults are made real where root's permissions would hide them: a 64 KiB tmpfs fills up, a tmpfs
remounted read-only refuses writes, a folder chowned to uid 65534 belongs to someone else."""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import labkit as lk
from labkit import __main__ as cli
from labkit.engine import data as data_mod
from labkit.engine import device as device_mod
from labkit.chapters import ch06_ddp as nm
from labkit.whatif import roofline as rl
from labkit.base import paths
from labkit.tools.compare import Comparison, sentence, speed_jump, verdict


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import faults as file_faults  # noqa: E402 -- benchmarks/faults.py makes the same faults real: one tmpfs, one fill


@contextlib.contextmanager
def _mounted(tmp_path):
    """A 64 KiB tmpfs (root only); skipped with a reason where mounting is not allowed."""
    try:
        with file_faults.tmpfs() as mnt:
            yield mnt
    except file_faults.Skipped as why:
        pytest.skip(f"{why}: the fault cannot be made real here")


_fill = file_faults.fill


def _remount_ro(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)


def _temps(folder: Path) -> list:
    return [p.name for p in folder.iterdir() if paths.temp_owner(p.name) is not None]


# ---- contract 1: paths.write_atomic / write_json_atomic / read_json / private_dir -------------------

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


# ---- #25 item 2: a private per-user folder, never a planted shared one ------------------------------

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


# ---- #23 item 4 / contract 4: a resolved difference below the threshold is not "no difference" ------


def _cmp(ratio, low, high, n=10, **kw):
    c = Comparison(metric="tokens_per_s", ratio=ratio, low=low, high=high, verdict="same", better=None,
                   samples_a=[1.0] * n, samples_b=[ratio] * n, busy=False, sentence="", **kw)
    c.sentence = sentence(c)
    return c


def test_verdict_interval_1_02_to_1_04_reads_a_small_difference():
    text = _cmp(1.03, 1.02, 1.04).sentence
    assert "a difference of about 3 %, below the 5 % threshold this course counts as an effect" in text
    assert "no difference" not in text.lower()
    assert _cmp(1.03, 1.02, 1.04).resolved


def test_verdict_from_samples_three_percent_apart():
    rng = random.Random(0)
    a = [100 * (1 + rng.uniform(-0.002, 0.002)) for _ in range(10)]
    b = [103 * (1 + rng.uniform(-0.002, 0.002)) for _ in range(10)]
    c = verdict(a, b)
    assert c.verdict == "same" and c.better is None and c.low > 1  # no direction claimed, but resolved
    assert "a difference of about 3 %, below the 5 % threshold this course counts as an effect" in c.sentence
    slower = verdict(b, a)
    assert "a difference of about 3 %" in slower.sentence and "gave fewer tokens" in slower.sentence


def test_verdict_straddling_one_keeps_no_difference_measurable():
    text = _cmp(1.01, 0.97, 1.05).sentence
    assert "no difference measurable" in text and "a difference of about" not in text
    assert "about 0.4 %" in _cmp(1.004, 1.001, 1.007).sentence  # a resolved sub-1 % difference is not "0 %"


# ---- contract 3 / #24 item 12: speed_jump ---------------------------------------------------------------

def _steps(levels, noise=0.05, seed=0):
    """Synthetic per-update step times: [(seconds, how many updates), ...] with multiplicative noise."""
    rng = random.Random(seed)
    return [s * (1 + rng.uniform(-noise, noise)) for s, k in levels for _ in range(k)]


def test_speed_jump_finds_a_tenfold_fall_at_update_15():
    j = speed_jump(_steps([(1.0, 15), (0.1, 15)]))
    assert j["at"] == 15 and j["ratio"] == pytest.approx(0.1, rel=0.1)
    assert j["before_s"] == pytest.approx(1.0, rel=0.06) and j["after_s"] == pytest.approx(0.1, rel=0.06)


def test_speed_jump_finds_a_rise_and_ignores_noise_spikes_and_drift():
    assert speed_jump(_steps([(0.2, 8), (0.5, 12)]))["at"] == 8
    assert speed_jump(_steps([(1.0, 30)], noise=0.3)) is None       # noisy but level
    spike = _steps([(1.0, 20)])
    spike[7] = 10.0
    assert speed_jump(spike) is None                               # one slow update is not a new level
    assert speed_jump([1.0 + 0.01 * i for i in range(30)]) is None  # a slow 30 % drift is not a jump
    assert speed_jump([1.0, 1.0, 0.1, 0.1]) is None                 # too short to tell
    with pytest.raises(lk.ConfigError):
        speed_jump([1.0, float("nan"), 1.0, 1.0, 1.0, 1.0])


def _jumping_runner(clock, order, jump_in):
    """Fake runs of ``tokens_per_s`` 100/100 whose per-update records jump in the runs listed in jump_in."""
    def run_fn(cfg):
        arm = "b" if cfg.accum == 2 else "a"
        order.append(arm)
        clock.t += 1.0
        levels = [(0.5, 10), (0.05, 10)] if len(order) in jump_in else [(0.5, 20)]
        recs = [{"step_time_s": s} for s in _steps(levels, seed=len(order))]
        return lk.Result(cfg.replace(warmup=1), {"tokens_per_s": 100.0 + len(order) % 2, "device": "cpu"}, recs)
    return run_fn


from test_honest_numbers import clock  # noqa: E402,F401 -- the faked clock (a fixture) compare_configs runs on


def test_compare_configs_flags_a_run_whose_speed_jumped(clock):
    order = []
    a = lk.Config(model="tiny", steps=2)
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=12, progress=False,
                           run_fn=_jumping_runner(clock, order, jump_in={6}))  # run 6 = b's 2nd kept run
    assert [(j["arm"], j["sample"], j["at"]) for j in c.jumps] == [("b", 1, 10)] and c.jumps[0]["ratio"] < 0.2
    assert "changed speed mid-run" in c.sentence and "run 2" in c.sentence and "fell" in c.sentence
    assert "at update 11" in c.sentence  # records[10] is the run's 11th update
    calm = lk.compare_configs(a, a.replace(accum=2), budget_s=12, progress=False,
                              run_fn=_jumping_runner(clock, [], jump_in=set()))
    assert calm.jumps == [] and "mid-run" not in calm.sentence


# ---- #25 item 8: compare_configs validates every argument before the first run -------------------------

def _never(cfg):
    raise AssertionError("a run started before the arguments were checked")


@pytest.mark.parametrize("kw, field", [
    (dict(budget_s=float("nan")), "budget_s"), (dict(budget_s=0), "budget_s"), (dict(budget_s=-5), "budget_s"),
    (dict(budget_s="abc"), "budget_s"), (dict(budget_s=None), "budget_s"), (dict(budget_s=float("inf")), "budget_s"),
    (dict(budget_s=True), "budget_s"),
    (dict(min_repeats=0), "min_repeats"), (dict(min_repeats=1), "min_repeats"), (dict(min_repeats=2.5), "min_repeats"),
    (dict(max_repeats=0), "max_repeats"), (dict(min_repeats=8, max_repeats=5), "max_repeats"),
    (dict(warmup_runs=50), "warmup_runs"), (dict(warmup_runs=-1), "warmup_runs"),
    (dict(threshold=-1), "threshold"), (dict(threshold=float("nan")), "threshold"), (dict(threshold="5%"), "threshold"),
    (dict(threshold=1.5), "threshold"), (dict(metric="speed"), "metric"), (dict(label_a=3), "label_a"),
    (dict(progress="yes"), "progress"), (dict(run_fn="run"), "run_fn"),
])
def test_compare_configs_refuses_bad_arguments_before_any_run(kw, field):
    a = lk.Config(model="tiny", steps=2)
    kw.setdefault("run_fn", _never)
    with pytest.raises(lk.ConfigError) as e:
        lk.compare_configs(a, a.replace(accum=2), **kw)
    assert e.value.field == field and "\n" not in str(e.value) and "is not allowed" in str(e.value)


def test_compare_configs_warm_up_is_bounded_by_the_budget(clock):
    order = []
    a = lk.Config(model="tiny", steps=2)
    c = lk.compare_configs(a, a.replace(accum=2), budget_s=1, warmup_runs=10, progress=False,
                           run_fn=_jumping_runner(clock, order, jump_in=set()))
    # no warm-up fits, so none is run: one kept run per arm (tests/test_compare_early.py: the budget holds)
    assert len(order) == 2 and len(c.samples_a) == 1


# ---- #25 item 4: cache litter ------------------------------------------------------------------------


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


# ---- #25 items 5-7: sweep ----------------------------------------------------------------------------


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


# ---- #25 item 10: torchrun_command ---------------------------------------------------------------------


def _parse_back(cmd: str, monkeypatch) -> "lk.Config":
    words = shlex.split(cmd)
    assert words[0] == "torchrun" and words[words.index("-m") + 1:words.index("-m") + 3] == ["labkit", "run"]
    ns = cli.parser().parse_args(words[words.index("-m") + 2:])
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # what torchrun sets in every rank
    monkeypatch.setenv("WORLD_SIZE", str(int(words[1].split("=")[1]) if "--nnodes" not in cmd else 16))
    return cli.config_from_args(ns)


@pytest.mark.parametrize("cfg", [
    lk.Config(),
    lk.Config(model="base", precision="bf16", accum=4, micro_batch=16),
    lk.Config(model="tiny", n_layer=3, d_model=96, n_head=4, lr=1.234567e-4, seed=7, optimizer="sgd",
              attention="math", loss_scaling="off", compile=True, corpus="/data/my text; rm -rf x",
              grad_clip=None, pin_memory=True, init_scale=1024.0, checkpointing="full", checkpoint_every=2,
              dropout=0.1, on_nonfinite="skip", threads=3, memory_budget_gb=12.5, workers=2, data_cost_ms=0.3),
])
def test_torchrun_command_parses_back_to_the_same_config(cfg, monkeypatch):
    cmd = nm.torchrun_command(cfg, nproc_per_node=8)
    assert _parse_back(cmd, monkeypatch) == cfg.replace(world_size=8)


def test_torchrun_command_quotes_an_endpoint(monkeypatch):
    cmd = nm.torchrun_command(lk.Config(model="tiny"), nproc_per_node=8, nnodes=2, endpoint="h;touch /tmp/pwn")
    assert "'--rdzv-endpoint=h;touch /tmp/pwn'" in cmd
    assert "--rdzv-endpoint=h;touch /tmp/pwn" in shlex.split(cmd)  # one argument, not a second command
    assert _parse_back(cmd, monkeypatch) == lk.Config(model="tiny", world_size=16)
    for bad in (dict(nproc_per_node=0), dict(nnodes=-1), dict(endpoint=""), dict(nproc_per_node=True)):
        with pytest.raises(lk.ConfigError):
            nm.torchrun_command(lk.Config(), **bad)


# ---- #25 item 11 (this part): the slow-start hint; netmodel and ddplab refuse impossible numbers --------

def test_no_progress_from_any_rank_gets_the_main_guard_hint(monkeypatch):
    import types

    from labkit.engine import launch as launch_mod

    script = types.ModuleType("__main__")
    script.__file__ = "/home/me/train.py"
    monkeypatch.setitem(sys.modules, "__main__", script)
    t = time.monotonic() - launch_mod.TIMEOUT.total_seconds() - 20
    w = launch_mod._Watch(procs=[], out_q=None, stop=None, started=t, last_news=t)
    msg = launch_mod._silence(w)
    assert msg.startswith("no progress from any rank for 70 s (none had started training)")
    assert 'if __name__ == "__main__":' in msg and "top-level" in msg and "printed above" not in msg
    w.last_news = t + 1  # training had begun: a hang, not a script re-running its top level
    assert 'if __name__' not in launch_mod._silence(w)


@pytest.mark.parametrize("call, field", [
    (lambda: rl.ring_allreduce_s(1e9, -4, 50e9), "n"), (lambda: rl.ring_allreduce_s(1e9, 0, 50e9), "n"),
    (lambda: rl.ring_allreduce_s(1e9, 2.5, 50e9), "n"), (lambda: rl.ring_allreduce_s(-1, 8, 50e9), "nbytes"),
    (lambda: rl.ring_allreduce_s(float("nan"), 8, 50e9), "nbytes"),
    (lambda: rl.ring_allreduce_s(1e9, 8, 50e9, -1e-6), "latency"), (lambda: rl.ring_bytes_sent(1e9, -2), "n"),
    (lambda: rl.allreduce_calls(0, 1), "n_buckets"), (lambda: rl.allreduce_calls(1, -1), "accum"),
    (lambda: rl.update_time(-0.1, 1e9, 8, rl.LINKS["nvlink"]), "compute_micro_s"),
    (lambda: rl.update_time(0.1, 1e9, 8, "nvlink"), "link"),
    (lambda: rl.update_time(0.1, 1e9, 8, rl.LINKS["nvlink"], overlap=float("nan")), "overlap"),
    (lambda: rl.crossover(0.1, 1e9, rl.LINKS["nvlink"], max_n=0), "max_n"),
    (lambda: rl.crossover(0.1, -1e9, rl.LINKS["nvlink"]), "nbytes"),
    (lambda: rl.sweep(0.1, 1e9, ns=()), "ns"),
    (lambda: rl.flops_compute_s(1e12, 1e15, float("nan")), "mfu"),
    (lambda: nm.plot_data_parallel(n=0), "n"), (lambda: nm.plot_model([]), "rows"),
    (lambda: nm.bucket_timeline(lk.Config(model="tiny"), updates=0), "updates"),
])
def test_netmodel_refuses_impossible_numbers(call, field):
    with pytest.raises(lk.ConfigError) as e:
        call()
    assert e.value.field == field and "\n" not in str(e.value)


@pytest.mark.parametrize("call, field", [
    (lambda d: d.buffer_sync_counts(accum=True), "accum"), (lambda d: d.buffer_sync_counts(world_size=9), "world_size"),
    (lambda d: d.buffer_sync_counts(timeout_s=float("nan")), "timeout_s"),
    (lambda d: d.buffer_sync_counts(seed=-1), "seed"),
    (lambda d: d.gpt_buffers("huge"), "model"), (lambda d: d.pattern({}, "no_sync"), "result"),
    (lambda d: d.pattern({"modes": {}, "accum": 1, "updates": 1}, "sometimes"), "mode"),
])
def test_ddplab_refuses_impossible_arguments(call, field, no_leftover_processes):
    from labkit.chapters import ch06_ddp as ddplab

    with pytest.raises(lk.ConfigError) as e:
        call(ddplab)
    assert e.value.field == field


def test_a_peak_probed_under_load_is_not_cached(monkeypatch, tmp_path):
    """#24 item 2: the first peak probe on a busy machine was cached for good, and every later MFU and
    what-if prediction read it; now such a probe serves its process only, and its source says why."""
    from labkit.engine import device
    monkeypatch.setattr(device, "_MEASURED", {})
    written = []
    monkeypatch.setattr(device, "_write_cache", lambda *a: written.append(a))
    monkeypatch.setattr(device, "_read_cache", lambda: {})
    monkeypatch.setattr(device, "probe_matmul", lambda *a, **k: {"flops": 1e9, "n": 64})
    caps = device.capabilities("cpu")
    monkeypatch.setattr(device, "contended", lambda reading, threads: True)
    flops, entry = device.measured_peak(caps, "fp32")
    assert flops == 1e9 and entry["under_load"] and written == []
    assert "not cached" in device._measured_words("fp32", entry, 1)
    monkeypatch.setattr(device, "_MEASURED", {})
    monkeypatch.setattr(device, "contended", lambda reading, threads: False)
    flops, entry = device.measured_peak(caps, "fp32")
    assert len(written) == 1 and "under_load" not in entry


def test_contended_counts_the_cores_a_probe_needed():
    from labkit.engine import device
    n = device.cores()
    assert device.contended({"other_cores": n + 1.0, "steal_frac": 0.0}, 1)
    assert not device.contended({"other_cores": 0.0, "steal_frac": 0.0}, 1)
    assert device.contended({"other_cores": 0.0, "steal_frac": 0.5}, 1)


# ---- chapter 09 in Chromium: compare_configs' progress line stays on one line, in proper plurals -----------

def test_compare_progress_line_is_short_and_says_pairs_in_plurals(clock, monkeypatch):
    from labkit.tools import compare as compare_mod
    from labkit.base.progress import Progress

    bars = []

    class Recording(Progress):
        def __init__(self, total, label, **kw):
            super().__init__(total, label, delay=math.inf)  # silent: the test reads the lines it would draw
            self.lines = []
            bars.append(self)

        def update(self, done, note=""):
            super().update(done, note)
            self.lines.append(self.text())

    monkeypatch.setattr(compare_mod, "Progress", Recording)
    a = lk.Config(model="tiny", steps=2)
    lk.compare_configs(a, a.replace(accum=2), budget_s=30, min_repeats=4, label_a="baseline (fp32 mb=8 K=1)",
                       label_b="the grid's best that fits", run_fn=_jumping_runner(clock, [], jump_in=set()))
    lines = bars[0].lines
    assert any("· 1 pair kept," in s for s in lines) and any("· 2 pairs kept," in s for s in lines)
    assert all("(s)" not in s and len(s) <= 80 for s in lines), max(lines, key=len)
