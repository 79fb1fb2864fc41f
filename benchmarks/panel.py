"""What the lab panel's live charts cost, and how soon the first chart shows after Run.

    .venv/bin/python benchmarks/panel.py [--repeats 3] [--preset all] [--model small] [--device cpu]
                                         [--steps N] [--history 1,300]

A Lab with every chart (preset "all") on the CPU and the ``small`` model, with the panel's default
steps; Run is pressed through the button's own path (a background thread), as a learner does.
For every run the panel accounts the time it spends drawing the live charts (the first chart, the
throttled redraws and the final picture) and the time from pressing Run to the first chart with
data. The history table and comparison chart, redrawn once after each run, are timed apart. For scale the
same configuration also runs without any panel (``lk.run``), alternating with the panel runs.
Everything runs on the CPU cores this machine has; other work on them scatters single runs.

Then the panel's own cost per run as the history grows (issue 25: ``lab.run`` took 2.2 s with 1 run
in the history and 7.9 s with 300): the history is filled with copies of a finished run and one more
run is pressed, for each size in ``--history``; the panel's cost is the run's wall time from the
press minus its training time, plus the live charts drawn between updates (``last_timing["panel_s"]``). Printed as
``panel_cost history=<n>: <seconds> s (history part <seconds> s)``, medians over the repeats.

Then the time from a toggle to the first chart point (issue 34), at world size 1 and 2: a knob is set
as the learner's control sets it (``lab.set``: the seed, to a new value, and the world size), Run is
pressed, and the clock stops when the first update's record has been drawn on the chart. Each world-size-2
run follows a world-size-1 run, so it is the DDP toggle a learner makes. Printed as
``toggle_to_first_point_s_ws1=<seconds>`` and ``toggle_to_first_point_s_ws2=<seconds>``, medians over
``--toggle-repeats`` (world size 2: the toggles after the first, with the warm server up), then
``toggle_to_first_point_s_ws2_server_start=<seconds>``, the first one, which also waited for the server's
imports; the machine's load (other processes' cores) is printed beside them.

The last line is a contract: ``chart_overhead=<fraction> first_chart_s=<seconds>``, the medians
over the repeats (the machine's other work scatters single runs).
"""
import argparse
import statistics
import threading
import time

import matplotlib

matplotlib.use("Agg")

import labkit as lk  # noqa: E402
from labkit.engine.device import LoadMeter, cores  # noqa: E402


def plain_run(cfg) -> float:
    """lk.run without a panel, on a fresh thread like the Run button's: on a loaded machine a run on the
    main thread was several times slower here (OpenMP's spinning thread team fights the other load)."""
    out = {}

    def go():
        t = time.perf_counter()
        lk.run(cfg)
        out["s"] = time.perf_counter() - t

    th = threading.Thread(target=go)
    th.start()
    th.join()
    return out["s"]


def history_cost(lab, n: int, repeats: int) -> tuple:
    """Median (panel cost, history part) of one more run with ``n`` finished runs in the history; the
    cost is the wall time from the press minus the training itself."""
    model = lab.history[-1]
    costs, parts = [], []
    for _ in range(repeats):
        # distinct copies, as a long session has distinct runs (a row built for one is not another's)
        lab.history = [lk.Result(model.config, dict(model.summary), list(model.records)) for _ in range(n)]
        lab._history.refresh()
        lab._run_button.click()
        if not lab.wait(600) or len(lab.history) != n + 1:
            raise SystemExit(f"the run after {n} did not complete: {lab.message}")
        tm = lab.last_timing
        costs.append(tm.get("panel_s", tm["total_s"] - tm["run_s"]))  # an older labkit has no panel_s
        parts.append(tm["history_s"])
    return statistics.median(costs), statistics.median(parts)


def toggle_to_first_point(lab, world_size: int, seed: int) -> float:
    """Seconds from setting the knobs (a new seed, and ``world_size``) to the first chart point of the run
    that Run then starts."""
    toggled = time.perf_counter()
    lab.set(world_size=world_size, seed=seed)
    lab._run_button.click()
    if not lab.wait(600) or lab._charts.first_at is None:
        raise SystemExit(f"the run at world size {world_size} did not draw a point: {lab.message}")
    return lab._charts.first_at - toggled


