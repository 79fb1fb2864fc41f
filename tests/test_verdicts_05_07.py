"""Chapters 05, 06 and 09 (the playbook) draw conclusions from measurements only through verdicts: every A/B a conclusion rests on
is an interleaved, repeated comparison (``lk.compare_configs`` or loaderlab's loops, judged by
``labkit.tools.compare.verdict``) whose generated sentence is printed, with a literal, small time budget; and no
direction ("pays off", "faster", "wins") is printed unless the comparison's verdict chose it.

Fast: the notebooks are parsed, never run; the verdict helpers are fed synthetic samples and fake runs."""
import ast
import json
import re
from pathlib import Path

import pytest

import labkit as lk
from labkit.chapters import ch05_loader as ch05
from labkit.chapters import ch05_loader as loaderlab
from labkit.chapters import ch09_playbook as pb
from labkit.tools.compare import verdict
from labkit.base.page import outcome
from labkit.instructor.hosting import SETUP_ID  # the generated set-up cell (tests/test_hosting.py)

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
CHAPTERS = {"05": NB_DIR / "05_data_loader.ipynb", "06": NB_DIR / "06_ddp_allreduce.ipynb",
            "09": NB_DIR / "09_fixed_gpus_playbook.ipynb"}
MAX_BUDGET_S = 150  # per chapter, normal mode: the sum of its comparisons' lk.course.budget(N)

# Calls that run an interleaved comparison (their budget must be lk.course.budget(<literal>)).
COMPARISONS = {"compare_configs", "compare_loops", "startup_comparison"}
# Words that claim a direction. In a code cell they may only appear where a verdict chose them.
DIRECTION = re.compile(r"\bpays? off\b|\bfaster\b|\bslower\b|\bwins\b|\bloses\b|\bpaid off\b", re.I)
# Functions whose text arguments are chosen by a Comparison's verdict.
VERDICT_FUNCS = {"explain"}  # explain: lk.course.explain
VERDICT_ATTRS = {"better", "verdict"}
# Cells (by tag) whose conclusion must come from lk.compare_configs.
MUST_COMPARE = {"05": ["measure-05-starving", "measure-05-workers-verdict", "measure-05-prefetch"],
                "06": ["measure-06-every-micro-real"],
                "09": ["measure-09-best-vs-baseline", "measure-09-workers"]}


def code_cells(nn):
    nb = json.loads(CHAPTERS[nn].read_text(encoding="utf-8"))
    return [c for c in nb["cells"] if c["cell_type"] == "code" and c.get("id") != SETUP_ID]  # chapter cells


def source(c):
    return "".join(c["source"])


def tree(c):
    text = "\n".join(line for line in source(c).splitlines() if not line.lstrip().startswith(("%", "!")))
    return ast.parse(text)


def parents(t):
    out = {}
    for node in ast.walk(t):
        for child in ast.iter_child_nodes(node):
            out[child] = node
    return out


