# %% [markdown]
# ## Pipeline parallelism: the bubble, measured
#
# Pipeline parallelism cuts the model by depth: stage 0 holds the first blocks, stage 1 the next,
# and each stage is its own process (its own GPU at work). A batch is cut into m micro-batches so
# that the stages can work at the same time on different ones. They cannot all be busy all the
# time: the first forward reaches the last stage only after p − 1 stages, and the last backward
# reaches the first stage p − 1 steps late. That idle time is the **bubble**. Below, the `tiny` GPT
# runs as a 2-stage pipeline on real processes, under two schedules, and every stage's idle time is
# read off timestamps.

# %% [markdown]
# ### Two schedules, as data
#
# A schedule is just the ordered list of actions each stage runs: ("F", i) is the forward of micro-
# batch i, ("B", i) its backward. **GPipe** runs all forwards, then all backwards. **1F1B** lets
# stage s run p − s − 1 forwards to fill the pipeline, then alternates one forward with one
# backward, then finishes the backwards it still owes — so it never holds more than p − s micro-
# batches.

# %% tags=["code-10-schedules"]
lk.course.show(par.gpipe_schedule, par.one_f_one_b_schedule)

# %%
# The lists for p = 2 stages and m = 4 micro-batches, and the micro-batches each stage holds at most
for name in ("gpipe", "1f1b"):
    sched = par.schedule_for(name, 2, 4)
    for s, actions in enumerate(sched):
        print(f"{name:5} stage {s}: " + " ".join(f"{k}{i}" for k, i in actions))
    print(f"{name:5} micro-batches in flight at the peak, per stage: {par.in_flight(sched)}")

# %% [markdown]
# Each stage of the demo runs its list with the loop below: it receives its input from the stage
# before (`dist.recv`), computes, and passes the result on (`dist.isend`: a blocking send could
# wait for a neighbour that is itself sending). The last stage computes the loss, divided by m so
# that the gradients accumulated over the m micro-batches are the whole batch's. Every action
# records when it started, when its input had arrived and when it ended. The tied embedding
# (`head.weight = wte.weight`) lives on two stages: each holds a copy, and their gradients are
# summed between the first and last stage after the backward pass, as Megatron-LM does, so every
# gradient equals the unsplit model's.

# %% tags=["code-10-pipeline-stage"]
lk.course.show(par.run_schedule)

# %% [markdown]
# **The bubble, defined.** For one stage, *busy* is the time spent computing forwards and
# backwards; everything else in the step — waiting for a neighbour, posting sends — is *idle*. The
# step runs from the first action's start on any stage to the last action's end. With p stages of
# equal cost and m micro-batches, each stage computes for m slots of a step that lasts m + p − 1
# slots, so
#
# idle share of the step = (p − 1) / (m + p − 1)   (the "step" definition used in this chapter).
#
# Megatron-LM's paper (Narayanan et al., 2021) writes the bubble relative to the ideal, bubble-free
# time instead: (p − 1) / m. Same idle time, a different denominator: say which one you quote.

# %%
# Predict: the idle share of the step ("step" definition), p = 2 stages, m = 4 micro-batches, GPipe.
my_guess_bubble = None  # e.g. 0.3

# %% tags=["measure-10-bubble"]
# One run of 2 processes: every m under both schedules (1F1B only for m >= p), a warm-up step first
demo = par.pipeline_demo(model=size["model"], stages=size["world_size"], micro_batches=(1, 2, 4, 8),
                         schedule="both", micro_batch=size["micro_batch"],
                         repeats=3 if lk.course.smoke() else 10)
if demo["ok"]:
    display(par.bubble_note(demo, "gpipe"))
    display(par.plot_bubble(demo, "gpipe"))
    display(par.plot_pipeline(demo, "gpipe", 4), par.plot_pipeline(demo, "1f1b", 4))
    lk.course.compare_prediction(my_guess_bubble, par.find_run(demo, "gpipe", 4)["bubble"],
                                 "idle share of the step, p=2, m=4")
else:
    lk.course.say(f"*The pipeline did not run here ({demo['error']}); the formula still holds.*")

# %% [markdown]
# The timelines show where the idle time sits: before a stage's first forward arrives, between the
# forwards and the backwards (GPipe), and after its last backward leaves. More micro-batches shrink
# its share, but each micro-batch gets smaller, and a small matmul uses a GPU less well: m is a
# trade-off. By the formula 1F1B has the same bubble as GPipe; what this run measured for it:

