"""Chapter 09 (the fixed-GPU playbook): labkit.chapters.ch09_playbook and
notebooks/09_fixed_gpus_playbook.ipynb. The critical batch size, estimated from a fit over batch sizes rather
than read off one comparison; exercises that survive Run All, rendered markdown, prose through lk.course.say,
a what-if on a model where GPUs differ, reveals after their exercises; and the playbook refusing impossible
arguments before any work."""
import ast
import inspect
import math
import random
import re
from pathlib import Path

import nbformat
import pytest

import labkit as lk
from labkit.chapters import ch09_playbook as pb
from labkit.base.runtime import ConfigError
from labkit.instructor.hosting import SETUP_ID  # the generated set-up cell (tests/test_hosting.py)

NB = Path(__file__).resolve().parent.parent / "notebooks" / "09_fixed_gpus_playbook.ipynb"


def model_steps(b, s_min, e_min):
    """McCandlish et al.: S = S_min (1 + B_crit / B), B_crit = E_min / S_min."""
    return s_min * (1 + (e_min / s_min) / b)


# ---- the fit (pure) ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("s_min, e_min, batches", [(20.0, 400.0, (4, 16, 64)), (5.0, 3000.0, (2, 8, 32, 128, 512)),
                                                   (150.0, 150.0, (1, 2, 4))])
def test_fit_recovers_known_s_min_and_e_min(s_min, e_min, batches):
    steps = [model_steps(b, s_min, e_min) for b in batches]
    fit = pb.critical_batch_fit(steps, [b * s for b, s in zip(batches, steps)])
    assert math.isclose(fit["s_min"], s_min, rel_tol=1e-9) and math.isclose(fit["e_min"], e_min, rel_tol=1e-9)
    assert math.isclose(fit["b_crit"], e_min / s_min, rel_tol=1e-9)
    assert fit["rms_error"] < 1e-9
    # the fitted pair lies on the hyperbola (S/S_min - 1)(E/E_min - 1) = 1 at every batch
    for b in batches:
        s = fit["s_min"] + fit["e_min"] / b
        assert math.isclose((s / s_min - 1) * (b * s / e_min - 1), 1.0, rel_tol=1e-9)


def test_fit_recovers_b_crit_through_noise():
    rng = random.Random(1)
    batches = (2, 4, 8, 16, 32, 64, 128)
    steps = [model_steps(b, 30.0, 600.0) * math.exp(rng.gauss(0, 0.03)) for b in batches]
    fit = pb.critical_batch_fit(steps, [b * s for b, s in zip(batches, steps)])
    assert 15 < fit["b_crit"] < 25  # true 20


def test_fit_refuses_fewer_than_three_batch_sizes():
    with pytest.raises(ConfigError, match="at least three"):
        pb.critical_batch_fit([10.0, 5.0], [40.0, 80.0])
    with pytest.raises(ConfigError, match="at least three"):  # four points, but only two batch sizes
        pb.critical_batch_fit([10.0, 11.0, 5.0, 6.0], [40.0, 44.0, 80.0, 96.0])
    with pytest.raises(ConfigError):
        pb.critical_batch_fit([10.0, 5.0, -1.0], [40.0, 80.0, 10.0])
    with pytest.raises(ConfigError):
        pb.critical_batch_fit([10.0, 5.0, 2.0], [40.0, 80.0])


def test_fit_edges_say_the_runs_only_bound_b_crit():
    batches = (4, 16, 64)
    perfect = pb.critical_batch_fit([640 / b for b in batches], [640.0] * 3)  # steps fall like 1/B: E flat
    assert perfect["b_crit"] == math.inf and perfect["s_min"] == 0
    flat = pb.critical_batch_fit([10.0] * 3, [10.0 * b for b in batches])   # steps do not fall at all
    assert flat["b_crit"] == 0 and flat["e_min"] == 0
    assert pb.fit_verdict({**perfect, "ok": True, "target": 3.0, "batches": list(batches), "interval": None,
                           "per_batch": {b: (640 / b, 1e-3) for b in batches}}) == "beyond"
    assert pb.fit_verdict({**flat, "ok": True, "target": 3.0, "batches": list(batches), "interval": None,
                           "per_batch": {b: (10.0, 1e-3) for b in batches}}) == "below"


# ---- from loss curves to B_crit -----------------------------------------------------------------------------