def call_name(node):
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def mentions_verdict(node):
    """Whether an expression reads a comparison's verdict (cmp.better, cmp.verdict, or a flag computed
    from its repeats such as `enough`)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in VERDICT_ATTRS:
            return True
        if isinstance(n, ast.Name) and n.id == "enough":
            return True
    return False


def chosen_by_verdict(node, up):
    """Whether a string constant sits where a verdict chooses it: an argument of explain(...), or a
    branch of an if / conditional expression whose test (or an earlier elif's) reads a verdict."""
    child, cur = node, up.get(node)
    while cur is not None:
        if isinstance(cur, ast.Call) and call_name(cur) in VERDICT_FUNCS and child is not cur.func:
            return True
        if isinstance(cur, (ast.If, ast.IfExp)) and child is not cur.test:
            chain = cur
            while chain is not None:
                if mentions_verdict(chain.test):
                    return True
                prev = up.get(chain)  # an `elif` is an If nested in the orelse of the previous one
                chain = prev if isinstance(prev, ast.If) and chain in prev.orelse else None
        child, cur = cur, up.get(cur)
    return False


def strings(t):
    for node in ast.walk(t):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node


def budget_literal(call):
    """N of budget_s=lk.course.budget(N) in a comparison call, or None when it is not written that way."""
    for kw in call.keywords:
        if kw.arg == "budget_s":
            v = kw.value
            if (isinstance(v, ast.Call) and call_name(v) == "budget" and ast.unparse(v.func) == "lk.course.budget"
                    and len(v.args) == 1 and isinstance(v.args[0], ast.Constant)
                    and isinstance(v.args[0].value, (int, float))):
                return v.args[0].value
            return None
    return None


def comparison_calls(nn):
    for c in code_cells(nn):
        for node in ast.walk(tree(c)):
            if isinstance(node, ast.Call) and call_name(node) in COMPARISONS:
                yield c, node


# ---- the chapters ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("nn", sorted(CHAPTERS))
def test_every_comparison_cell_prints_the_generated_sentence(nn):
    calls = list(comparison_calls(nn))
    assert calls, f"chapter {nn} runs no interleaved comparison"
    for c, _ in calls:
        src = source(c)
        assert ".sentence" in src, f"chapter {nn}: a comparison cell does not print its sentence: {src[:80]!r}"
        assert "lk.course.say(" in src


@pytest.mark.parametrize("nn", sorted(CHAPTERS))
def test_conclusions_come_from_compare_configs(nn):
    by_tag = {t: source(c) for c in code_cells(nn) for t in c.get("metadata", {}).get("tags", [])}
    for tag in MUST_COMPARE[nn]:
        assert tag in by_tag, f"chapter {nn}: no cell tagged {tag}"
        assert "lk.compare_configs(" in by_tag[tag], f"chapter {nn}: {tag} must measure with lk.compare_configs"


def test_ddp_counts_are_compared_exactly():
    src = next(source(c) for c in code_cells("06") if "measure-06-every-micro-real" in c["metadata"].get("tags", []))
    # the counts come from the comparison's exact pairs (ddplab.exact_rows reads cmp.exact: tests/test_ddplab.py)
    assert ".exact[" in src and "allreduce_calls_per_update" in src or "dp.exact_rows(cmp_sync)" in src


@pytest.mark.parametrize("nn", sorted(CHAPTERS))
def test_budgets_are_literal_small_and_announced(nn):
    literals = []
    for c, call in comparison_calls(nn):
        n = budget_literal(call)
        assert n is not None, f"chapter {nn}: write budget_s=lk.course.budget(N) with a literal N: {ast.unparse(call)[:90]}"
        literals.append(n)
    assert sum(literals) <= MAX_BUDGET_S, f"chapter {nn}: comparisons budget {sum(literals)} s > {MAX_BUDGET_S} s"
    # the chapter says near its start how long its comparisons take, from the same budgets
    first = code_cells(nn)[:2]
    announced = None
    for c in first:
        for node in ast.walk(tree(c)):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "planned_s" for t in node.targets):
                announced = [n.value for n in ast.walk(node.value)
                             if isinstance(n, ast.Constant) and isinstance(n.value, (int, float))]
                assert "lk.course.budget" in ast.unparse(node.value)
    assert announced is not None, f"chapter {nn}: no `planned_s = ...` line near the start"
    assert sorted(announced) == sorted(literals), (f"chapter {nn}: the announced budgets {sorted(announced)} differ "
                                                   f"from the comparisons' {sorted(literals)}")


@pytest.mark.parametrize("nn", sorted(CHAPTERS))
def test_no_direction_is_printed_unless_a_verdict_chose_it(nn):
    for c in code_cells(nn):
        t = tree(c)
        up = parents(t)
        for node in strings(t):
            if DIRECTION.search(node.value) and not chosen_by_verdict(node, up):
                pytest.fail(f"chapter {nn}: {node.value.strip()[:70]!r} claims a direction that no verdict chose "
                            f"(cell {source(c)[:50]!r})")


