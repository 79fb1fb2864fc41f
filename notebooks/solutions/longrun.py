"""Reference solutions for chapter 11 (a long run on a fixed number of GPUs). For instructors: not imported
by the notebook.

Each name matches the placeholder the learner fills in; tests/test_check_capstone.py checks that the checkers
accept these and reject the usual wrong answers.
"""
import math


def my_resume_needs(setup):
    """exercise-11-resume-needs: the smallest set of items for a bit-exact resume of this set-up."""
    items = {"model", "loader"}  # the weights, and where the data stream is (shuffled or not)
    if setup["optimizer"] != "sgd" or setup["schedule"] != "constant":
        items.add("optimizer")  # moments/momentum; and the param_groups' learning rate the scheduler last set
    if setup["schedule"] != "constant":
        items.add("scheduler")  # its step count
    if setup["precision"] == "fp16":
        items.add("scaler")  # the loss scale and its growth tracker; bf16 and fp32 need no scaling
    if setup["dropout"] > 0:
        items.add("rng")  # the masks come from the generators (the sampler has its own, in the loader's state)
    return items


def my_interval(save_s, mtbf_s):
    """exercise-11-young-daly: Young's first-order optimum, the save cost C/tau equal to the lost work tau/2M."""
    return math.sqrt(2 * save_s * mtbf_s)


def my_lost_work(fail_at_s, interval_s, restart_s):
    """exercise-11-lost-work: the work since the last checkpoint is redone; the restart comes on top."""
    return fail_at_s % interval_s + restart_s


# exercise-11-inexact-resume: a repeated batch is the loader; another loss on the same batch and rate is dropout's
# generators; a warm-up rate from the second update is the scheduler; a sign-like first step is Adam's empty
# moments; a scale of 65,536 is a fresh GradScaler
my_missing = {"A": "loader", "B": "rng", "C": "scheduler", "D": "optimizer", "E": "scaler"}
