"""Where labkit is published (labkit/base/release.py): unpublished until the repository and the tag exist, a
fork's LABKIT_REPOSITORY / LABKIT_TAG counted as published, a malformed override refused in one line, and a
published upstream release pinned to a commit or a hashed wheel -- never the movable tag. Where the network
allows, `git ls-remote` checks the published repository has the tag."""
import os
import subprocess

import pytest

from labkit.base import release
from labkit.instructor import hosting

FORK = "https://github.com/someone/labkit-fork"
SHA = "0123456789abcdef" * 2 + "01234567"


def test_upstream_is_unpublished_until_the_release_exists():
    now = release.settings({})
    assert now == {"repository": release.UPSTREAM_REPOSITORY, "tag": "v" + release.VERSION, "published": False,
                   "source": "", "override": False, "problem": None}


def test_a_fork_points_every_link_at_itself_and_counts_as_published():
    got = release.settings({"LABKIT_REPOSITORY": FORK + "/", "LABKIT_TAG": "v0.1.0-fork"})
    assert got["published"] and got["override"] and got["problem"] is None
    assert (got["repository"], got["tag"], got["source"]) == (FORK, "v0.1.0-fork", f"git+{FORK}@v0.1.0-fork")
    pinned = release.settings({"LABKIT_REPOSITORY": FORK, "LABKIT_TAG": SHA})  # a commit pins the fork
    assert pinned["source"] == f"git+{FORK}@{SHA}"
    only_tag = release.settings({"LABKIT_TAG": "v0.1.1"})
    assert only_tag["published"] and only_tag["repository"] == release.UPSTREAM_REPOSITORY


@pytest.mark.parametrize("env, name", [
    ({"LABKIT_REPOSITORY": "git@github.com:someone/fork.git"}, "LABKIT_REPOSITORY"),
    ({"LABKIT_REPOSITORY": "https://gitlab.com/someone/fork"}, "LABKIT_REPOSITORY"),
    ({"LABKIT_REPOSITORY": FORK + "/../../evil"}, "LABKIT_REPOSITORY"),
    ({"LABKIT_REPOSITORY": "https://github.com/someone/.."}, "LABKIT_REPOSITORY"),
    ({"LABKIT_TAG": "--upload-pack=touch /tmp/x"}, "LABKIT_TAG"),
    ({"LABKIT_TAG": "v1 v2"}, "LABKIT_TAG"),
])
def test_a_malformed_override_is_not_used_and_says_why(env, name):
    got = release.settings(env)
    assert not got["override"] and not got["published"] and got["repository"] == release.UPSTREAM_REPOSITORY
    assert got["problem"].startswith(f"{name}=") and got["problem"].count("\n") == 0
    assert repr(env[name]) in got["problem"]


def test_hosting_writes_no_link_from_a_malformed_override(monkeypatch, capsys):
    monkeypatch.setattr(release, "OVERRIDE_PROBLEM", "LABKIT_TAG='-x': a tag or a commit")
    with pytest.raises(ValueError, match="LABKIT_TAG="):
        hosting.expected()
    assert hosting.main(["--write"]) == 2
    assert "LABKIT_TAG='-x'" in capsys.readouterr().err


def test_the_environment_is_read_when_labkit_is_imported(tmp_path):
    import sys

    code = "from labkit.base import release as r; print(r.PUBLISHED, r.REPOSITORY, r.TAG, r.SOURCE)"
    env = dict(os.environ, LABKIT_REPOSITORY=FORK, LABKIT_TAG=SHA)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["True", FORK, SHA, f"git+{FORK}@{SHA}"]


def test_a_published_upstream_release_installs_a_pin_not_the_tag(monkeypatch):
    monkeypatch.setattr(release, "UPSTREAM_PUBLISHED", True)
    assert "COMMIT=''" in release.pin_problem()  # published with no pin: refused by this test, by name
    monkeypatch.setattr(release, "COMMIT", SHA)
    assert release.pin_problem() is None
    got = release.settings({})
    assert got["published"] and got["source"] == f"git+{release.UPSTREAM_REPOSITORY}@{SHA}" and "@v" not in got["source"]
    monkeypatch.setattr(release, "WHEEL_URL", "https://example.org/labkit-0.1.0-py3-none-any.whl")
    assert "WHEEL_SHA256" in release.pin_problem()
    monkeypatch.setattr(release, "WHEEL_SHA256", "ab" * 32)
    assert release.pin_problem() is None
    assert release.settings({})["source"] == "labkit @ https://example.org/labkit-0.1.0-py3-none-any.whl#sha256=" + "ab" * 32


def test_the_release_as_committed_is_pinned_when_published():
    assert release.pin_problem() is None, release.pin_problem()


def _git_ls_remote(repository: str, ref: str):
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")  # a missing GitHub repository asks for a password: never wait
    return subprocess.run(["git", "ls-remote", "--", repository, ref], capture_output=True, text=True, timeout=60, env=env)


NO_NETWORK = ("could not resolve host", "name resolution", "network is unreachable", "failed to connect",
              "connection refused", "connection timed out", "operation timed out")


def test_the_published_repository_has_the_tag():
    if not release.PUBLISHED:
        pytest.skip(f"labkit is not published yet (release.PUBLISHED is False): no badge or install line points at "
                    f"{release.REPOSITORY}, so there is nothing to look up")
    try:
        out = _git_ls_remote(release.REPOSITORY, release.TAG)
    except subprocess.TimeoutExpired:
        pytest.skip(f"no network here: git ls-remote {release.REPOSITORY} did not answer in 60 s")
    said = (out.stderr + out.stdout).lower()
    if out.returncode and any(words in said for words in NO_NETWORK):
        pytest.skip(f"no network here: git ls-remote {release.REPOSITORY} said {out.stderr.strip()[:200]!r}")
    assert out.returncode == 0, f"git ls-remote {release.REPOSITORY}: {out.stderr.strip()}"
    if len(release.TAG) == 40 and all(c in "0123456789abcdef" for c in release.TAG):
        return  # a fork pinned to a commit: ls-remote lists refs, not commits; the address answered
    assert f"refs/tags/{release.TAG}" in out.stdout, f"{release.REPOSITORY} has no tag {release.TAG}"
