"""FSDP2's lab figures as a table's rows and verdict keys (taught in chapter 10): what ``fsdp2.fsdp_lab`` measured,
arranged for the chapter's tables and charts -- bytes per rank against 16 N / world size, AllGather and
ReduceScatter calls against the unit structure, the bytes reshard_after_forward and a bf16 policy move, the
gradients accumulation holds, the clipped norms. The words around them are the chapter's.

    display(lk.course.table(par.fsdp2.memory_rows(lab), columns)); par.fsdp2.calls_verdict(lab)  # "agree"
"""
from __future__ import annotations

from .fsdp_counting import expected_calls, ring_bytes_per_rank

MEMORY_PARTS = ("params", "grads", "optimizer")


def memory_rows(lab: dict) -> list:
    """Per world size: the largest rank's bytes of params / grads / AdamW state and their total, rank 0's total,
    the fp32 formula's 16 N / world size, and the mixed-precision accounting's total (2 + 2 + 12 bytes per
    parameter: the same 16, split otherwise)."""
    rows = []
    for ws, m in sorted(lab["memory"].items()):
        big = max(m["ranks"], key=lambda r: r["total"])
        rows.append({"world_size": ws, **{k: big[k] for k in MEMORY_PARTS}, "total": big["total"],
                     "rank0_total": m["ranks"][0]["total"], "formula": m["formula_fp32"]["total"],
                     "mixed_params": m["formula_mixed"]["params"], "mixed_grads": m["formula_mixed"]["grads"],
                     "mixed_optimizer": m["formula_mixed"]["optimizer"], "uneven": m["uneven"]})
    return rows


def memory_verdict(lab: dict) -> str:
    """'formula' when every rank at every world size held exactly 16 N / world size bytes; 'uneven' when some
    world size cut a parameter's rows unevenly (FSDP2's chunks of ceil(rows / world size): the trailing ranks
    get fewer rows, or none, and only the mean over the ranks is the formula); 'differ' otherwise."""
    if any(m["uneven"] for m in lab["memory"].values()):
        return "uneven"
    exact = all(abs(r[k] - m["formula_fp32"][k]) < 0.5 for m in lab["memory"].values() for r in m["ranks"]
                for k in MEMORY_PARTS)
    return "formula" if exact else "differ"


def calls_rows(lab: dict) -> list:
    """Each counted collective setting against the unit structure (``expected_calls``): AllGather per step with
    reshard_after_forward True / False on the blocks (root at torch's default) and True on the root too;
    ReduceScatter per update syncing every micro-batch / only the last."""
    L, k = lab["n_blocks"], lab["accumulation"]
    acc = lab["accum"]
    return [
        {"collective": "AllGather", "per": "step", "setting": "reshard=True",
         "counted": lab["reshard"][True]["allgather"], "expected": expected_calls(L, True)["allgather"]},
        {"collective": "AllGather", "per": "step", "setting": "reshard=False",
         "counted": lab["reshard"][False]["allgather"], "expected": expected_calls(L, False)["allgather"]},
        {"collective": "AllGather", "per": "step", "setting": "root resharded too",
         "counted": lab["reshard_root"]["allgather"],
         "expected": expected_calls(L, True, root_reshard_after_forward=True)["allgather"]},
        {"collective": "ReduceScatter", "per": "update", "setting": f"sync all {k}",
         "counted": acc["sync_every"]["reducescatter"],
         "expected": expected_calls(L, micro_batches=k)["reducescatter"]},
        {"collective": "ReduceScatter", "per": "update", "setting": "sync last only",
         "counted": acc["no_sync"]["reducescatter"],
         "expected": expected_calls(L, micro_batches=k, sync_every_micro_batch=False)["reducescatter"]},
    ]


def calls_verdict(lab: dict) -> str:
    """'agree' when every counted collective matches the unit structure, else 'differ'."""
    return "agree" if all(r["counted"] == r["expected"] for r in calls_rows(lab)) else "differ"