def test_the_direction_check_catches_hand_written_verdicts():
    hand = ast.parse('gain = b / a\nsay(f"{gain:.2f}x. " + ("Workers pay off here." if gain > 1.05 else "No."))\n'
                     'say(f"Fastest here: {w}, {r:.2f}x faster than 0 workers.")')
    up = parents(hand)
    flagged = [n.value for n in strings(hand) if DIRECTION.search(n.value) and not chosen_by_verdict(n, up)]
    assert len(flagged) == 2
    ok = ast.parse('explain(cmp, faster="Workers pay off here.", slower="x", same="y")\n'
                   'if not enough:\n    t = ""\nelif cmp.better == "b":\n    t = "faster"\nelse:\n    t = "same"\n'
                   'u = "slower" if cmp.better == "a" else ""')
    up = parents(ok)
    assert all(chosen_by_verdict(n, up) for n in strings(ok) if DIRECTION.search(n.value))


# ---- loaderlab's verdict helpers ------------------------------------------------------------------------

CLEAR_A = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00]
CLEAR_B = [0.50, 0.51, 0.49, 0.52, 0.48, 0.50]  # half the step time: b better
OVERLAP_A = [1.00, 1.20, 0.80, 1.10, 0.90, 1.05]
OVERLAP_B = [1.05, 0.85, 1.15, 0.95, 1.00, 1.10]


class FakeResult:
    def __init__(self, **summary):
        self.summary = summary


def with_results(cmp, wait_a, wait_b):
    def runs(samples, wait):
        return [FakeResult(step_time_s=s, data_wait_s=wait * s, compute_s=(1 - wait) * s, data_wait_frac=wait,
                           tokens_per_s=1000 / s, intra_op_threads=1) for s in samples]
    cmp.results_a, cmp.results_b = runs(cmp.samples_a, wait_a), runs(cmp.samples_b, wait_b)
    return cmp


def test_a_comparison_chooses_its_sentence_by_its_verdict():
    assert outcome(verdict(CLEAR_A, CLEAR_B, "step_time_s")) == "faster"
    assert outcome(verdict(CLEAR_B, CLEAR_A, "step_time_s")) == "slower"
    assert outcome(verdict(OVERLAP_A, OVERLAP_B, "step_time_s")) == "same"
    assert outcome(verdict(CLEAR_A[:3], CLEAR_B[:3], "step_time_s")) == "few"
    # tokens/s: higher is better, so the same clear samples read the other way round
    assert outcome(verdict(CLEAR_A, CLEAR_B, "tokens_per_s")) == "slower"


def _run_workers_cell(cmp, monkeypatch):
    """Chapter 09's waiting cell on a made-up comparison: the rows it drew, the outcome its explain chose and
    what it said besides (explain's own sentence goes through base.page.say, not lk.course.say)."""
    nb = json.loads((NB_DIR / "09_fixed_gpus_playbook.ipynb").read_text())
    src = next("".join(c["source"]) for c in nb["cells"] if c.get("id") == "workers-waiting-09")
    shown, chosen, said = [], [], []
    from labkit.base.page import explain as real
    monkeypatch.setattr(lk.course, "explain", lambda m, **kw: chosen.append(real(m, **kw)))
    monkeypatch.setattr(lk.course, "say", lambda text: said.append(text))
    exec(src, dict(lk=lk, wait_figures=ch05.wait_figures, cmp_workers=cmp, env=dict(kind="cpu"), display=shown.append))
    return shown[0], chosen, said


def test_the_workers_cell_says_pay_off_only_when_the_workers_arm_is_better(monkeypatch):
    rows, chosen, said = _run_workers_cell(with_results(verdict(CLEAR_A, CLEAR_B, "step_time_s", label_a="workers=0",
                                                                label_b="workers=1"), 0.5, 0.02), monkeypatch)
    assert chosen == ["faster"] and said == []  # the verdict's sentence (explain says it), no warning
    assert [r["arm"] for r in rows] == ["workers=0", "workers=1"]
    assert [r["data_wait_frac"] for r in rows] == [0.5, 0.02]          # the waiting, from the same (fake) runs
    assert rows[0]["data_wait_s"] == 0.5 and rows[0]["step_time_s"] == 1.0  # medians of those runs
    assert "| 50% | 500 |" in rows._repr_markdown_()
    for (a, b, wa, wb), want in (((CLEAR_B, CLEAR_A, 0.5, 0.3), "slower"), ((OVERLAP_A, OVERLAP_B, 0.4, 0.1), "same"),
                                 ((CLEAR_A[:2], CLEAR_B[:2], 0.5, 0.02), "few")):
        _, chosen, said = _run_workers_cell(with_results(verdict(a, b, "step_time_s"), wa, wb), monkeypatch)
        assert chosen == [want] and said == [], want
    _, chosen, said = _run_workers_cell(with_results(verdict(CLEAR_A, CLEAR_B, "step_time_s"), 0.1, 0.9), monkeypatch)
    assert chosen == ["faster"] and len(said) == 1 and "⚠" in said[0]  # faster, yet waiting more: a warning


