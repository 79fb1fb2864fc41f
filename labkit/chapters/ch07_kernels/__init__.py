"""Chapter 07's instruments -- why MFU is low when nothing waits: MFU against a knob, the matmul's shape
and precision, the AdamW implementations (``bench``); one profiled step (``profile``); fusion,
``torch.compile`` and the SDPA backends (``fusion``). Timings are interleaved and
compared with the course's bootstrap verdict, so a difference is claimed only where the repeats show one.

    rows = ch07.mfu_sweep(config, "micro_batch", [1, 2, 4, 8]); table = ch07.profile_step(config)"""

from ...base.paths import out_dir  # noqa: F401 -- ch07.out_dir(): where traces and snapshots go
from ...tools.timing import quiet_profiler  # noqa: F401 -- ch07.*, as the chapter calls them
from ..course import bench_threads, reference_summaries  # noqa: F401
from .bench import (ADAMW_IMPLS, DPI, REFERENCE_SECTIONS, adamw_impls, busy,  # noqa: F401
                    compare_head_shapes, default_adamw, fused_supported, head_step, interleaved, mfu_sweep,
                    optimizer_steps, padding_verdict, plain, plot_optimizers, plot_sweeps, reference_rows,
                    reference_table, same_config, sweep_split, tf32_matmul, tf32_refusal)
from .profile import (KIND_COLORS, KIND_WORDS, MATMUL_OPS, PHASES, ProfileTable, op_kind, plot_shares,  # noqa: F401
                      profile_step, read_profile, reference_profile, saved_profile, share_rows)
from .fusion import (attention_sweep, attention_verdict, compile_ready, compile_run, cxx_compiler,  # noqa: F401
                     fused_backend, fusion_demo, gpu_sdpa, math_saved_dtype, memory_rows, payback, payback_verdict,
                     plot_attention, sdpa_backends)
