"""Chapter 07's instruments -- why MFU is low when nothing waits: MFU against a knob, the matmul's shape and
precision, the AdamW implementations (``bench``); one profiled training step (``profile``), what fusion and
``torch.compile`` do (``torch_compile``), the SDPA backends (``attention``). Every name the chapter calls is
importable from the package (``from labkit.chapters import ch07_kernels as kn``); a test that monkeypatches one
patches it in the module that defines it.

    rows = kn.mfu_sweep(config, "micro_batch", [1, 2, 4, 8])       # MFU against a knob
    table = kn.profile_step(config, trace_path="step.json")       # one profiled training step
    rows = kn.attention_sweep([128, 256, 512])                     # SDPA backends: time and bytes

Everything here measures on the learner's device; nothing is typed in. Timings are interleaved (A B A B ...)
and compared with the course's bootstrap verdict (``labkit.tools.compare.verdict``), so a difference is
claimed only when the repeats show one. Each tool returns data -- rows, figures, a verdict's name; chapter
07's cells draw the tables and say the sentence each verdict calls for.
"""

from ...base.paths import out_dir  # noqa: F401 -- ch07.out_dir(): where traces and snapshots go
from ...tools.timing import quiet_profiler  # noqa: F401 -- ch07.*, as the chapter calls them
from ..course import bench_threads, reference_summaries  # noqa: F401
from .attention import (attention_sweep, attention_verdict, fused_backend, gpu_sdpa, math_saved_dtype,  # noqa: F401
                        memory_rows, plot_attention, sdpa_backends)
from .bench import (ADAMW_IMPLS, DPI, REFERENCE_PLACES, REFERENCE_SECTIONS, adamw_impls, busy,  # noqa: F401
                    compare_head_shapes, default_adamw, fused_supported, head_step, interleaved, mfu_sweep,
                    optimizer_steps, padding_verdict, plain, plot_optimizers, plot_sweeps, reference_rows,
                    reference_table, same_config, sweep_split, tf32_matmul, tf32_refusal)
from .profile import (KIND_COLORS, KIND_WORDS, MATMUL_OPS, PHASES, ProfileTable, op_kind, plot_shares,  # noqa: F401
                      profile_step, read_profile, reference_profile, saved_profile, share_rows)
from .torch_compile import (compile_ready, compile_run, cxx_compiler, fusion_demo, payback,  # noqa: F401
                            payback_verdict)