def reshard_rows(lab: dict) -> list:
    """reshard_after_forward True / False on the blocks (root at torch's default) and True on the root too:
    AllGather calls per step (counted and expected), the gathered weight bytes still held when the forward
    ended and the most held during it, the bytes gathered per step and what one rank sends of them on a ring."""
    L, ws = lab["n_blocks"], lab["detail_world_size"]
    out = []
    for setting, r, expected in (
            ("blocks True, root default", lab["reshard"][True], expected_calls(L, True)),
            ("blocks False", lab["reshard"][False], expected_calls(L, False)),
            ("blocks and root True", lab["reshard_root"], expected_calls(L, True, root_reshard_after_forward=True))):
        out.append({"setting": setting, "allgather": r["allgather"], "expected": expected["allgather"],
                    "held_after_forward": r["held_after_forward"], "forward_peak": r["forward_peak"],
                    "gathered": r["allgather_bytes"], "sent": ring_bytes_per_rank(r["allgather_bytes"], ws),
                    "full_param_bytes": r["full_param_bytes"],
                    "through": ", ".join("dist." + n for n in r.get("allgather_functions", [])) or "none"})
    return out


def precision_rows(lab: dict) -> list:
    """fp32 against MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), the same step: the AllGather's and
    the ReduceScatter's buffer bytes and dtypes, and the model-state bytes rank 0 keeps."""
    t, p = lab["reshard"][True], lab["precision"]
    m = lab["memory"][lab["detail_world_size"]]["ranks"][0]
    return [{"policy": "fp32 (no policy)", "allgather_bytes": t["allgather_bytes"], "allgather_dtype": "float32",
             "reducescatter_bytes": t["reducescatter_bytes"], "reducescatter_dtype": "float32", "kept": m["total"],
             "shard_dtypes": "float32 / float32"},
            {"policy": "param bf16, reduce fp32", "allgather_bytes": p["allgather_bytes"],
             "allgather_dtype": ", ".join(p["allgather_dtypes"]), "reducescatter_bytes": p["reducescatter_bytes"],
             "reducescatter_dtype": ", ".join(p["reducescatter_dtypes"]),
             "kept": p["params"] + p["grads"] + p["optimizer"],
             "shard_dtypes": f"{', '.join(p['param_dtypes'])} / {', '.join(p['grad_dtypes'])}"}]


def accum_rows(lab: dict) -> list:
    """Gradient accumulation over ``accumulation`` micro-batches, syncing every micro-batch against only the last
    (set_requires_gradient_sync(False) before): ReduceScatter calls and buffer bytes per update, what one rank
    sends of them on a ring, the gradient bytes a rank holds between micro-batches, the AllGathers per update,
    and the final parameters' largest difference from one process on the whole batch."""
    a, ws = lab["accum"], lab["detail_world_size"]
    return [{"sync": name, "reducescatter": r["reducescatter"], "reduced": r["reducescatter_bytes"],
             "sent": ring_bytes_per_rank(r["reducescatter_bytes"], ws), "held_between": r["grad_bytes_between"],
             "allgather": r["allgather"], "vs_reference": r["max_param_diff_vs_reference"]}
            for name, r in (("every micro-batch", a["sync_every"]), ("last only", a["no_sync"]))]


def clip_figures(lab: dict) -> dict:
    """clip_grad_norm_ on the sharded model against one process on the whole batch: a row per update (``rows``:
    the two total norms and their relative difference), the largest relative difference, the parameters'
    largest difference after the clipped updates, and the max norm clipped to."""
    c = lab["clip"]
    rows = [{"update": i + 1, "sharded": a, "reference": b, "relative": abs(a - b) / b}
            for i, (a, b) in enumerate(zip(c["norms"], c["reference_norms"]))]
    return {"rows": rows, "worst_relative": max(r["relative"] for r in rows), "max_param_diff": c["max_param_diff"],
            "max_norm": lab["max_norm"], "updates": len(rows)}
