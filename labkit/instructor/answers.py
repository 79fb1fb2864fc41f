"""Which reference solution answers which exercise: one table for every tool that fills the exercises in.

``ANSWERS`` says, for each exercise cell (tagged ``exercise-NN-name``), which placeholder in it takes which
answer -- a Python expression evaluated in the chapter's kernel after the cells before it. ``sol.<family>`` is
``notebooks/solutions/<family>.py`` (``FAMILIES``); every other name is the chapter's own state, exactly what a
learner's answer would see. Read by tests/test_rerun_exercises.py (every exercise passes again after Run All)
and by ``labkit.instructor.assignments`` (the graded builds: the solution cells). ``WRONG``, in the same form, holds
one typical wrong answer per exercise -- the mistake its checker's hint names, ``sol.wrong`` where an expression
cannot say it -- for the graded builds' tests (a wrong answer must score 0, with the hint as its feedback). The
solutions are instructors' files: they are in a checkout, not in an installed labkit (``solutions_dir``).
"""
from __future__ import annotations

from pathlib import Path

from ..content import pages

__all__ = ["ANSWERS", "WRONG", "FAMILIES", "solutions_dir"]

FAMILIES = ("basics", "precision", "accumulation", "profiling", "scaling", "ddp", "practice", "capstone", "parallel",
            "longrun", "compose", "experts", "wrong")

# {exercise tag: {placeholder name in the cell: the answer, a Python expression in the chapter's kernel}}.
ANSWERS = {
    "exercise-00-state-bytes": {"training_state_bytes": "sol.basics.training_state_bytes"},
    "exercise-00-bytes-per-param": {"bytes_per_param": "sol.basics.bytes_per_param"},
    "exercise-00-llm-memory": {"llm_gb": "sol.basics.llm_gb"},
    "exercise-01-linear-flops": {"linear_flops": "sol.basics.linear_flops"},
    "exercise-01-mfu": {"my_mfu": "sol.basics.my_mfu"},
    "exercise-01-bottleneck": {"bottleneck": "sol.basics.bottleneck"},
    "exercise-01-low-mfu": {"my_run": "lk.run(sol.profiling.fixed_config(suspect_cfg))"},
    "exercise-02-flush": {"flush_fraction": "sol.precision.flush_fraction"},
    "exercise-02-loss-scaler": {"MyLossScaler": "sol.precision.MyLossScaler"},
    "exercise-02-find-the-bug": {"train_update": "sol.precision.train_update"},
    "exercise-03-accum-steps": {"K_needed": "sol.accumulation.K_needed"},
    "exercise-03-token-weights": {"token_weights": "sol.accumulation.token_weights"},
    "exercise-03-accumulation-loop": {"accumulate_update": "sol.accumulation.accumulate_update"},
    "exercise-04-predict-overhead": {
        "my_flops_ratio": "sol.scaling.predicted_overhead(cfg.spec.n_layer, cfg.spec.d_model, cfg.spec.seq_len)"},
    "exercise-04-wrap-blocks": {"run_block": "sol.scaling.run_block"},
    "exercise-04-budget-pick": {"my_pick": "sol.scaling.pick_option(table, budget)"},
    "exercise-05-wait-fraction": {"my_wait_fraction": "sol.scaling.wait_fraction"},
    "exercise-05-loader-reading": {"read_loader": "sol.profiling.read_loader"},
    "exercise-05-ideal-step": {"ideal_step_s": "sol.scaling.ideal_step_s"},
    "exercise-05-fewest-workers": {"fewest_workers": "sol.scaling.fewest_workers"},
    "exercise-06-counting-hook": {"my_hook": "sol.ddp.count_and_average"},
    "exercise-06-predict-calls": {"my_calls": "sol.ddp.calls(n_buckets, 8, 'every_micro')"},
    "exercise-06-fix-no-sync": {"accumulate": "sol.ddp.accumulate"},
    "exercise-06-ring-formula": {"ring_time": "sol.ddp.ring_time"},
    "exercise-07-pad-vocab": {"pad_vocab": "sol.practice.pad_vocab"},
    "exercise-07-breakeven": {"breakeven_steps": "sol.practice.breakeven_steps"},
    "exercise-07-read-profile": {"my_top_op": "sol.practice.read_profile_text(table.text, table.phases)[0]",
                                 "my_optimizer_share": "sol.practice.read_profile_text(table.text, table.phases)[1]"},
    "exercise-08-activation-formula": {"activation_bytes_formula": "sol.practice.activation_bytes_formula"},
    "exercise-08-step2": {"my_extra_bytes": "sol.practice.step2_extra(n_params)"},
    "exercise-08-bytes-per-param": {"my_bytes_per_param": "sol.practice.bytes_fp32_accum"},
    "exercise-08-budget": {"my_budget": "sol.practice.my_budget"},
    "exercise-09-pareto": {"my_pareto_front": "sol.capstone.my_pareto_front"},
    "exercise-09-budget": {"my_pick": "sol.capstone.my_pick(rows, budget)"},
    "exercise-09-zero": {"my_zero_bytes": "sol.capstone.my_zero_bytes"},
    "exercise-09-which-fix": {"my_fix": "sol.capstone.my_fix"},
    "exercise-10-tp-allreduces": {"my_tp_allreduces": "sol.parallel.my_tp_allreduces"},
    "exercise-10-bubble": {"my_bubble": "sol.parallel.my_bubble"},
    "exercise-10-layout-bytes": {"my_layout_bytes": "sol.parallel.my_layout_bytes"},
    "exercise-10-layout-fits": {"my_layout": "sol.parallel.my_layout"},
    "exercise-11-resume-needs": {"my_resume_needs": "sol.longrun.my_resume_needs"},
    "exercise-11-inexact-resume": {"my_missing": "sol.longrun.my_missing"},
    "exercise-11-young-daly": {"my_interval": "sol.longrun.my_interval"},
    "exercise-11-lost-work": {"my_lost_work": "sol.longrun.my_lost_work"},
    "exercise-12-sp-collectives": {"my_sp_collectives": "sol.compose.my_sp_collectives"},
    "exercise-12-capacity": {"my_expert_capacity": "sol.compose.my_expert_capacity"},
    "exercise-12-interleaved-bubble": {"my_interleaved_bubble": "sol.compose.my_interleaved_bubble"},
    "exercise-12-moe-layout": {"my_moe_layout": "sol.experts.my_moe_layout"},
}

# {exercise tag: {placeholder: a typical wrong answer}}: for each exercise, the mistake its checker's own hint names,
# in ANSWERS' form -- templates/wrong-answers.md, the hint quoted beside each. ``sol.wrong``
# (notebooks/solutions/wrong.py) holds the mistakes an expression cannot say. The graded builds' tests grade these:
# each must score 0 with the checker's hint as feedback.
WRONG = {tag: dict(line.split(" = ", 1) for line in code.splitlines())
         for tag, code in pages.sections("wrong-answers.md").items()}


def solutions_dir() -> Path:
    """notebooks/solutions/ of the checkout (an installed labkit carries no solutions: they are not for learners)."""
    folder = pages.source_root() / "notebooks" / "solutions"
    if not folder.is_dir():
        raise FileNotFoundError(f"no reference solutions in {folder.parent}: the graded builds need a checkout of "
                                "labkit (git clone), where notebooks/solutions/ holds them")
    return folder