def test_monotone_fit_and_steps_to_target():
    assert pb.monotone_fit([5, 4, 4.5, 3, 3.5, 2]) == [5, 4.25, 4.25, 3.25, 3.25, 2]
    assert pb.steps_to_target([5.0, 4.0, 3.0, 2.0], 3.5) == pytest.approx(1.5)  # losses[i]: after i updates
    assert pb.steps_to_target([5.0, 4.0], 3.0) is None
    assert pb.steps_to_target([2.0, 1.0], 3.0) == 0.0


def synthetic_curves(s_min, e_min, batches, lrs=(1e-3, 3e-3), noise=0.0, seed=0, target=3.0):
    """Loss curves that cross ``target`` after exactly S(B) updates at the best lr (the other lr is slower)."""
    rng = random.Random(seed)
    curves = {}
    for b in batches:
        for j, lr in enumerate(lrs):
            s = model_steps(b, s_min, e_min) * (1 + 0.5 * j)
            n = int(3 * s) + 2
            curves[b, lr] = [target + 0.02 * (s - i) + rng.gauss(0, noise) for i in range(n)]
    return curves


def test_estimate_recovers_b_crit_from_curves_and_brackets_it():
    curves = synthetic_curves(10.0, 200.0, (2, 8, 32, 128))
    est = pb.critical_batch_estimate(curves, 3.0, resamples=0)
    assert est["ok"] and est["batches"] == [2, 8, 32, 128]
    assert est["b_crit"] == pytest.approx(20.0, rel=1e-6)
    assert all(est["per_batch"][b][1] == 1e-3 for b in est["batches"])  # the lr that got there first
    noisy = pb.critical_batch_estimate(synthetic_curves(10.0, 200.0, (2, 8, 32, 128), noise=0.01), 3.0,
                                       resamples=200)
    lo, hi = noisy["interval"]
    assert lo <= 20.0 <= hi and lo < noisy["b_crit"] < hi


def test_estimate_refuses_two_batch_sizes_and_reports_an_unreached_target():
    with pytest.raises(ConfigError, match="at least three"):
        pb.critical_batch_estimate(synthetic_curves(10.0, 200.0, (4, 16)), 3.0)
    est = pb.critical_batch_estimate(synthetic_curves(10.0, 200.0, (4, 16, 64)), 1.0, resamples=0)
    assert not est["ok"] and est["missing"] == [16, 64] and list(est["per_batch"]) == [4]  # never got there
    assert est["verdict"] == "unreached" and pb.critical_batch_rows([est])[0]["b_crit"] is None


def test_targets_are_reached_by_every_batch():
    curves = synthetic_curves(10.0, 200.0, (4, 16, 64), noise=0.01)
    targets = pb.loss_targets(curves)
    assert targets == sorted(targets) and len(targets) == 3
    assert all(pb.critical_batch_estimate(curves, t, resamples=0)["ok"] for t in targets)


def test_rows_name_a_side_only_outside_the_interval_and_never_from_one_comparison():
    curves = synthetic_curves(10.0, 200.0, (2, 8, 32, 128), noise=0.01)
    est = pb.critical_batch_estimate(curves, 3.0, resamples=200)
    assert est["verdict"] == "fitted"
    sides = {r["batch"]: r["side"] for r in pb.batch_rows(est)}
    assert sides == {2: "below", 8: "below", 32: "above", 128: "above"}
    rows = pb.batch_rows(est)
    for a, b in zip(rows, rows[1:]):  # ÷ the updates × the data = the batch's factor
        assert b["fewer_updates"] * b["more_data"] == pytest.approx(b["batch"] / a["batch"])
    table = pb.critical_batch_rows([est])
    assert len(table) == 1 and float(table[0]["b_crit"]) == pytest.approx(est["b_crit"], rel=0.05)
    assert table[0]["target"] == 3.0 and table[0]["verdict"] == "fitted"
    fig = pb.critical_batch_chart([est])
    assert len(fig.axes) == 1


# ---- the bootstrap's noise: update-to-update noise, not the curve's fall (issue 23 review) -----------------

