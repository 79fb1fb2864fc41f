"""Which reference solution answers which exercise: one table for every tool that fills the exercises in.

``ANSWERS`` says, for each exercise cell (tagged ``exercise-NN-name``), which placeholder in it takes which
answer -- a Python expression evaluated in the chapter's kernel after the cells before it. ``sol.<family>`` is
``notebooks/solutions/<family>.py`` (``FAMILIES``); every other name is the chapter's own state, exactly what a
learner's answer would see. Read by tests/test_rerun_exercises.py (every exercise passes again after Run All)
and by ``labkit.content.assignments`` (the graded builds: the solution cells). ``WRONG``, in the same form, holds
one typical wrong answer per exercise -- the mistake its checker's hint names, ``sol.wrong`` where an expression
cannot say it -- for the graded builds' tests (a wrong answer must score 0, with the hint as its feedback). The
solutions are instructors' files: they are in a checkout, not in an installed labkit (``solutions_dir``).
"""
from __future__ import annotations

from pathlib import Path

from . import coursefiles

__all__ = ["ANSWERS", "WRONG", "FAMILIES", "solutions_dir"]

FAMILIES = ("basics", "precision", "accumulation", "profiling", "scaling", "ddp", "practice", "capstone", "parallel",
            "longrun", "wrong")

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
}

