"""Memory in practice: the tools of chapter 08 (sequence length, the step-2 out-of-memory, the allocator,
bytes per parameter), and chapter 03's peak against the accumulation steps -- one module per topic.

    rows = labkit.memlab.seq_sweep(config, [64, 128, 256])     # activation bytes against T, measured
    labkit.memlab.activation_formula(L, d, n_head, T, B, "math")  # ... and by formula, part by part
    steps = labkit.memlab.first_updates(config)                 # weights, grads, AdamW state, activations
    peak = labkit.memlab.update_peak(config.replace(accum=4))   # one update's peak, K micro-batches
    rows = labkit.memlab.bytes_per_param(config)                # bytes per parameter of three recipes, counted
    pat = labkit.memlab.fragmentation_patterns()                # the allocator demo's arithmetic (any device)

On a CUDA GPU the allocator's own numbers are used (memory_allocated, memory_stats, its history); on a
CPU, which has no such allocator statistics, bytes are counted storage by storage (labkit's dispatch
tracer) -- never estimated and shown as measured. Tools that build a model build their own copy.
Every public function checks its arguments before it does any work (ConfigError: field, value, what is
allowed).

    seqlen         activation bytes against T (measured, by formula), attention recompute; their tables, figures
    updates        the first two updates by hand: where AdamW's state appears (the step-2 peak); its verdict key
    accumulation   chapter 03: one update's peak against K, and which case its numbers are in
    allocator      the CUDA caching allocator: statistics, the fragmentation patterns' arithmetic, history
    fragmentation  the allocator demo, one process per setting (``python -m labkit.chapters.memlab``)
    recipes        bytes per parameter of three mixed-precision recipes; what one engine run held
    charts         the chapter's figures

The words a learner reads about these numbers are written in chapter 08's (and 03's) cells (``lk.course.explain``).
"""
from ._common import MIB
from .accumulation import accumulation_peaks, accumulation_reading, update_peak
from .allocator import (PAGE_MIB, allocator_stats, fragmentation_patterns, growth_pattern, hole_pattern,
                        record_cuda_history)
from .charts import (ROLE_COLORS, ROLE_WORDS, plot_bytes_per_param, plot_first_updates, plot_seq_sweep,
                     plot_update_peaks)
from .fragmentation import EXPECTED, fragmentation_demo, fragmentation_demos, fragmentation_table, fragmentation_verdicts
from .recipes import RECIPES, bpp_table, budget_beside_run, bytes_per_param, run_memory
from .seqlen import (activation_formula, attention_recompute, attention_recompute_ready, recompute_summary,
                     recompute_table, reference_rows, seq_summary, seq_sweep, seq_table, square_share)
from .updates import (AllocatorPeak, first_updates, moments_table, peak_phase, peaks_table, step2_figures,
                      step2_reference_rows, update_peaks)

__all__ = ["activation_formula", "seq_sweep", "attention_recompute_ready", "attention_recompute",
           "seq_table", "square_share", "seq_summary", "reference_rows", "recompute_table", "recompute_summary",
           "first_updates", "update_peaks", "peak_phase", "peaks_table", "moments_table", "step2_figures",
           "step2_reference_rows", "update_peak", "accumulation_peaks", "accumulation_reading",
           "allocator_stats", "hole_pattern", "growth_pattern", "fragmentation_patterns", "EXPECTED",
           "fragmentation_demo", "fragmentation_demos", "fragmentation_table", "fragmentation_verdicts",
           "record_cuda_history", "bytes_per_param", "RECIPES", "run_memory", "bpp_table", "budget_beside_run",
           "plot_seq_sweep", "plot_first_updates", "plot_update_peaks", "plot_bytes_per_param", "AllocatorPeak"]