def steep_curves(s_min, e_min, batches, noise, seed, lrs=(1e-3, 3e-3), target=3.0, start=6.0, floor=2.0):
    """Exponentially falling loss curves (steep early, as a real run's) that cross ``target`` after S(B)
    updates at the best lr, plus independent noise of spread ``noise``."""
    rng = random.Random(seed)
    curves = {}
    for b in batches:
        for j, lr in enumerate(lrs):
            s = model_steps(b, s_min, e_min) * (1 + 0.5 * j)
            tau = s / math.log((start - floor) / (target - floor))
            curves[b, lr] = [floor + (start - floor) * math.exp(-i / tau) + rng.gauss(0, noise)
                             for i in range(int(2 * s) + 4)]
    return curves


def rms(values):
    return math.sqrt(sum(v * v for v in values) / len(values))


@pytest.mark.parametrize("tau", [3.0, 4.0, 8.0])
def test_run_noise_is_the_noise_not_the_curves_fall(tau):
    """A 24-update curve falling steeply (centred first differences / sqrt(2) read about 0.17 here, for a true
    0.02): the estimate is within 30 % of the true spread (median of ten seeds: one curve's 21 residuals vary
    by about 15 % on their own) and no single seed is off by half."""
    true = 0.02
    est = []
    for seed in range(10):
        rng = random.Random(seed)
        est.append(rms(pb.run_noise([2 + 4 * math.exp(-i / tau) + rng.gauss(0, true) for i in range(24)])))
    assert abs(sorted(est)[5] / true - 1) <= 0.3, est
    assert all(0.5 * true <= e <= 1.5 * true for e in est), est
    assert pb.run_noise([1.0, 0.5]) == [0.0] == pb.run_noise([1.0])  # too short: no noise to read


def test_bootstrap_interval_covers_the_true_b_crit_on_steep_noisy_curves():
    """The 95 % interval, estimated with the right noise, still covers the true B_crit (20) in at least 90 % of
    thirty independent sweeps of steep curves -- without the doubled width the first differences gave."""
    hits = 0
    for seed in range(30):
        est = pb.critical_batch_estimate(steep_curves(10.0, 200.0, (2, 8, 32), 0.02, seed), 3.0, resamples=100,
                                         seed=seed)
        lo, hi = est["interval"]
        hits += lo <= 20.0 <= hi
    assert hits >= 27, hits


@pytest.mark.parametrize("interval, shape", [
    ((5.0, 20.0), "factor"), ((5.0, math.inf), "open_above"), ((0.0, 20.0), "open_below"),
    ((0.0, math.inf), "unbounded"), ((math.inf, math.inf), "all_beyond"), ((0.0, 0.0), "all_below"), (None, "none"),
])
def test_the_shape_of_an_interval_never_gives_a_factor_of_infinity(interval, shape):
    got = pb.interval_shape(interval)
    assert got["shape"] == shape
    assert (got["factor"] == 4.0) if shape == "factor" else got["factor"] is None


def test_the_critical_batch_cells_word_every_verdict_the_playbook_returns():
    verdict = cells()[tagged("measure-09-critical-batch")[0] + 1].source
    for key in ("fitted", "beyond", "below", "not_falling", "unreached"):
        assert key + "=" in verdict, key
    caveat = cells()[tagged("measure-09-critical-batch")[0] + 2].source
    for key in ("factor", "open_above", "open_below", "unbounded", "all_beyond", "all_below", "none"):
        assert key + "=" in caveat, key


def test_the_what_if_cell_says_its_casts_are_cpu_autocasts():
    """Issue 23 review: the GPU prediction is traced under CPU autocast, so the extra bf16 operations are CPU
    autocast's casts; CUDA's cast lists differ. The chapter (the markdown above the tiny model's cell) and
    predict's assumptions say so."""
    i = tagged("measure-09-whatif-gpus")[0]
    words = " ".join(" ".join(c.source for c in cells()[i:i + 3]).split())
    assert "pb.launch_bound(" in words
    assert "the casts as CPU autocast inserts them" in words and "CUDA autocast's cast lists differ" in words
    p = lk.predict(lk.Config(model="tiny", micro_batch=2, precision="bf16"), device="h100-sxm")
    assert "CUDA autocast's cast lists differ" in p.assumptions["op_trace"]


# ---- the chapter -------------------------------------------------------------------------------------------

def cells():
    return nbformat.read(str(NB), as_version=4).cells


def tagged(tag):
    return [i for i, c in enumerate(cells()) if tag in c.metadata.get("tags", [])]


