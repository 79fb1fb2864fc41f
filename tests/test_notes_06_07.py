"""The words chapters 06 and 07 show beside their measurements (issue 27): ``ddplab``'s, ``netmodel``'s and
``kernels.notes``' functions return a ``course.Note`` whose figures come from the result handed in, and refuse
what is not such a result. Fast: synthetic summaries, nothing is trained."""
from types import SimpleNamespace as NS

import pytest

import labkit as lk
import labkit.chapters.course as course
from labkit.chapters import ddplab, kernels, netmodel
from labkit.chapters.course import Note


def _summary(calls, nbytes, **kw):
    return dict(allreduce_calls_per_update=calls, allreduce_bytes_per_update=nbytes, grad_bytes=2**20, **kw)


SWEEP = {(sync, k): _summary(3 * (k if sync == "every_micro" else 1), 2**20 * (k if sync == "every_micro" else 1))
         for sync in ("no_sync", "every_micro") for k in (1, 2, 4, 8)}


def test_the_sync_sweep_table_and_the_bytes_come_from_the_sweep():
    table = ddplab.sync_sweep_note(SWEEP)
    assert isinstance(table, Note) and "| 8 | 3 | 1.00 | 24 | 8.00 |" in table and "**8×**" in table
    assert "| 4 | 1.00 | 4.00 |" in ddplab.bytes_note(SWEEP)
    assert len(ddplab.plot_sync_sweep(SWEEP).axes[0].lines) == 2
    with pytest.raises(lk.ConfigError, match="sweep"):
        ddplab.sync_sweep_note({"no_sync": 1})


def test_the_two_process_note_quotes_the_run():
    s = _summary(3, 3 * 2**20, world_size=2, steps=4, accum=4, n_buckets=3, replicas_identical=True,
                 first_loss=5.5, final_loss=4.25, step_time_s=0.5)
    text = ddplab.two_procs_note(s)
    assert "**3 AllReduce calls per update**" in text and "3.00 MiB" in text and "500 ms" in text
    with pytest.raises(lk.ConfigError, match="s"):
        ddplab.two_procs_note({"world_size": 2})


def test_the_exact_counts_name_both_arms_and_their_ratio():
    res = [NS(summary={"final_loss": 4.0})]
    cmp = NS(label_a="no_sync", label_b="every_micro", results_a=res, results_b=res)
    text = ddplab.exact_note((3, 12), (2**20, 4 * 2**20), cmp, 4)
    assert "`no_sync` **3**" in text and "`every_micro` **12**" in text and "**4×**" in text
    with pytest.raises(lk.ConfigError, match="calls"):
        ddplab.exact_note(3, (1, 2), cmp, 4)


def test_the_buffer_note_reads_the_rhythm_from_the_counts():
    modes = {"no_sync": dict(seen=3, per_update=1, broadcasts=3, synced_micro_steps=[[u, 0] for u in range(3)]),
             "every_micro": dict(seen=12, per_update=4, broadcasts=12,
                                 synced_micro_steps=[[u, k] for u in range(3) for k in range(4)]),
             "sync_off": dict(seen=0, per_update=0, broadcasts=0, synced_micro_steps=[])}
    bs = dict(modes=modes, accum=4, updates=3, flag="forward_sync_buffers", flag_default=True, buffers=["marker"],
              torch_version="2.x")
    text = ddplab.buffer_sync_note(bs, "tiny")
    assert "`B... | B... | B...`" in text and "rhythm of the gradient AllReduce" in text and "**no buffers**" in text
    with pytest.raises(lk.ConfigError, match="bs"):
        ddplab.buffer_sync_note({}, "tiny")


def test_the_model_table_has_a_row_per_link_and_k_and_says_where_comm_catches_up():
    table, rows = netmodel.model_table(0.05, 500e6, 20, "ASSUMED")
    assert isinstance(table, Note) and len(rows) == 3 * 3 * 3
    assert table.count("\n| ") == 1 + 9 and "ASSUMED" in table and "catches up with compute" in table
    seconds, source = netmodel.micro_batch_compute(1e12)
    assert seconds > 0 and source
    with pytest.raises(lk.ConfigError, match="flops_micro"):
        netmodel.micro_batch_compute(-1)


def _points(section=None):
    sections = {
        "kernels": [dict(id="kernels/optimizer", status="ok", summary=dict(device_name="H200", n_params=124e6,
                                                                        default="foreach", median_s={"fused": 0.002})),
                    dict(id="kernels/attention", status="ok", summary=dict(device_name="H200", rows=[
                        dict(seq_len=1024, backend="flash", time_s=0.001, peak_bytes=2**20),
                        dict(seq_len=1024, backend="math", error="no")])),
                    dict(id="kernels/tf32", status="ok", summary={n: dict(tflops=100.0, rel_error=3e-4)
                                                                  for n in ("fp32", "tf32", "bf16")})],
        "best": [dict(id="best/bf16-Bbig", status="ok", summary=dict(compile=False, tokens_per_s=1e5, mfu=0.4))],
        "precision": [dict(id="precision/bf16-compile", status="ok", records=[dict(step_time_s=30.0)],
                           summary=dict(compile=True, tokens_per_s=1.2e5, mfu=0.45))]}
    return sum(sections.values(), []) if section is None else sections.get(section, [])


def test_reference_lines_show_the_shipped_gpu_points_and_nothing_without_them(monkeypatch):
    monkeypatch.setattr(course, "reference_points", _points)
    assert "fused 2.00 ms" in kernels.reference_lines("optimizer")
    att = kernels.reference_lines("attention")
    assert "T=1024 flash: 1.00 ms" in att and "math" not in att
    assert "first update (with its compile) 30.0 s" in kernels.reference_lines("compile")
    assert "relative error 0.0003" in kernels.reference_lines("tf32")
    monkeypatch.setattr(course, "reference_points", lambda section=None: [])
    assert kernels.reference_lines("mfu") == "" and kernels.reference_profile() == (None, "")
    with pytest.raises(lk.ConfigError, match="topic"):
        kernels.reference_lines("nope")


def test_attention_words_name_the_fused_backend_that_ran():
    rows = [dict(seq_len=512, backend="math", kept_bytes=4 * 2**20, scores_bytes=2**20, peak_bytes=8 * 2**20),
            dict(seq_len=512, backend="flash", error="not built"),
            dict(seq_len=512, backend="efficient", kept_bytes=2**19, peak_bytes=2**20)]
    assert kernels.fused_backend(rows) == "efficient"
    text = kernels.attention_note(rows, "efficient")
    assert "flash: not available here" in text and "efficient kept **0.50 MiB**" in text
    with pytest.raises(lk.ConfigError, match="att"):
        kernels.fused_backend(rows[:2])


def test_the_fusion_and_skip_notes_say_what_happened():
    cmp = NS(sentence="**compiled** vs **eager**: no verdict.")
    fusion = dict(ok=True, kernels=1, cache="cached", eager_ops=["add", "gelu", "add"], tensor_mib=8.0,
                  compile_s=1.5, same_result=True, comparison=cmp)
    text = kernels.fusion_note(fusion)
    assert "**3 operations**" in text and "disk cache" in text and cmp.sentence in text
    assert kernels.fusion_note(dict(ok=False, reason="no compiler")) == "Skipped: no compiler"
    assert "CI mode" in kernels.compile_skip_note() and "no g++" in kernels.compile_skip_note("no g++")
