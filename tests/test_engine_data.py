"""labkit.engine.data, the corpus cache: a huge text is read only as far as it is kept; wrong-shaped
metadata, a folder in a cache file's place and an empty cached corpus are rebuilt; a cache folder that cannot be
written falls back to one that can, saying so in one line.
And its loader workers: one killed anywhere in an update ends the run with RunError, not PyTorch's
traceback."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import labkit as lk
from labkit.engine import ddp as ddp_mod
from labkit.engine import train as train_mod
from labkit.engine import data as data_mod
from labkit.base import paths as paths_mod
from labkit.engine.config import ConfigError

from conftest import ddp_alive_at, live_children

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("LABKIT_DATA_DIR", str(d))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the fallback must not touch the real ~/.cache
    monkeypatch.setattr(paths_mod.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    return d


@pytest.fixture
def text(tmp_path):
    p = tmp_path / "text.txt"
    p.write_text("hello labkit, " * 500)
    return p


# ---- (a) a huge corpus file ----------------------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and sparse files: Linux")
def test_a_10_gb_text_is_read_only_as_far_as_it_is_kept(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:  # sparse: 10 GB long, no disk used
        f.truncate(10 * 2**30)
    # a child capped at 2 GiB more address space than it holds after import: reading the file whole fails
    code = f"""
import resource
from pathlib import Path
from labkit.engine import data
vm = int([l for l in open('/proc/self/status') if l.startswith('VmSize')][0].split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 2 * 2**30, resource.RLIM_INFINITY))
blob = data._collect([Path({str(big)!r})])
print(len(blob))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) == data_mod.MAX_CORPUS_BYTES


def test_files_are_kept_in_order_up_to_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(data_mod, "MAX_CORPUS_BYTES", 10)
    a, b, c = (tmp_path / n for n in "abc")
    a.write_bytes(b"1234")
    b.write_bytes(b"56789XYZ")
    c.write_bytes(b"never")
    assert data_mod._collect([a, b, c]) == b"123456789X"


# ---- (b), (c) damaged caches are rebuilt ------------------------------------------------------------

@pytest.mark.parametrize("meta_text", ["[]", "null", "5", '"x"'])
def test_wrong_shaped_metadata_is_rebuilt(cache, text, meta_text):
    path = data_mod.corpus_path(text)
    good = data_mod.corpus_sha(path)
    path.with_suffix(".json").write_text(meta_text)
    assert data_mod.corpus_sha(data_mod.corpus_path(text)) == good


@pytest.mark.parametrize("which", [".bin", ".json"])
def test_a_folder_in_a_cache_files_place_is_rebuilt(cache, text, which):
    path = data_mod.corpus_path(text)
    good = data_mod.corpus_sha(path)
    spot = path.with_suffix(which)
    spot.unlink()
    spot.mkdir()
    (spot / "inside").write_text("x")
    again = data_mod.corpus_path(text)
    assert again == path and path.is_file() and data_mod.corpus_sha(again) == good


def test_an_empty_cached_corpus_with_matching_metadata_is_rebuilt(cache, text):
    path = data_mod.corpus_path(text)
    size = path.stat().st_size
    path.write_bytes(b"")
    path.with_suffix(".json").write_text(json.dumps({"bytes": 0, "sha256": hashlib.sha256(b"").hexdigest()}))
    assert data_mod.corpus_path(text).stat().st_size == size


# ---- (d) a cache folder that cannot be written --------------------------------------------------------

def test_an_unwritable_cache_folder_falls_back_and_says_so(tmp_path, monkeypatch, cache, text, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LABKIT_DATA_DIR", str(blocker / "sub"))  # mkdir fails: NotADirectoryError
    path = data_mod.corpus_path(text)
    assert path.is_file() and path.parent == tmp_path / "home" / ".cache" / "labkit"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write the corpus cache" in err[0] and str(blocker / "sub") in err[0], err
    assert data_mod.corpus_path(text) == path  # and the fallback's cache is used next time


def test_no_writable_folder_at_all_is_one_line(tmp_path, monkeypatch, cache, text):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LABKIT_DATA_DIR", str(blocker / "sub"))
    monkeypatch.setenv("HOME", str(blocker / "home"))
    monkeypatch.setattr(paths_mod.tempfile, "gettempdir", lambda: str(blocker / "tmp"))
    with pytest.raises(ConfigError) as e:
        data_mod.corpus_path(text)
    assert e.value.field == "LABKIT_DATA_DIR" and "\n" not in str(e.value)
    assert "NotADirectoryError" in str(e.value)


def test_an_intact_cache_in_a_read_only_place_is_still_used(cache, text, monkeypatch):
    path = data_mod.corpus_path(text)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(data_mod, "_write", refuse)
    assert data_mod.corpus_path(text) == path


# ---- a loader worker killed mid-update ---------------------------------------------------------------

def _kill_a_worker_and_wait():
    """SIGKILL one loader worker, then idle where we are: PyTorch's SIGCHLD handler raises here."""
    os.kill(live_children()[0].pid, signal.SIGKILL)
    time.sleep(5.0)


@pytest.fixture
def kill_in_backward(monkeypatch):
    """Kill during the 3rd update's backward pass, from inside DDP's comm hook."""
    real, calls = ddp_mod.counting_hook, []

    def hook(state, bucket):
        calls.append(1)
        if len(calls) == 3:
            _kill_a_worker_and_wait()
        return real(state, bucket)

    monkeypatch.setattr(ddp_mod, "counting_hook", hook)


@pytest.fixture
def kill_in_optimizer_step(monkeypatch):
    real, calls = train_mod.optimizer_step, []

    def step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            _kill_a_worker_and_wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(train_mod, "optimizer_step", step)


@pytest.mark.parametrize("where", ["kill_in_backward", "kill_in_optimizer_step"])
def test_a_worker_killed_mid_update_is_a_run_error(where, request, no_leftover_processes):
    request.getfixturevalue(where)
    t0 = time.monotonic()
    with pytest.raises(lk.RunError) as err:
        lk.run(lk.Config(model="tiny", micro_batch=2, steps=50, workers=2))
    assert time.monotonic() - t0 < 60
    msg = str(err.value)
    assert "DataLoader worker" in msg and "killed by signal" in msg, msg
    assert "\n" not in msg


def test_the_next_run_works_after_a_worker_died_in_backward(kill_in_backward, monkeypatch):
    with pytest.raises(lk.RunError):
        lk.run(lk.Config(model="tiny", micro_batch=2, steps=50, workers=2))
    monkeypatch.undo()
    assert lk.run(lk.Config(model="tiny", steps=2, workers=1)).summary["status"] == "completed"


def test_other_runtime_errors_are_not_blamed_on_the_loader(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the optimizer step")

    monkeypatch.setattr(train_mod, "optimizer_step", broken)
    with pytest.raises(RuntimeError, match="a bug in the optimizer step") as err:
        lk.run(lk.Config(model="tiny", steps=2))
    assert not isinstance(err.value, lk.RunError)


def test_no_ddp_module_outlives_its_group_after_an_error_mid_update(kill_in_backward, monkeypatch):
    """The error's traceback holds the frames it came through: micro_steps' ``net`` is the DDP module. Freed after
    the group is destroyed, the reducer's destructor can deadlock (chapter 11's demo did, in the ninth session's
    CI), so the frames let go of their locals before the teardown."""
    alive = ddp_alive_at(monkeypatch, ddp_mod, "destroy_group")
    with pytest.raises(lk.RunError):
        lk.run(lk.Config(model="tiny", micro_batch=2, steps=50, workers=2))
    assert alive == [0]