def names(source, ctx):
    """The names a cell reads (ast.Load) or binds at its top level (ast.Store): a comprehension's or a
    function's own variables are its own, not the notebook's."""
    found = set()

    def visit(node, top=True):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ctx) and (top or ctx is ast.Load):
            found.add(node.id)
        if isinstance(node, (ast.FunctionDef, ast.Lambda)) and ctx is ast.Store:
            if isinstance(node, ast.FunctionDef):
                found.add(node.name)
            return
        inner = isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp))
        for child in ast.iter_child_nodes(node):
            visit(child, top and not inner)

    visit(ast.parse(source))
    return found


def test_what_if_cells_leave_the_exercises_names_alone():
    """Issue 24.1: the what-if cell reassigned rows, base and table, so every exercise re-run after Run All
    saw the wrong grid. No cell after the first exercise may rebind a name an exercise (or the cell that
    checks it) reads, unless it is the exercise itself."""
    cs = cells()
    ex = [i for i, c in enumerate(cs) if any(t.startswith("exercise-09-") for t in c.metadata.get("tags", []))]
    read = set()
    for i in ex:
        read |= names(cs[i].source, ast.Load)
        if i + 1 < len(cs) and cs[i + 1].cell_type == "code":
            read |= names(cs[i + 1].source, ast.Load)
    owned = {n for i in ex for n in names(cs[i].source, ast.Store)}
    for i, c in enumerate(cs):
        if c.cell_type != "code" or i <= ex[0] or i in ex:
            continue
        clash = (names(c.source, ast.Store) & read) - owned
        clash -= {n for j in ex if j > i for n in names(cs[j].source, ast.Store)}
        # cells between exercises may define what a later exercise reads; after the last exercise none may
        if i > ex[-1] + 1:
            assert not clash, f"cell {c.id} rebinds {sorted(clash)}, which an exercise reads"
    whatif = "\n".join(cs[i].source for i in tagged("measure-09-whatif") + tagged("measure-09-whatif-gpus"))
    assert not names(whatif, ast.Store) & {"rows", "base", "table", "front", "budget", "target", "best_fit"}


def test_prose_is_markdown_not_print():
    """Issue 24.3/24.4: printed prose wraps mid-word and shows markdown raw; the chapter says it instead."""
    # the generated set-up cell (tests/test_hosting.py) prints where labkit cannot be imported: not the chapter's prose
    code = [c.source for c in cells() if c.cell_type == "code" and c.get("id") != SETUP_ID]
    assert not any(re.search(r"\bprint\(", s) for s in code), "chapter 09 prints prose: use lk.course.say"
    assert any('lk.course.reference_points("grid")' in s for s in code)  # the reference line, said once


def test_reveals_come_after_their_exercises():
    """Issue 24.13: the grid table (its first 'yes' row is the budget answer), the circled best point and the
    13 B remedy chart (the which-fix answer) appear only after the exercises that ask for them."""
    cs = cells()
    budget, fix = tagged("exercise-09-budget")[0], tagged("exercise-09-which-fix")[0]
    src = [c.source if c.cell_type == "code" else "" for c in cs]
    assert all("pb.table_rows(" not in s for s in src[:budget]) and any("pb.table_rows(" in s for s in src[budget:])
    before = [s for s in src[:budget] if "pareto_chart(" in s]
    assert before and all("mark_best=False" in s for s in before)
    assert all("remedy_chart(" not in s and "smallest_fix(" not in s for s in src[:fix])
    assert any("remedy_chart(" in s and "smallest_fix(" in s for s in src[fix + 1:])


def test_batch_size_cells_estimate_b_crit_and_never_read_it_off_one_comparison():
    text = "\n".join(c.source for c in cells())
    assert "above the critical batch size" not in text.lower().replace("\n", " ")
    crit = cells()[tagged("measure-09-critical-batch")[0]].source
    assert "critical_batch_estimate(" in crit and "loss_targets(" in crit and "critical_batch_chart(" in crit
    assert tagged("measure-09-critical-batch")[0] > tagged("measure-09-lr-batch")[0]


def test_what_if_headline_uses_a_model_where_gpus_differ():
    """Issue 24.9: the tiny model is launch-bound (an H100 predicts about a T4); the headline uses a preset big
    enough for the GPUs to differ, and the tiny case comes with its reason."""
    src = cells()[tagged("measure-09-whatif-gpus")[0]].source
    tiny = cells()[tagged("measure-09-whatif-gpus")[0] + 2].source
    assert 'model="base"' in src and "overhead" in tiny and "overhead_s" in inspect.getsource(pb.launch_bound)
    big = lk.Config(model="base", micro_batch=8, steps=3, threads=1)
    t4, h100 = (lk.predict(big, device=g).step_time_s for g in ("t4", "h100-sxm"))
    assert t4 > 2 * h100  # at this size the prediction does tell the GPUs apart


