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

Each tool returns data -- rows, figures, a verdict's name; chapter 07's cells draw the tables and say the
sentence each verdict calls for.

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

from .attention import (attention_sweep, attention_verdict, fused_backend, gpu_sdpa, math_saved_dtype, memory_rows,
                        sdpa_backends)
from .charts import KIND_COLORS, KIND_WORDS, plot_attention, plot_optimizers, plot_shares, plot_sweeps
from .common import (REFERENCE_PLACES, REFERENCE_SECTIONS, bench_threads, interleaved, out_dir, plain,
                     reference_rows, reference_summaries, reference_table)
from .matmuls import compare_head_shapes, head_step, padding_verdict, tf32_matmul, tf32_refusal
from .mfu import busy, mfu_sweep, same_config, sweep_split
from .optimizers import ADAMW_IMPLS, adamw_impls, default_adamw, fused_supported, optimizer_steps
from .profiles import (MATMUL_OPS, PHASES, ProfileTable, op_kind, profile_step, quiet_profiler,
                       read_profile, reference_profile, saved_profile, share_rows)
from .torch_compile import compile_ready, compile_run, cxx_compiler, fusion_demo, payback, payback_verdict

__all__ = ["out_dir", "bench_threads", "reference_summaries", "reference_rows", "reference_table",
           "cxx_compiler", "compile_ready", "op_kind", "ProfileTable", "profile_step", "saved_profile", "quiet_profiler",
           "share_rows", "reference_profile", "mfu_sweep", "sweep_split", "busy", "same_config",
           "interleaved", "padding_verdict", "head_step", "compare_head_shapes", "fusion_demo", "compile_run", "payback",
           "payback_verdict", "adamw_impls", "fused_supported", "default_adamw", "optimizer_steps", "tf32_matmul",
           "tf32_refusal", "plain", "sdpa_backends", "gpu_sdpa", "math_saved_dtype", "attention_sweep",
           "attention_verdict", "fused_backend", "memory_rows", "plot_sweeps", "plot_shares", "plot_attention",
           "plot_optimizers",
           # the tables the tools read, importable for tests and readers
           "ADAMW_IMPLS", "KIND_COLORS", "KIND_WORDS", "MATMUL_OPS", "PHASES", "REFERENCE_PLACES", "REFERENCE_SECTIONS",
           "read_profile"]


def __getattr__(name: str):
    """``kernels.log_ticks`` still answers: the tick rule moved to ``labkit.tools.plots``, which needs matplotlib,
    so it is loaded on first use rather than with the chapter's tools."""
    if name == "log_ticks":
        from ...tools.plots import log_ticks  # deferred: matplotlib is optional; loaded only when asked for

        return log_ticks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