# {exercise tag: {placeholder: a typical wrong answer}}: for each exercise, the mistake its checker's own hint names
# (quoted in the comment), in ANSWERS' form. ``sol.wrong`` (notebooks/solutions/wrong.py) holds the mistakes an
# expression cannot say. The graded builds' tests grade these: each must score 0 with the checker's hint as feedback.
WRONG = {
    # "AdamW keeps *two* fp32 moments per parameter"
    "exercise-00-state-bytes": {"training_state_bytes": "lambda n_params, optimizer: 12 * n_params"},
    # "20 is the count when gradients are also accumulated in fp32"
    "exercise-00-bytes-per-param": {"bytes_per_param": "20"},
    "exercise-00-llm-memory": {"llm_gb": "13e9 * 20 / 1e9"},
    # "that is the forward pass only"
    "exercise-01-linear-flops": {"linear_flops": "lambda tokens, d_in, d_out: 2 * tokens * d_in * d_out"},
    # "you divided by the 2:4-sparse peak"
    "exercise-01-mfu": {"my_mfu": "6 * 1.3e9 * 240_000 / (8 * 1979e12)"},
    # "you picked the *smallest* part"
    "exercise-01-bottleneck": {
        "bottleneck": "lambda breakdown: min(breakdown, key=breakdown.get).split('_')[0]"},
    # "accum alone changes how many micro-batches make one update, not their size"
    "exercise-01-low-mfu": {"my_run": "lk.run(suspect_cfg.replace(accum=1))"},
    # "values that were already exactly 0 do not flush"
    "exercise-02-flush": {"flush_fraction": "lambda g: (g.half() == 0).float().mean().item()"},
    # "after an overflow ... the count of good steps starts again from 0"
    "exercise-02-loss-scaler": {"MyLossScaler": "sol.wrong.ScalerKeepsCount"},
    # "the *last* micro-batch's backward must run outside no_sync()"
    "exercise-02-find-the-bug": {"train_update": "sol.wrong.update_never_syncs"},
    # "would be right on one GPU"
    "exercise-03-accum-steps": {"K_needed": "524_288 // (4 * 2048)"},
    # "1/K is right only when every micro-batch holds the same number of tokens"
    "exercise-03-token-weights": {"token_weights": "lambda token_counts: [1 / len(token_counts)] * len(token_counts)"},
    # "zero_grad() inside the micro-batch loop wipes what the earlier ones accumulated"
    "exercise-03-accumulation-loop": {"accumulate_update": "sol.wrong.update_zeroes_inside"},
    # "the textbook estimate (every block's whole forward runs twice)"
    "exercise-04-predict-overhead": {
        "my_flops_ratio": "sol.wrong.textbook_overhead(cfg.spec.n_layer, cfg.spec.d_model, cfg.spec.seq_len)"},
    # "the block's inner activations are still saved"
    "exercise-04-wrap-blocks": {"run_block": "lambda block, x: block(x)"},
    # "it recomputes more than needed"
    "exercise-04-budget-pick": {"my_pick": "sol.wrong.least_memory_option(table, budget)"},
    # "that is the mean of per-update fractions"
    "exercise-05-wait-fraction": {
        "my_wait_fraction": "lambda records: sum(r['data_wait_s'] / r['step_time_s'] for r in records) / len(records)"},
    # "These are seconds; give milliseconds."
    "exercise-05-loader-reading": {"read_loader": "sol.wrong.read_loader_in_seconds"},
    # "the two overlap, so the step takes the longer of the two, not their sum"
    "exercise-05-ideal-step": {
        "ideal_step_s": "lambda data_s, compute_s, workers: data_s + compute_s if workers == 0 else "
                        "data_s / workers + compute_s"},
    # "the cost is per *sample*"
    "exercise-05-fewest-workers": {"fewest_workers": "sol.wrong.workers_for_one_sample"},
    # "that counts elements, not bytes"
    "exercise-06-counting-hook": {"my_hook": "sol.wrong.hook_counts_elements"},
    # "every_micro synchronises after each of the K micro-batches, not once per update"
    "exercise-06-predict-calls": {"my_calls": "n_buckets"},
    # "DDP synchronised after every micro-batch"
    "exercise-06-fix-no-sync": {"accumulate": "sol.wrong.no_sync_around_backward"},
    # "each GPU sends 2·(N-1)/N of the bytes, not 2×"
    "exercise-06-ring-formula": {
        "ring_time": "lambda nbytes, n, bandwidth, latency: 0.0 if n <= 1 else 2 * nbytes / bandwidth + "
                     "2 * (n - 1) * latency"},
    # "that rounds down"
    "exercise-07-pad-vocab": {"pad_vocab": "lambda n, multiple=64: n // multiple * multiple"},
    # "round up to whole updates"
    "exercise-07-breakeven": {"breakeven_steps": "sol.wrong.breakeven_unrounded"},
    # "your share is the rest of the step"
    "exercise-07-read-profile": {"my_top_op": "sol.practice.read_profile_text(table.text, table.phases)[0]",
                                 "my_optimizer_share":
                                     "1 - sol.practice.read_profile_text(table.text, table.phases)[1]"},
    # "Under the math backend the T×T attention probabilities are stored too"
    "exercise-08-activation-formula": {
        "activation_bytes_formula": "lambda n_layer, d_model, n_head, seq_len, batch, attention: "
                                    "n_layer * batch * seq_len * (16 * d_model + n_head + 4) * 4"},
    # "that is the whole training state ... Only AdamW's part is new at update 2"
    "exercise-08-step2": {"my_extra_bytes": "16 * n_params"},
    # "18 is the count when backward adds straight into the fp32 buffer"
    "exercise-08-bytes-per-param": {"my_bytes_per_param": "18"},
    # "AdamW's two moments (8 bytes per parameter) are missing"
    "exercise-08-budget": {"my_budget": "sol.wrong.budget_without_adam"},
    # "faster than EVERY cheaper point (keep a running maximum), not just faster than its neighbour"
    "exercise-09-pareto": {"my_pareto_front": "sol.wrong.front_by_neighbour"},
    # "That is the fastest configuration overall -- but the budget rules it out"
    "exercise-09-budget": {"my_pick": "sol.wrong.fastest_overall(rows, budget)"},
    # "Only stage 3 shards everything"
    "exercise-09-zero": {"my_zero_bytes": "lambda n_params, n_gpus, stage: 16 * n_params / n_gpus if stage else "
                                          "16 * n_params"},
    # "a less intrusive option fits too"
    "exercise-09-which-fix": {"my_fix": "'zero3'"},
    # "you counted the forward pass only"
    "exercise-10-tp-allreduces": {
        "my_tp_allreduces": "lambda n_layer, micro_batches, qkv: 2 * n_layer * micro_batches"},
    # "that is (p − 1)/m, Megatron-LM's bubble relative to the ideal"
    "exercise-10-bubble": {"my_bubble": "lambda p, m: (p - 1) / m"},
    # "you divided everything by dp × tp × pp"
    "exercise-10-layout-bytes": {"my_layout_bytes": "lambda n_params, dp, tp, pp, zero_stage: 16 * n_params / "
                                                    "(dp * tp * pp)"},
    # FSDP alone: "no ZeRO stage shards activations" (the layout model says it does not fit)
    "exercise-10-layout-fits": {"my_layout": "dict(dp=64, tp=1, pp=1, zero_stage=3)"},
    # "you save everything: safe, but the exercise asks for the smallest set"
    "exercise-11-resume-needs": {
        "my_resume_needs": "lambda setup: {'model', 'optimizer', 'scheduler', 'scaler', 'rng', 'loader'}"},
    # logs A and B swapped: "without the loader's position the data stream starts again"
    "exercise-11-inexact-resume": {
        "my_missing": "{'A': 'rng', 'B': 'loader', 'C': 'scheduler', 'D': 'optimizer', 'E': 'scaler'}"},
    # "that is √(C · M): ... you left out the 2"
    "exercise-11-young-daly": {"my_interval": "lambda save_s, mtbf_s: (save_s * mtbf_s) ** 0.5"},
    # "you left out the restart"
    "exercise-11-lost-work": {"my_lost_work": "lambda fail_at_s, interval_s, restart_s: fail_at_s % interval_s"},
}



def solutions_dir() -> Path:
    """notebooks/solutions/ of the checkout (an installed labkit carries no solutions: they are not for learners)."""
    folder = coursefiles.source_root() / "notebooks" / "solutions"
    if not folder.is_dir():
        raise FileNotFoundError(f"no reference solutions in {folder.parent}: the graded builds need a checkout of "
                                "labkit (git clone), where notebooks/solutions/ holds them")
    return folder