# ---- issue 25.11: impossible numbers are refused before any work -------------------------------------------

@pytest.mark.parametrize("call", [
    lambda: pb.zero_bytes_per_gpu(-1e9, 8, 0), lambda: pb.zero_bytes_per_gpu(float("nan"), 8, 0),
    lambda: pb.zero_bytes_per_gpu(1e9, 0, 0), lambda: pb.zero_bytes_per_gpu(1e9, 2.5, 0),
    lambda: pb.zero_bytes_per_gpu(1e9, True, 0), lambda: pb.zero_bytes_per_gpu(1e9, 8, 4),
    lambda: pb.zero_bytes_per_gpu("7e9", 8, 0), lambda: pb.state_bytes_per_gpu(1e9, 8, 0, "lion"),
    lambda: pb.state_bytes_per_gpu(1e9, 8, 0, offload_params="yes"),
    lambda: pb.activation_bytes_estimate(0, 4096, 32, 4096, 1),
    lambda: pb.activation_bytes_estimate(32, 4096, 32, 4096, -1),
    lambda: pb.activation_bytes_estimate(32, 4096, 32, 4096, 1, checkpointing="some"),
    lambda: pb.remedies(13e9, 8, -80e9), lambda: pb.remedies(13e9, 8, 80e9, activation_bytes=float("inf")),
    lambda: pb.smallest_fix(13e9, 8, 0), lambda: pb.grid(micro_batch=(0, 2)), lambda: pb.grid(precision=("fp64",)),
    lambda: pb.grid(micro_batch="48"), lambda: pb.grid(effective_batch=0), lambda: pb.grid(workers=(-1,)),
    lambda: pb.best_within([], float("nan")), lambda: pb.table_rows([], -1), lambda: pb.pareto_front("rows"),
    lambda: pb.final_loss(lk.Result(lk.Config(model="tiny"), {}, [dict(update=1, loss=1.0)]), last=0),
    lambda: pb.tokens_seen(None), lambda: pb.fsdp_demo(world_size=1), lambda: pb.fsdp_demo(model="huge"),
    lambda: pb.fsdp_demo(steps=0), lambda: pb.fsdp_demo(timeout_s=float("nan")),
    lambda: pb.within_scatter([], {}, -0.1),
])
def test_public_functions_refuse_impossible_arguments(call):
    with pytest.raises(ConfigError) as e:
        call()
    assert "is not allowed" in str(e.value)


def test_grid_search_refuses_before_the_first_run():
    ran = []

    def fake(config):
        ran.append(config)
        raise AssertionError("must not run")

    pts = pb.grid(precision=("fp32",), micro_batch=(1, 2), checkpointing=("none",), effective_batch=2)
    for kw in (dict(repeats=0), dict(repeats=1.5), dict(on_point="print"), dict(progress="no")):
        with pytest.raises(ConfigError):
            pb.grid_search(dict(model="tiny", steps=2), pts, run_fn=fake, **kw)
    with pytest.raises(ConfigError):  # a bad knob in the last point: refused before the first point ran
        pb.grid_search(dict(model="tiny", steps=2), pts + [dict(micro_batch=-3)], run_fn=fake, progress=False)
    assert ran == []


# ---- chapter 09 in Chromium (learner's pass) ---------------------------------------------------------------

def test_the_pick_cell_shows_no_answer_before_an_attempt():
    """With my_pick = None the cell neither runs the grid's best nor names it: only the checker speaks."""
    src = cells()[tagged("measure-09-pick")[0]].source
    assert "best_fit" not in src and "lk.check.budget_challenge(pick_run," in src
    tree = ast.parse(src)
    guarded = [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test) == "chosen"]
    assert guarded and "lab.run(" in ast.unparse(guarded[0]) and "lk.course.table(" in ast.unparse(guarded[0])
    assert "lab.run(" not in ast.unparse([n for n in tree.body if n not in guarded])
    for tag in ("measure-09-budget-cap", "measure-09-workers"):  # the cells after it work without a pick
        assert "pick_run is None" in cells()[tagged(tag)[0]].source or "pick_run is not None" in \
            cells()[tagged(tag)[0]].source