def test_wait_figures_are_medians_of_the_arm():
    runs = [FakeResult(step_time_s=s, data_wait_s=w, compute_s=s - w, data_wait_frac=w / s, tokens_per_s=1 / s,
                       intra_op_threads=2) for s, w in ((1.0, 0.5), (3.0, 0.1), (2.0, 0.2))]
    f = loaderlab.wait_figures(runs)
    assert f["step_time_s"] == 2.0 and f["data_wait_s"] == 0.2 and f["runs"] == 3 and f["intra_op_threads"] == 2


def test_interleaved_alternates_discards_warmup_and_respects_the_budget():
    calls = []
    out = loaderlab.interleaved({"a": lambda: calls.append("a") or len(calls),
                                 "b": lambda: calls.append("b") or len(calls)},
                                budget_s=60, max_repeats=4, progress=False)
    assert calls[:4] == ["a", "b", "a", "b"]
    assert out == {"a": [3, 5, 7, 9], "b": [4, 6, 8, 10]}  # round 1 (calls 1, 2) was the warm-up
    few = loaderlab.interleaved({"a": lambda: 1}, budget_s=1e-9, progress=False)
    assert len(few["a"]) == 2  # at least two kept rounds, even with no budget left


def fake_loop(step_s):
    def loop(config, threads, updates):
        s = step_s[(config.workers, threads)].pop(0)
        return {"threads": threads, "workers": config.workers, "step_time_s": s, "data_wait_s": 0.1 * s,
                "data_wait_frac": 0.1}
    return loop


def test_compare_loops_gives_a_direction_only_for_a_clear_difference():
    cfg = lk.Config(model="tiny", steps=2)
    cases = {"none": (0, 2), "crowded": (1, 2), "limited": (1, 1)}
    n = 6
    steps = {(0, 2): [1.0] + CLEAR_A[:n - 1] + [1.0] * 30, (1, 2): [1.0] + OVERLAP_B[:n - 1] + [1.0] * 30,
             (1, 1): [1.0] + CLEAR_B[:n - 1] + [0.5] * 30}
    loops = loaderlab.compare_loops(cfg, cases, updates=2, budget_s=60, max_repeats=n, loop_fn=fake_loop(steps),
                                    progress=False)
    assert {k: len(v) for k, v in loops.samples.items()} == {"none": n, "crowded": n, "limited": n}
    clear = loops.compare("none", "limited")
    assert clear.verdict == "lower" and clear.better == "b" and "**limited** is better" in clear.sentence
    assert loops.compare("none", "crowded").verdict == "same" or loops.compare("none", "crowded").busy
    assert loops.median("limited", "data_wait_frac") == 0.1


def test_startup_comparison_speaks_of_startup_and_follows_the_samples():
    later = {False: iter([0.2, 0.21, 0.19, 0.2, 0.22, 0.2, 0.2] + [0.2] * 40),
             True: iter([0.01, 0.011, 0.009, 0.01, 0.012, 0.01, 0.01] + [0.01] * 40)}

    def fake_startup(config, workers, persistent, epochs):
        return [0.3, next(later[persistent])]

    cmp = loaderlab.startup_comparison(lk.Config(model="tiny"), 2, budget_s=60, startup_fn=fake_startup,
                                       progress=False)
    assert cmp.better == "b" and "time to the first batch of a later epoch" in cmp.sentence
    assert "wall time per update" not in cmp.sentence
    assert set(cmp.first_epochs[True]) == {0.3}


# ---- playbook: the repeated grid and the search's verdict ------------------------------------------------

