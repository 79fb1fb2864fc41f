"""Charts for labkit runs: what a run produced (a ``Result``, a {"records", "summary"} dict or a
list of records) in, a ``matplotlib.figure.Figure`` out (``ax=`` draws into an axes of your own). No
pyplot: figures work in scripts, in tests and from the panel's background thread alike.

    fig = labkit.plots.step_time(result)
    open("step_time.png", "wb").write(labkit.plots.to_png(fig))

The modules, by what they draw: ``figure`` (THE figure maker ``new_figure``, colours, text sizes,
ticks; run labels and ratios in words), ``live`` (one value per update, and the memory breakdown),
``versus`` (runs side by side, and predictions beside measurements). Every name is importable from
here.
"""
from ...base.numfmt import counted, number  # noqa: F401  (lk.plots.number: the chapters call it by this name)
from ...base.schema import MEMORY_PARTS  # noqa: F401
from .figure import (COLORS, COMPARE_LAST, DPI, FONT, LABEL_KNOBS, RATIO_METRICS,  # noqa: F401
                     TITLE, LabFigure, NoChart, cpu_threads, flops_words, log_ticks, metric_words,
                     new_figure, ratio_lines, ratios, records_of, run_label, shown_runs, summary_of,
                     threads, threads_words, to_png, wipe)
from .live import (CHARTS, DRAW, Dashboard, LiveChart, allreduce, dashboard, loss, memory, step_time,  # noqa: F401
                   throughput, utilization)
from .versus import (PREDICTED_COLOR, compare, comparison, predicted_vs_measured, reference,  # noqa: F401
                     whatif)