def test_fsdp_and_what_if_cells_show_plain_numbers():
    """The FSDP losses' difference and the predicted times are shown as plain digits, never e-notation."""
    demo = {"ok": True, "losses": [5.0, 4.9], "seconds": 3.0}
    rows = pb.loss_rows(demo, [5.0, 4.9000004])
    fsdp = cells()[tagged("measure-09-fsdp")[0]].source
    assert '("diff", "difference", lambda v: lk.course.number(v, 2))' in fsdp  # the chapter's column
    md = lk.course.table(rows, [("diff", "difference", lambda v: lk.course.number(v, 2))])._repr_markdown_()
    assert max(r["diff"] for r in rows) > 0 and "e-0" not in md and "0.0000004" in md
    assert max(r["diff"] for r in pb.loss_rows(demo, [5.0, 4.9])) == 0
    whatif = cells()[tagged("measure-09-whatif-gpus")[0]].source
    assert "pb.predicted_ms(" in whatif and "fixed_digits(v)" in inspect.getsource(pb.predicted_table)


@pytest.mark.parametrize("threads, words", [(1, "a probe at 1 thread ran"), (2, "a probe at 2 threads ran")])
def test_the_load_caveat_says_threads_in_proper_plurals(threads, words):
    from labkit.whatif import report as predict

    text = predict._caveat({"under_load": {"fp32 matmul peak": 1.5}, "threads": threads})
    assert words in text and "(s)" not in text


# ---- issue 46, second learner's pass -----------------------------------------------------------------------

def _run_cell(tag_or_id, offset=0, **names):
    """Run one chapter cell with the given names; returns what it said (lk.course.say, through explain)."""
    from labkit.base import page

    cs = cells()
    i = tagged(tag_or_id)[0] if tagged(tag_or_id) else [j for j, c in enumerate(cs) if c.get("id") == tag_or_id][0]
    said, real = [], page.say
    page.say = said.append
    try:
        exec(cs[i + offset].source, {"lk": lk, "pb": pb, **names})
    finally:
        page.say = real
    return said


def test_the_zero_table_comes_after_the_exercise_that_asks_for_its_arithmetic():
    """Issue 46.15: the table of GB per GPU under each ZeRO stage sat above my_zero_bytes (its numbers give the
    formula away); it comes after that exercise and before the which-fix exercise that reads it."""
    zero, fix = tagged("exercise-09-zero")[0], tagged("exercise-09-which-fix")[0]
    arithmetic = tagged("measure-09-memory-arithmetic")[0]
    assert zero < arithmetic < fix


def _estimate(target, verdict):
    return {"ok": True, "target": target, "verdict": verdict, "batches": [4, 16, 64], "interval": None,
            "per_batch": {4: (10.0, 1e-3), 16: (12.0, 1e-3), 64: (11.0, 1e-3)}}


def test_a_not_meaningful_row_of_the_critical_batch_rows_is_explained():
    """Issue 46.18: a row below the first whose B_crit was 'not meaningful' stood in the table with no word."""
    odd = _run_cell("measure-09-critical-batch", 3, crit=[_estimate(3.0, "fitted"), _estimate(3.3, "not_falling")])
    assert any("3.300" in s for s in odd)
    plain = _run_cell("measure-09-critical-batch", 3, crit=[_estimate(3.0, "fitted"), _estimate(3.3, "below")])
    assert not any("3.300" in s for s in plain)


class _Compared:
    ratio, low, high, label_a, label_b = 1.6, 1.2, 2.5, "baseline", "the pick"

    def __init__(self, decided, better):
        self.decided, self.better = decided, better


def test_a_measured_speed_up_is_not_called_uncertain_by_the_next_sentence():
    """The pick fits where the baseline does not: when the comparison measured it faster, the memory sentence
    is another variant than when it could not tell (which says memory is what the search bought for certain)."""
    over_budget = type("P", (), {"memory_of": staticmethod(lambda s: (2, "counted"))})
    said = {case: _run_cell("search-verdict-09", cmp_best=_Compared(*case), s={}, budget=1, pb=over_budget)
            for case in ((True, "b"), (False, None))}
    assert all(len(s) == 2 for s in said.values())
    assert said[True, "b"][1] != said[False, None][1]