def toggle_times(lab, repeats: int, steps: int) -> dict:
    """{world size: [seconds]} over ``repeats`` rounds of world size 1 then 2; the knobs are put back after."""
    before = {k: getattr(lab.config, k) for k in ("world_size", "seed", "steps")}
    lab.set(steps=steps)
    times = {1: [], 2: []}
    try:
        for i in range(repeats):
            for ws in (1, 2):
                times[ws].append(toggle_to_first_point(lab, ws, 1000 + 2 * i + ws))
                print(f"toggle {i + 1}: world size {ws}, first chart point after {times[ws][-1]:.2f} s", flush=True)
    finally:
        lab.set(**before)
    return times


def _load(meter) -> str:
    other = meter.read().get("other_cores")
    return "unknown" if other is None else f"{other:.2f} other cores busy of {cores()}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--preset", default="all", help="chapter preset: which charts the panel draws")
    ap.add_argument("--model", default="small")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=None, help="updates per run (default: the panel's own)")
    ap.add_argument("--history", default="1,300", help="history sizes to time the panel's cost per run at")
    ap.add_argument("--toggle-repeats", type=int, default=3, help="rounds of toggles (world size 1, then 2); 0: none")
    ap.add_argument("--toggle-steps", type=int, default=2, help="updates per toggled run (only the first is timed)")
    args = ap.parse_args(argv)

    t = time.perf_counter()
    knobs = {"steps": args.steps} if args.steps else {}
    lab = lk.Lab(preset=args.preset, model=args.model, device=args.device, **knobs)
    print(f"panel built in {time.perf_counter() - t:.2f} s (warm-up included); charts: {lab._charts.shown}")
    cfg = lab.config
    print(f"config: {args.model}, {cfg.steps} steps, micro_batch {cfg.micro_batch}, {cfg.precision}, "
          f"device {lab.caps.kind} ({lab.caps.name}, {lab.caps.cores} cores)")

    overheads, firsts, plain_s, panel_s = [], [], [], []
    for i in range(args.repeats):
        lab._run_button.click()  # exactly what a click does: start() on a background thread
        if not lab.wait(600) or len(lab.history) != i + 1:
            raise SystemExit(f"run {i} did not complete: {lab.message}")
        tm = lab.last_timing
        overheads.append(tm["chart_overhead"])
        firsts.append(tm["first_chart_s"])
        panel_s.append(tm["total_s"])
        print(f"panel run {i}: {tm['total_s']:.2f} s (training {tm['run_s']:.2f} s), live charts "
              f"{tm['chart_s']:.3f} s in {tm['renders']} redraws ({100 * tm['chart_overhead']:.1f} %), first chart "
              f"after {tm['first_chart_s']:.2f} s; history and comparison chart after the run {tm['history_s']:.3f} s")
        plain_s.append(plain_run(cfg))
        print(f"plain run {i}: {plain_s[-1]:.2f} s (lk.run on a thread, no panel)")

    for n in [int(x) for x in args.history.split(",") if x]:
        cost, part = history_cost(lab, n, args.repeats)
        print(f"panel_cost history={n}: {cost:.3f} s (history part {part:.3f} s)")

    if args.toggle_repeats > 0:
        meter = LoadMeter()
        times = toggle_times(lab, args.toggle_repeats, args.toggle_steps)
        load = _load(meter)
        print(f"toggle to first chart point, machine load: {load}")
        # The first world-size-2 toggle also waits for the warm server's imports (a kernel's first DDP run);
        # the goal is about the toggles after it, with the server up.
        cold, warm = times[2][0], times[2][1:] or times[2]
        print(f"toggle_to_first_point_s_ws1={statistics.median(times[1]):.2f}")
        print(f"toggle_to_first_point_s_ws2={statistics.median(warm):.2f}")
        print(f"toggle_to_first_point_s_ws2_server_start={cold:.2f}")

    pm, qm = statistics.median(panel_s), statistics.median(plain_s)
    print(f"median wall time: panel {pm:.2f} s, plain {qm:.2f} s ({100 * (pm / qm - 1):+.1f} %; "
          "includes the run-to-run scatter of this machine)")
    print(f"chart_overhead={statistics.median(overheads):.4f} first_chart_s={statistics.median(firsts):.2f}")


if __name__ == "__main__":
    main()
