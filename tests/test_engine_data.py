"""labkit.engine.data, the corpus cache: a huge text is read only as far as it is kept; wrong-shaped
metadata, a folder in a cache file's place and an empty cached corpus are rebuilt; a cache folder that cannot be
written falls back to one that can, saying so in one line."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.engine import data as data_mod
from labkit.base import paths as paths_mod
from labkit.engine.config import ConfigError

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