# %%
if demo["ok"]:
    display(par.bubble_note(demo, "1f1b"))

# %% [markdown]
# **Four stages.** The `tiny` model has two blocks, so it cannot make four stages; and four busy
# processes on a laptop's two cores would share them, which stretches every action and hides the
# schedule's own idle time. For p = 4 here are the formula and a replay of the schedules with equal
# stage costs; with four GPUs the same demo runs four stages of the `small` model.

# %%
import torch

for m in (4, 8, 16):
    rep = par.replay(par.one_f_one_b_schedule(4, m), [1.0] * 4, [2.0] * 4)
    ideal = par.bubble_fraction(4, m, relative_to="ideal")
    print(f"p=4, m={m:2}: (p-1)/(m+p-1) = {par.bubble_fraction(4, m):.3f}, (p-1)/m = {ideal:.3f}, "
          f"replayed {rep['bubble']:.3f}")
if torch.cuda.device_count() >= 4:  # NCCL, one stage per GPU
    demo4 = par.pipeline_demo(model="small", stages=4, micro_batches=(4, 8, 16), schedule="gpipe",
                              micro_batch=size["micro_batch"], torch_api=False)
    display(par.bubble_note(demo4, "gpipe") if demo4["ok"] else demo4["error"])

# %% [markdown]
# ### PyTorch's own pipelining
#
# `torch.distributed.pipelining` runs the same stages with its own schedules: wrap a stage module
# in a `PipelineStage`, pick `ScheduleGPipe` or `Schedule1F1B` (which refuses fewer micro-batches
# than stages), and `step` the whole batch. The demo ran it on the same processes, at the smallest
# m ≥ p:

# %%
lk.course.show(par.torch_pipelining_step)

# %%
if demo["ok"]:
    display(par.torch_pipelining_note(demo))

# %% [markdown]
# ### What 1F1B buys: activation memory
#
# A stage must keep a micro-batch's activations from its forward until its backward. The demo
# counted the bytes autograd saved for backward on each stage
# (`torch.autograd.graph.saved_tensors_hooks`, each storage once, parameters left out) and kept the
# peak.

# %%
# Predict: GPipe's peak saved-activation bytes over 1F1B's, on stage 0, for p = 2 and m = 8.
my_guess_memory_ratio = None  # e.g. 2.0

# %% tags=["measure-10-pp-memory"]
if demo["ok"]:
    display(par.memory_note(demo, m=8))
    g, o = (par.find_run(demo, name, 8) for name in ("gpipe", "1f1b"))
    lk.course.compare_prediction(my_guess_memory_ratio,
                                 g["saved_peak_bytes"][0] / o["saved_peak_bytes"][0],
                                 "GPipe / 1F1B saved bytes, stage 0, m=8")

# %% [markdown]
# <!-- Exercise proposals for the lead (checkers to write):
#
# 1. exercise-10-bubble: `my_bubble(p, m)` returns the idle share of the step of GPipe (or 1F1B)
#    with p stages of equal cost and m micro-batches, the "step" definition stated in the exercise.
#    Right answer: (p - 1) / (m + p - 1); check against par.bubble_fraction(p, m) over p in 1..8,
#    m in 1..32 (p = 1 gives 0). Plausible wrong answers it must fail: (p - 1) / m (Megatron-LM's,
#    relative to the ideal time: accept it only in a variant that asks for relative_to="ideal"),
#    (p - 1) / (m + p), 1 / m, p / (m + p - 1), (p - 1) / (m - 1) (ZeroDivisionError at m = 1),
#    m / (m + p - 1) (the busy share), a constant.
# 2. exercise-10-in-flight: the most micro-batches stage s holds at once under 1F1B with p stages
#    and m >= p micro-batches. Right answer: p - s (check par.in_flight(par.one_f_one_b_schedule(p,
#    m))). Wrong answers to fail: m (GPipe's), p (right for stage 0 only), p - s - 1 (the warm-up
#    count, forgetting the steady forward), s + 1 (stages counted from the wrong end), min(m, p).
#    A variant: GPipe's / 1F1B's activation memory on stage 0 for p = 4, m = 16: 16 / 4 = 4
#    (wrong: 16, 1, 0.25, 3).
# -->
