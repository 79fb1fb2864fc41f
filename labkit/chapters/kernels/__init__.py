"""Why MFU is low when nothing waits: the tools of chapter 07 (kernels, shapes, torch.compile, optimizers),
taught in chapter 07, one module per topic:

    common         where files go, the benchmarks' thread count, the interleaved timer, the GPU reference lines
    profiles       one profiled training step and its table (``profile_step``, ``ProfileTable``)
    mfu            MFU against a knob (``mfu_sweep``) and what its per-token split says
    matmuls        the matmul's shape (a padded vocabulary) and precision (TF32)
    torch_compile  what fusion removes; ``compile=True`` with compile time, cache and graph breaks kept apart
    optimizers     fused, foreach and for-loop AdamW
    attention      SDPA backends: time and bytes kept for backward
    charts         the chapter's figures
    notes          the words the chapter shows beside each measurement (a Note per result)

    table = labkit.kernels.profile_step(config, trace_path="step.json")  # one profiled training step
    table.top_op(), table.share("matmul"), table.phase_share("optimizer")
    rows = labkit.kernels.mfu_sweep(config, "micro_batch", [1, 2, 4, 8])  # MFU against a knob
    rows = labkit.kernels.attention_sweep([128, 256, 512])               # SDPA backends: time and bytes

Everything here measures on the learner's device; nothing is typed in. Timings are interleaved (A B A B
...) and compared with the course's bootstrap verdict (``labkit.tools.compare.verdict``), so a difference is
claimed only when the repeats show one. Tools that build a model build their own copy. Every name the
notebooks, tests and benchmarks use is importable from here (``from labkit.chapters import kernels``); a test
that monkeypatches one patches it in the topic module that defines it.
"""
from __future__ import annotations

from .attention import attention_sweep, attention_verdict, math_saved_dtype, sdpa_backends
from .charts import KIND_COLORS, KIND_WORDS, plot_attention, plot_optimizers, plot_shares, plot_sweeps
from .common import (REFERENCE_PLACES, REFERENCE_SECTIONS, bench_threads, interleaved, out_dir, plain,
                     reference_overview, reference_summaries)
from .matmuls import compare_head_shapes, head_step, padding_sentence, tf32_matmul
from .mfu import mfu_sweep, same_config_sentence, sweep_sentence
from .notes import (attention_note, baseline_note, compile_skip_note, fused_backend, fusion_note, matching_profile,
                    optimizer_note, reference_lines, reference_profile, setup_note, sweeps_note, tf32_note,
                    tf32_skip_note, trace_note)
from .optimizers import ADAMW_IMPLS, adamw_impls, default_adamw, fused_supported, optimizer_steps
from .profiles import (MATMUL_OPS, PHASES, ProfileTable, compile_room, op_kind, profile_sentence, profile_step,
                       quiet_profiler, read_profile, saved_profile)
from .torch_compile import (breakeven_sentence, compile_ready, compile_run, compile_sentence, cxx_compiler,
                            fusion_demo)

__all__ = ["out_dir", "bench_threads", "reference_summaries", "reference_overview", "cxx_compiler",
           "compile_ready", "op_kind", "ProfileTable", "profile_step", "saved_profile", "quiet_profiler", "profile_sentence", "compile_room", "mfu_sweep",
           "sweep_sentence", "same_config_sentence", "interleaved", "padding_sentence",
           "head_step", "compare_head_shapes", "fusion_demo", "compile_run", "compile_sentence", "breakeven_sentence",
           "adamw_impls", "fused_supported", "default_adamw", "optimizer_steps",
           "tf32_matmul", "plain", "sdpa_backends", "math_saved_dtype", "attention_sweep", "attention_verdict", "plot_sweeps",
           "plot_shares", "plot_attention", "plot_optimizers",
           # the tables the tools read, importable for tests and readers
           "ADAMW_IMPLS", "KIND_COLORS", "KIND_WORDS", "MATMUL_OPS", "PHASES", "REFERENCE_PLACES", "REFERENCE_SECTIONS",
           "read_profile",
           # the chapter's words beside each measurement (notes)
           "setup_note", "baseline_note", "sweeps_note", "reference_lines", "reference_profile", "fusion_note",
           "compile_skip_note", "matching_profile", "optimizer_note", "tf32_note", "tf32_skip_note", "fused_backend",
           "attention_note", "trace_note"]


def __getattr__(name: str):
    """``kernels.log_ticks`` still answers: the tick rule moved to ``labkit.tools.plots``, which needs matplotlib,
    so it is loaded on first use rather than with the chapter's tools."""
    if name == "log_ticks":
        from ...tools.plots import log_ticks  # deferred: matplotlib is optional; loaded only when asked for

        return log_ticks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