def fake_run_fn(speeds):
    """A run function returning the next tokens/s of each micro-batch (refusing micro-batch 3)."""
    order = []

    def run(cfg):
        if cfg.micro_batch == 3:
            raise lk.ConfigError("micro_batch", 3, "not 3")
        order.append(cfg.micro_batch)
        tps = speeds[cfg.micro_batch].pop(0)
        return FakeResult(tokens_per_s=tps, step_time_s=1000 / tps, mfu=0.1, final_loss=1.0, peak_mem_bytes=None,
                          param_bytes=cfg.micro_batch, grad_bytes=0, optimizer_bytes=0, activation_bytes=0)
    return run, order


def test_grid_search_repeats_in_alternating_order_and_keeps_medians():
    pts = [dict(precision="fp32", micro_batch=mb, accum=1, checkpointing="none", workers=0) for mb in (1, 2, 3)]
    run, order = fake_run_fn({1: [100, 200, 150], 2: [400, 300, 350]})
    rows = pb.grid_search(dict(model="tiny", steps=2), pts, progress=False, repeats=3, run_fn=run)
    assert order == [1, 2, 2, 1, 1, 2]  # forwards, backwards, forwards; the refused point is not retried
    assert [r["status"] for r in rows] == ["ok", "ok", "refused"]
    assert rows[0]["tokens_per_s"] == 150 and rows[0]["tokens_per_s_runs"] == [100, 200, 150]
    assert rows[1]["tokens_per_s"] == 350
    assert pb.run_scatter(rows) == pytest.approx(statistics_median([100 / 150, 100 / 350]))
    top = pb.best_within(rows, 10)
    assert top["micro_batch"] == 2
    assert pb.within_scatter(rows, top, 0.6) == rows[:2] and pb.within_scatter(rows, top, 0.05) == [rows[1]]
    assert pb.within_scatter(rows, top, None) == [top]
    single = pb.grid_search(dict(model="tiny", steps=2), pts[:1], progress=False,
                            run_fn=fake_run_fn({1: [123]})[0])
    assert single[0]["tokens_per_s"] == 123 and pb.run_scatter(single) is None


def statistics_median(xs):
    import statistics

    return statistics.median(xs)


def test_config_of_a_grid_row():
    cfg = pb.config_of(dict(model="tiny", steps=2, threads=1),
                       dict(precision="fp32", micro_batch=2, accum=4, checkpointing="full", workers=0, label="x"))
    assert (cfg.micro_batch, cfg.accum, cfg.checkpointing, cfg.threads) == (2, 4, "full", 1)


# ---- progress: a bar on stdout in a notebook, never a hand-written line on stderr ----------------------------

def test_the_sweeps_report_progress_through_progress_and_write_nothing_to_stderr(monkeypatch, capsys):
    from test_frontend import RecordingProgress as _Bar

    from labkit.chapters import ch01_measure as profiling

    from labkit.tools import sweep as tools_sweep, timing

    monkeypatch.setattr(tools_sweep, "Progress", _Bar)  # mfu_sweep runs through the one sweep
    monkeypatch.setattr(timing, "Progress", _Bar)  # loaderlab.interleaved through the one timing loop
    _Bar.made.clear()
    summary = dict(tokens_per_step=64, data_wait_s=0.0, compute_s=0.01, optimizer_s=0.001, mfu=0.1, tokens_per_s=1e3,
                   step_time_s=0.011, data_wait_frac=0.0, model_flops_per_step=1e6)
    profiling.mfu_sweep(lk.Config(model="tiny"), [1, 2], repeats=2,
                       run_fn=lambda cfg: FakeResult(**summary))
    loaderlab.interleaved({"a": lambda: 1, "b": lambda: 2}, budget_s=60, max_repeats=3)
    sweep, loop = _Bar.made
    assert (sweep.total, sweep.updates) == (4, [0, 1, 2, 3, 4]) and sweep.delay == 1.0
    assert loop.total == 4 and loop.updates == [1, 2, 3, 4]  # warm-up round + three kept
    assert capsys.readouterr().err == ""


# ---- chapter 01 and 05's instruments refuse impossible arguments before any work -----------------------------

