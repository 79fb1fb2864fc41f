"""Chapter 09's instruments return rows and verdict keys; the chapter writes the words (issue 47). These pin the
figures and the verdicts, never a sentence -- plus the FSDP2 code the chapter shows (``pb.shard``), checked in
one process of a gloo group of one, and the chapter's order: no answer stated above its exercise (issue 46.15)."""
import json
import math
import re
import types
from pathlib import Path

import pytest

import labkit as lk
from labkit.chapters import ch09_playbook as pb

MIB = 2**20
NB = Path(__file__).resolve().parent.parent / "notebooks" / "09_fixed_gpus_playbook.ipynb"


def _cells():
    return json.loads(NB.read_text(encoding="utf-8"))["cells"]


def _before(tag):
    cs = _cells()
    i = next(i for i, c in enumerate(cs) if tag in c["metadata"].get("tags", []))
    return ["".join(c["source"]) for c in cs[:i]]


def test_the_remedies_rows_agree_with_the_zero_arithmetic():
    rows = pb.remedies_rows({"7 B": 7e9}, 8, 80e9)
    for stage, key in ((0, "ddp"), (1, "zero1"), (2, "zero2"), (3, "zero3")):
        assert rows[0][key] == pb.zero_bytes_per_gpu(7e9, 8, stage)
    assert rows[0]["zero3+offload_params"] == 0 and "≈0 (CPU memory)" in rows._repr_markdown_()


def test_the_fsdp_rows_give_each_ranks_share():
    demo = {"ok": True, "ranks": [dict(param_bytes=50, grad_bytes=50, optimizer_bytes=100)],
            "replica": dict(param_bytes=100, grad_bytes=100, optimizer_bytes=200), "losses": [5.0, 4.9]}
    assert [r["share"] for r in pb.fsdp_rows(demo)] == [0.5, 0.5, 0.5]
    with pytest.raises(lk.ConfigError, match="single"):
        pb.loss_rows(demo, [5.0])


def _result(steps, losses, mb=4, accum=1):
    cfg = types.SimpleNamespace(steps=steps, micro_batch=mb, accum=accum)
    return types.SimpleNamespace(config=cfg, records=[dict(loss=v, update=i + 1) for i, v in enumerate(losses)])


def test_the_convergence_rows_read_their_runs():
    conv = {(4, 1e-3): _result(8, [3.0, 2.0]), (4, 3e-3): _result(8, [3.0, 1.8]),
            (16, 1e-3): _result(2, [3.0, 2.5], mb=16), (16, 3e-3): _result(2, [3.0, 2.2], mb=16)}
    rows = pb.convergence_rows(conv, (4, 16), (1e-3, 3e-3))
    assert [r["updates"] for r in rows] == [8, 2]
    assert rows[0]["lr 0.001"] == pytest.approx(2.5) and rows[1]["lr 0.003"] == pytest.approx(2.6)  # last three


def test_b_crit_grows_only_with_fitted_estimates_whose_intervals_are_apart():
    est = lambda b, lo, hi: dict(ok=True, verdict="fitted", b_crit=b, interval=(lo, hi))  # noqa: E731
    assert pb.grows_as_loss_falls([est(40, 30, 50), est(10, 5, 20)])
    assert not pb.grows_as_loss_falls([est(40, 15, 50), est(10, 5, 20)])
    assert not pb.grows_as_loss_falls([dict(est(40, 30, 50), verdict="not_falling"), est(10, 5, 20)])
    assert not pb.grows_as_loss_falls([dict(ok=False, verdict="unreached")])


def test_the_what_if_rows_label_every_number_predicted():
    cfgs = {"fp32": lk.Config(model="tiny", micro_batch=2, steps=3, threads=1)}
    cfgs["bf16"] = cfgs["fp32"].replace(precision="bf16")
    ms = pb.predicted_ms(cfgs, ("t4", "h100-sxm"))
    md = pb.predicted_table(ms, cfgs)._repr_markdown_()
    assert md.count("predicted ms/update") == 2 and "refused (no bf16 unit)" in md  # a T4 has no bf16 unit
    assert ms["bf16"]["t4"] is None and ms["fp32"]["h100-sxm"] > 0
    lb = pb.launch_bound(cfgs)
    assert 0 < lb["share"] <= 1 and lb["extra_ops"] > 0 and lb["bf16_s"] > 0


# ---- issue 46.15: an exercise comes before the cell that reveals its answer ----------------------------------

def test_the_zero_formulas_are_not_written_above_the_zero_exercise():
    """The table above ``my_zero_bytes`` said 2 + 2 + 12/G ... : the exercise's answer. It says what each stage
    shards; the bytes are the learner's to write."""
    above = "\n".join(_before("exercise-09-zero"))
    assert not re.search(r"12\s*\)?\s*/\s*G", above), re.findall(r".{30}12\s*\)?\s*/\s*G.{10}", above)


def test_the_pareto_front_is_not_named_above_the_budget_challenge():
    """The fastest point within the budget is always on the front: listing the front's configurations above the
    challenge names its answer among a few. Its size and chart come first; its names after the pick."""
    above = [s for s in _before("exercise-09-budget")]
    assert not any(re.search(r"front_note\(|for r in front\b", s) for s in above)
    after = "\n".join("".join(c["source"]) for c in _cells()
                      if "pick_run is None" in "".join(c["source"]) and "for r in front" in "".join(c["source"]))
    assert after, "the front's names are shown after the challenge"



def test_shard_is_fsdp2_with_a_precision_policy():
    """One process, a gloo group of one: every block and the root become FSDP units with the policy given.
    In a fresh Python: FSDP2 used in this (pytest's) process made every later DataLoader worker fork of it
    crash (segmentation fault inside os.fork), so it never runs here."""
    import subprocess
    import sys

    code = """
import math, torch, torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
import labkit as lk
from labkit.chapters import ch09_playbook as pb
from labkit.engine.model import GPT
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    model = pb.shard(GPT(lk.PRESETS["tiny"]))
    assert isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.blocks)
    x = torch.randint(0, 256, (2, lk.PRESETS["tiny"].seq_len))
    loss = model(x, x)
    loss.backward()
    assert math.isfinite(float(loss.detach()))
finally:
    dist.destroy_process_group()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
