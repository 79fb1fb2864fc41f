"""Chapter 05's room: the data loader. ``loops`` runs the loader and training loops the chapter times (the
interleaved loop comparisons, worker start-up, worker memory, pinned copies); ``results`` turns their runs into
the chapter's rows and outcomes. The notebook imports it as ``ch05``."""
from .loops import (LoopComparison, NotebookStyleDataset, compare_loops, fewest_workers, ideal_step_s,  # noqa: F401
                    interleaved, loader_for, pinned_copy, plot_sweep, startup, startup_comparison, time_loop,
                    try_spawn, wait_figures, worker_memory)
from .results import (UNDER_LOAD, arm_rows, memory_rows, mfu_basis, prefetch_outcome, prefetch_rows,  # noqa: F401
                      reference_rows, loop_rows, sample_cost, startup_rows, sweep_rows, waiting_explains,
                      workers_outcome)