def _never(*a, **k):
    raise AssertionError("work started before the arguments were checked")


CFG = lk.Config(model="tiny")


@pytest.mark.parametrize("call, field", [
    (lambda: loaderlab.ideal_step_s(-1, 1, 1), "data_s"), (lambda: loaderlab.ideal_step_s(1, 1, -2), "workers"),
    (lambda: loaderlab.ideal_step_s(1, float("nan"), 1), "compute_s"),
    (lambda: loaderlab.fewest_workers(1, 0, 1), "micro_batch"), (lambda: loaderlab.fewest_workers(1, 4, 1, limit=0), "limit"),
    (lambda: loaderlab.fewest_workers(float("inf"), 4, 1), "cost_ms_per_sample"),
    (lambda: loaderlab.interleaved({"a": _never}, budget_s=float("nan")), "budget_s"),
    (lambda: loaderlab.interleaved({"a": _never}, budget_s=-5), "budget_s"),
    (lambda: loaderlab.interleaved({"a": _never}, budget_s=5, max_repeats=0), "max_repeats"),
    (lambda: loaderlab.interleaved({}, budget_s=5), "fns"),
    (lambda: loaderlab.compare_loops(CFG, {"a": (0, 1), "b": (1, 1)}, updates=2, budget_s=5, min_repeats=0,
                                     loop_fn=_never), "min_repeats"),
    (lambda: loaderlab.compare_loops(CFG, {"a": (0, 1), "b": (1, 1)}, updates=2, budget_s=5, max_repeats=3,
                                     loop_fn=_never), "max_repeats"),
    (lambda: loaderlab.compare_loops(CFG, {"a": (0, 1), "b": (1, 1)}, updates=2, budget_s=5, threshold=float("nan"),
                                     loop_fn=_never), "threshold"),
    (lambda: loaderlab.compare_loops(CFG, {"a": (0, 0), "b": (1, 1)}, updates=2, budget_s=5, loop_fn=_never), "threads"),
    (lambda: loaderlab.compare_loops(CFG, {"a": (0, 1)}, updates=2, budget_s=5, loop_fn=_never), "cases"),
    (lambda: loaderlab.startup_comparison(CFG, 0, budget_s=5, startup_fn=_never), "workers"),
    (lambda: loaderlab.startup_comparison("tiny", 2, budget_s=5, startup_fn=_never), "config"),
    (lambda: loaderlab.time_loop(CFG, threads=0), "threads"), (lambda: loaderlab.startup(CFG, 1, "yes"), "persistent"),
    (lambda: loaderlab.worker_memory(CFG, context="frok"), "context"), (lambda: loaderlab.pinned_copy(0), "mbytes"),
    (lambda: loaderlab.try_spawn([1, 2]), "dataset"), (lambda: loaderlab.plot_sweep([]), "rows"),
])
def test_loaderlab_refuses_impossible_arguments_by_name(call, field):
    with pytest.raises(lk.ConfigError, match=f"^{field}="):
        call()


def test_diagnose_refuses_impossible_arguments_by_name():
    from labkit.chapters import ch01_measure as profiling
    from labkit.tools import timing

    cases = [(lambda: profiling.mfu_sweep(CFG, [], run_fn=_never), "micro_batches"),
             (lambda: profiling.mfu_sweep(CFG, [1, 0], run_fn=_never), "micro_batch"),
             (lambda: profiling.mfu_sweep(CFG, [1, 2], repeats=0, run_fn=_never), "repeats"),
             (lambda: profiling.data_costs(float("nan"), 8), "compute_s"),
             (lambda: profiling.data_costs(0.1, 8, budget_s=0), "budget_s"),
             (lambda: profiling.data_costs(0.1, 8, fractions=()), "fractions"),
             (lambda: timing.workers_rule(10, 0), "compute_ms"),
             (lambda: profiling.data_cost_rows({"a": None}, baseline="baseline"), "baseline"),
             (lambda: profiling.plot_mfu_sweep([], width=5), "rows")]
    for call, field in cases:
        with pytest.raises(lk.ConfigError, match=f"^{field}="):
            call()
