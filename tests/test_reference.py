"""Reference files: the schema of any shipped ``data/reference/*.json``, a CPU dry run of the suite
that produces them, the claims table, and the loader's behaviour when no file exists.

The dry run uses tiny sizes on the CPU and writes to a temporary directory only. Nothing here
asserts a speed.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from labkit.tools import reference

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import reference_suite as rs  # noqa: E402
import reference_table as rt  # noqa: E402

SHIPPED = sorted((ROOT / "data" / "reference").glob("*.json"))
STATUSES = {"ok", "oom", "error", "timeout"}


# ---- shipped files (none yet is fine: the chapters must work without them) ----------------------

@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_reference_file_is_valid(path):
    data = json.loads(path.read_text())
    assert reference.validate(data) == []
    pv = data["provenance"]
    assert not pv.get("dry_run"), "a dry run was committed as a reference measurement"
    assert pv.get("device_kind") in (None, "cuda")
    ids = [p["id"] for p in data["points"]]
    assert len(ids) == len(set(ids)), "duplicate point ids"
    for p in data["points"]:
        assert p["status"] in STATUSES
        assert p["section"] and p["command"]
        if p["status"] == "ok" and "tokens_per_s" in p["summary"]:
            assert p["summary"]["device"] == "cuda"
    assert "## The course's claims" in rt.render(data)


def test_reference_dir_loads_whatever_is_there():
    # every file that loads must validate; a directory with none gives empty lists, not errors
    for ref in reference.load_all():
        assert reference.validate(ref) == [], ref.get("file")


def test_no_reference_files_means_empty_answers(tmp_path):
    assert reference.load_all(tmp_path) == []
    assert reference.points(tmp_path) == []
    assert reference.match({"model": "base", "precision": "bf16"}, tmp_path) == []
    assert reference.load_all(tmp_path / "missing") == []


# ---- the plan ------------------------------------------------------------------------------------

def test_plan_ids_unique_and_configs_are_config_fields():
    import labkit as lk

    fields = set(lk.Config.__dataclass_fields__)
    for profile in (rs.GPU, rs.TINY):
        pts = rs.plan(profile)
        ids = [p.id for p in pts]
        assert len(ids) == len(set(ids))
        assert ids[-1] == "tests/gpu"  # the tests run last, with time held back for them
        for p in pts:
            assert set(p.config) <= fields, (p.id, set(p.config) - fields)


def test_recorded_command_reproduces_the_config():
    # the "command" of every run point must parse back to the same configuration
    import argparse

    from labkit.__main__ import _add_config_args

    ap = argparse.ArgumentParser()
    _add_config_args(ap)
    for p in rs.plan(rs.GPU):
        if p.kind != "run" or p.derive:
            continue
        ns = ap.parse_args(rs.cli_args(p.config))
        for k, v in p.config.items():
            assert getattr(ns, k) == v, (p.id, k)


def test_select_points():
    pts = rs.plan(rs.GPU)
    sel = lambda only="", skip="": [p.id for p in rs.select_points(pts, only, skip)]  # noqa: E731
    assert sel("precision/bf16") == ["precision/bf16"]  # an exact id is not a prefix
    assert len(sel("grid")) == 16 and len(sel("grid/bf16")) == 8
    assert "tests/gpu" not in sel(skip="tests")
    assert sel("loader,timing") == ["loader/w0", "loader/w2", "loader/w4", "loader/w8", "loader/w4-pin",
                                    "timing/sync"]


def test_sanitize_drops_non_finite_numbers():
    out = rs.sanitize({"a": float("inf"), "b": [float("nan"), 1.5], "c": (1, "x"), "d": Path("p")})
    assert out == {"a": None, "b": [None, 1.5], "c": [1, "x"], "d": "p"}
    json.dumps(out, allow_nan=False)


# ---- a CPU dry run of one point (the AllReduce-counting one: it exercises the most of a run) ---------

@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("reference")
    out, md = d / "dry.json", d / "dry.md"
    rc = rs.main(["--tiny", "--device", "cpu", "--only", "ddp/every_micro-K4",
                  "--out", str(out), "--md", str(md)])
    assert rc == 0
    return out, md


def test_dry_run_output_is_valid(dry_run):
    out, _ = dry_run
    data = json.loads(out.read_text())
    assert reference.validate(data) == []
    pv = data["provenance"]
    assert pv["dry_run"] is True and pv["profile"] == "tiny" and pv["finished"] is True
    for k in ("gpu", "torch_version", "date", "command", "git_commit", "corpus_sha", "source_sha"):
        assert pv[k]
    assert [p["id"] for p in data["points"]] == ["ddp/every_micro-K4"]
    for p in data["points"]:
        assert p["status"] == "ok", p.get("error")
        s = p["summary"]
        for k in ("tokens_per_s", "mfu", "hfu", "activation_bytes", "step_time_s", "corpus_sha", "torch_version"):
            assert s[k] is not None, k
        assert s["corpus_sha"] == pv["corpus_sha"]
        assert p["command"].startswith("PYTHONPATH=. python3 -m labkit run ")
        assert p["records"] and len(p["records"]) == s["steps"]
    em = data["points"][0]["summary"]
    assert em["accum"] == 4 and em["allreduce_calls_per_update"] == 4 * em["n_buckets"]


def test_dry_run_is_found_by_the_loader(dry_run):
    out, _ = dry_run
    d = out.parent
    assert [r["file"] for r in reference.load_all(d)] == ["dry.json"]
    hits = reference.match({"model": "tiny", "precision": "bf16", "accum": 4, "ddp_sync": "every_micro"}, d)
    assert [h["id"] for h in hits] == ["ddp/every_micro-K4"]
    assert reference.match({"model": "tiny", "accum": 1}, d) == []
    assert "torch" in reference.label(hits[0])


def test_table_from_dry_run(dry_run, tmp_path):
    out, md = dry_run
    text = md.read_text()
    assert "Dry run" in text and "## The course's claims" in text and "## Every point" in text
    assert "not measured" in text  # most points were not in this dry run
    assert rt.main([str(out), "--out", str(tmp_path / "t.md")]) == 0
    assert (tmp_path / "t.md").read_text() == rt.render(json.loads(out.read_text()), source="dry.json")


def test_dry_run_never_writes_into_data_reference(tmp_path):
    target = ROOT / "data" / "reference" / "should-not-exist.json"
    assert rs.main(["--tiny", "--only", "precision/fp32", "--out", str(target)]) == 2
    assert rs.main(["--tiny", "--only", "precision/fp32", "--out", "/tmp/x.json", "--md", str(target)]) == 2
    assert not target.exists()


def test_full_sizes_refuse_to_run_without_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert rs.main(["--only", "precision/fp32", "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def test_hard_cap_kills_a_hung_point_and_the_next_point_runs(tmp_path):
    # a point that ignores its soft cap: the driver must kill the worker and go on with a fresh one
    P = rs.Profile(**{**rs.TINY.__dict__, "grace_s": 1.0, "tests_reserve_s": 0.0, "device": "cpu"})
    pts = [rs.Point("selftest/hang", "selftest", "sleeps", kind="sleep", args={"seconds": 600}, cap_s=1.0),
           rs.Point("selftest/next", "selftest", "returns at once", kind="sleep", args={"seconds": 0}, cap_s=30.0)]
    out = tmp_path / "hang.json"
    suite = rs.Suite(pts, P, out, deadline_s=120, argv=["selftest"], log=sys.stderr)
    suite.ensure_worker()
    first = suite.worker.proc.pid
    doc = suite.run()
    st = {p["id"]: p["status"] for p in doc["points"]}
    assert st == {"selftest/hang": "timeout", "selftest/next": "ok"}
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)  # the hung worker is gone
    assert reference.validate(json.loads(out.read_text())) == []


# ---- the claims table's criteria on hand-made summaries (not measurements) --------------------------

def _doc(points):
    return {"schema": 1, "provenance": {"gpu": "synthetic (unit test)", "dry_run": True}, "points": points}


def _ok(pid, **summary):
    return {"id": pid, "section": pid.split("/")[0], "command": "-", "status": "ok", "summary": summary}


def _verdicts(doc):
    return {r["claim"]: r["verdict"] for r in rt.claims(doc)}


def test_table_verdicts_follow_the_stated_criteria():
    doc = _doc([
        _ok("precision/fp32", tokens_per_s=100.0, activation_bytes=1000, peak_mem_bytes=10),
        _ok("precision/bf16", tokens_per_s=250.0, activation_bytes=500, peak_mem_bytes=10, step_time_s=1.0),
        _ok("precision/fp16", tokens_per_s=400.0, activation_bytes=700, skipped_steps=1),
        _ok("accumulation/K4", peak_mem_bytes=10.5, allreduce_calls_per_update=14, n_buckets=14),
        _ok("ddp/every_micro-K4", allreduce_calls_per_update=56),
        _ok("checkpointing/full", activation_bytes=100, step_time_s=1.5),
    ])
    v = _verdicts(doc)
    assert v["BF16 autocast trains 1.5–3× faster than FP32 on tensor-core GPUs"] == "holds"
    assert v["FP16 autocast trains 1.5–3× faster than FP32 on tensor-core GPUs"].startswith("does not hold (above")
    assert v["BF16/FP16 hold about half the activation memory of FP32"] == "holds"
    assert v["Gradient accumulation: a K× larger batch at flat memory"] == "holds"
    assert v["DDP no_sync: K× fewer AllReduce calls per update than syncing every micro-batch"] == "holds"
    assert v["Activation checkpointing cuts activation memory several-fold"] == "holds"
    assert v["…for +20–35 % compute (HFU above MFU)"].startswith("does not hold (above")
    assert v["DataLoader workers stop the GPU waiting for data"] == "not measured"


def test_table_handles_failed_and_missing_points():
    doc = _doc([{"id": "memory_budget/none", "section": "memory_budget", "command": "-", "status": "error",
                 "error": "needs CUDA"},
                {"id": "precision/fp32", "section": "precision", "command": "-", "status": "timeout",
                 "summary": {"tokens_per_s": 1.0, "partial": True}}])
    text = rt.render(doc)
    assert "(partial)" in text
    assert all(r["verdict"].startswith("not measured") for r in rt.claims(doc))


# ---- the points of chapters 07 (kernels) and 08 (memory) -------------------------------------------------

CHAPTER_07_08 = ("kernels/tf32", "kernels/attention", "kernels/optimizer", "kernels/profile", "memory/step2",
                 "memory/allocator", "kernels/mfu-B1", "kernels/mfu-B4", "seqlen/T512", "seqlen/T2048",
                 "seqlen/T2048-math", "seqlen/T2048-math-recompute")


def test_plan_has_the_kernels_and_memory_points():
    ids = {p.id: p for p in rs.plan(rs.GPU)}
    assert set(CHAPTER_07_08) <= set(ids)
    for p in ids.values():
        assert p.kind in rs._KINDS or p.kind in ("overhead", "pytest"), p.id
    assert ids["seqlen/T2048-math-recompute"].config["checkpointing"] == "attention"
    assert {p.id for p in rs.select_points(rs.plan(rs.GPU), "kernels")} >= {"kernels/tf32", "kernels/mfu-B1"}


def test_dry_run_of_the_kernels_and_memory_points(tmp_path):
    out = tmp_path / "km.json"
    only = "kernels/tf32,kernels/attention,kernels/optimizer,kernels/profile,memory/step2,memory/allocator"
    assert rs.main(["--tiny", "--device", "cpu", "--only", only, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert reference.validate(data) == []
    pts = {p["id"]: p for p in data["points"]}
    for pid in ("kernels/attention", "kernels/optimizer", "kernels/profile", "memory/step2"):
        assert pts[pid]["status"] == "ok", pts[pid].get("error")
        assert pts[pid]["summary"]["config"] == pts[pid]["config"]  # kept apart from training runs
    assert {r["backend"] for r in pts["kernels/attention"]["summary"]["rows"]} == {"math", "flash"}
    assert set(pts["kernels/optimizer"]["summary"]["median_s"]) == {"for-loop", "foreach", "fused"}
    assert pts["kernels/profile"]["summary"]["top_op"].startswith("aten::")
    assert pts["memory/step2"]["summary"]["peaks"]["update 2"] > pts["memory/step2"]["summary"]["peaks"]["update 1"]
    # CUDA-only measurements are errors on a CPU, never numbers
    for pid in ("kernels/tf32", "memory/allocator-fixed", "memory/allocator-expandable"):
        assert pts[pid]["status"] == "error" and ("CUDA" in pts[pid]["error"] or "tensor cores" in pts[pid]["error"])
    assert reference.match({"model": "tiny"}, tmp_path) == []  # none of them passes for a run
