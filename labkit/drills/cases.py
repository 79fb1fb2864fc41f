"""The drills' catalogue: planted mistakes, healthy look-alikes, and the evidence that tells each apart.

Each ``Case`` is data. ``knobs`` are the ``lk.Config`` fields of the run a learner diagnoses, ``twin`` those
of its healthy twin (the same run with the mistake taken out); ``fix`` is the knob change that repairs it
({} when nothing is wrong). A mistake that no Config knob can make (``zero_grad`` inside the micro-batch
loop, a rank skipping a collective) names its plain-torch loop in ``mistake`` (``drills.mistakes``); its
knobs then size that loop. ``signal`` is the evidence key (``drills.evidence``) that distinguishes the case
from its twin -- and from every other case a gauntlet can draw whose answer differs (``evidence.separated``
says how far apart two values must be: a test holds every pair to it); ``needs_gpu`` says why this case cannot show on a CPU ("" when it can). ``teaches`` is the
chapter cell (``measure-NN-topic``) that measures the effect. ``code_fix`` names a code-level mistake's fix
(the drill's fix menu offers it beside the knob changes); ``fix_words`` names a knob fix by its rule where the
knob's value would hide it; ``drills.scoring.fix_key`` is a case's right answer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

HEALTHY = "nothing wrong"
# Every case's runs share these knobs: the CI-sized model, one thread (two threads fighting a shared
# machine's other programs for two cores measure the machine, not the mistake).
BASE = {"model": "tiny", "threads": 1, "seed": 0}


@dataclass(frozen=True)
class Case:
    id: str
    cause: str                # a short phrase; "nothing wrong" for a healthy case
    fix: dict                 # knob changes that repair it ({} for a healthy case)
    teaches: str              # the chapter cell that measures the effect: measure-NN-topic
    knobs: dict               # the case's lk.Config fields (BASE added when it runs)
    twin: dict                # the healthy twin's fields
    mistake: str = ""         # the planted code-level mistake in drills.mistakes, or ""
    signal: str = ""          # the evidence key that tells the case from its twin
    needs_gpu: str = ""       # why a CPU cannot show it; "" when it can
    words: str = ""           # what the reveal says
    speed_only: bool = field(default=False)  # only a speed tells it apart: CI tests its set-up, benchmarks its speed
    code_fix: str = ""        # a code-level mistake's fix, in words ("" when a knob change fixes it)
    fix_words: str = ""       # a knob fix's menu entry when "field=value" would not say the rule ("" otherwise)

    @property
    def healthy(self) -> bool:
        return self.cause == HEALTHY


CASES = (
    Case("sync-every-micro", "gradients synchronised on every micro-batch (no no_sync)", {"ddp_sync": "no_sync"},
         "measure-06-every-micro-real",
         {"world_size": 2, "accum": 4, "micro_batch": 4, "ddp_sync": "every_micro", "lr": 6e-4},
         {"world_size": 2, "accum": 4, "micro_batch": 4, "ddp_sync": "no_sync", "lr": 6e-4},
         signal="allreduce_calls_per_update",
         words="DDP launched its AllReduces on every micro-batch -- one per gradient bucket each time (this tiny "
               "model fits one bucket), K times per update where once per update is enough: wrap the first K-1 "
               "backward passes in model.no_sync() and the gradients add up locally."),
    Case("loader-no-workers", "a slow data loader with 0 workers", {"workers": 1}, "measure-05-starving",
         {"data_cost_ms": 2.0, "workers": 0}, {"data_cost_ms": 2.0, "workers": 1},
         signal="data_wait_frac",
         words="Each sample costs real CPU work, and with 0 workers the training loop does it itself while the "
               "model waits: most of the step is data wait. Loader workers prepare the next batches meanwhile."),
    Case("fp32-on-fast-bf16", "fp32 where the device has fast bf16", {"precision": "bf16"}, "measure-02-bf16-speed",
         {"precision": "fp32", "model": "small"}, {"precision": "bf16", "model": "small"},
         signal="tokens_per_s", speed_only=True,
         needs_gpu="bf16 is faster than fp32 only on tensor cores (or a CPU with AMX): a CPU without them "
                   "emulates bf16, so here fp32 is the right choice",
         words="The matmuls run in fp32 (the profiler's GEMMs take float32) on a device whose bf16 units are "
               "several times faster: tokens/s is a fraction of the same step's under bf16 autocast. (labkit's "
               "MFU divides by each format's own peak, so fp32's MFU can look fine: compare tokens/s.)"),
    Case("fp16-no-scaling", "fp16 without loss scaling (small gradients flush to zero)", {"loss_scaling": "on"},
         "measure-02-underflow", {"precision": "fp16", "loss_scaling": "off"},
         {"precision": "fp16", "loss_scaling": "on"}, mistake="fp16_without_scaler", signal="grad_zero_frac",
         code_fix="a GradScaler: scale the loss before backward(), unscale before clipping",
         words="Gradients smaller than fp16's smallest subnormal (6e-8) became exactly 0: no NaN, no error, just "
               "lost updates. A GradScaler multiplies the loss first, so they stay representable."),
    Case("bf16-with-scaler", HEALTHY, {}, "measure-02-bf16-scaler",
         {"precision": "bf16", "loss_scaling": "on"}, {"precision": "bf16", "loss_scaling": "off"},
         signal="grad_scale",
         words="A GradScaler with bf16 is not needed: bf16 has fp32's exponent range, so no gradient underflows "
               "and the scaler never finds an inf -- same losses, no skipped steps, only a scale in the log. Nothing "
               "is wrong with this run, but the scaler is not free: it checks the gradients for inf/NaN with a "
               "host sync every step, and on a diverging run it silently skips the updates and lowers the scale, "
               "hiding the inf/NaN a bf16 run should stop on. Leave it out with bf16."),
    Case("full-ckpt-ample-memory", "full activation checkpointing while memory is ample", {"checkpointing": "none"},
         "measure-04-full-overhead", {"checkpointing": "full"}, {"checkpointing": "none"},
         signal="recompute_ratio",
         words="Every block's forward runs twice (HFU above MFU, at most 4/3 of it: a forward is a third of forward "
               "plus backward, and the embeddings, head and loss outside the blocks run once) to save activation "
               "memory this run did not need: turn checkpointing off, or use it only where memory runs out."),
    Case("micro-batch-1", "a micro-batch of 1 (the matmuls too small to fill the device)",
         {"micro_batch": 8, "accum": 1}, "measure-01-low-mfu-suspect", {"micro_batch": 1, "accum": 8},
         {"micro_batch": 8, "accum": 1}, signal="mfu", speed_only=True,
         needs_gpu="on a CPU a pass of one sequence loses only part of the MFU, and the healthy drills' own MFU "
                   "(bf16 emulated, two DDP processes sharing the cores) spans the same range: nothing in the "
                   "evidence tells it apart; on a GPU a pass of one sequence leaves most of the device idle",
         words="Low MFU with no data wait: each forward is a sliver of work, and fixed costs per pass dominate. "
               "A larger micro-batch (fewer accumulation steps) does the same update in fewer, fuller passes."),
    Case("pin-memory-off", "pin_memory off with a GPU (pageable host-to-GPU copies)", {"pin_memory": True},
         "measure-05-pin-memory", {"workers": 2, "pin_memory": False, "model": "small"},
         {"workers": 2, "pin_memory": True, "model": "small"}, signal="data_wait_frac", speed_only=True,
         needs_gpu="pinned memory speeds up host-to-GPU copies; on a CPU there is no such copy",
         words="Batches went to the GPU from pageable memory: each copy is staged and synchronous. Pinned "
               "(page-locked) buffers let the copy run asynchronously and faster."),
    Case("step2-oom", "optimizer state created at update 1 (out of memory at update 2)",
         {"micro_batch": 4, "accum": 2}, "measure-08-step2",
         {"model": "base", "micro_batch": 8, "memory_budget_gb": 3.0, "steps": 3},
         {"model": "base", "micro_batch": 4, "accum": 2, "memory_budget_gb": 3.0, "steps": 3},
         signal="oom_at_update",
         needs_gpu="memory_budget_gb caps a CUDA card's allocator; a CPU run has no device memory budget",
         words="Update 1 fitted, but AdamW creates its two moments at the first optimizer.step: update 2 needs "
               "2 x the parameters' bytes more, past the budget. Budget from update 2's peak, not update 1's: free "
               "activation memory for the state (half the micro-batch, twice the accumulation: the same update)."),
    Case("lr-not-scaled", "learning rate not scaled with the batch", {"lr": 6e-4}, "measure-09-lr-batch",
         {"micro_batch": 32, "lr": 3e-4, "grad_clip": None}, {"micro_batch": 32, "lr": 6e-4, "grad_clip": None},
         signal="lr_vs_sqrt_rule", fix_words="raise lr: √ for AdamW, linear for SGD",
         words="The log beside the curve gives it away: 32 sequences an update, 4x the course's 8, at the learning "
               "rate tuned for 8 (3e-4). Scale it with the batch: by the square root (x2 here) for AdamW, the rule "
               "derived for adaptive optimizers (Malladi et al. 2022), linearly (x4) for SGD (Goyal et al. 2017), "
               "with a warm-up. The curve alone cannot prove it: over a few updates from initialisation a larger "
               "learning rate always drops the loss faster (short-horizon bias, Wu et al. 2018), so confirm with "
               "a longer run or a sweep before calling any lr wrong."),
    Case("loss-not-divided", "the loss not divided by K under gradient accumulation", {}, "measure-03-equivalence",
         {"accum": 4, "micro_batch": 2}, {"accum": 4, "micro_batch": 2}, mistake="loss_not_divided_by_k",
         signal="grad_norm", code_fix="divide each micro-batch's loss by K before backward()",
         words="The K micro-batches' gradients were summed, not averaged: the pre-clip gradient norm is exactly K "
               "times the right one's. Clipping (and AdamW's per-parameter scaling) hide it from the loss curve, "
               "so the logged gradient norm is where it shows. Divide the loss by K."),
    Case("zero-grad-inside", "zero_grad inside the micro-batch loop", {}, "measure-03-equivalence",
         {"accum": 4, "micro_batch": 2}, {"accum": 4, "micro_batch": 2}, mistake="zero_grad_inside_loop",
         signal="grad_norm", code_fix="zero_grad once per update, after optimizer.step()",
         words="zero_grad ran before every micro-batch, so each update used only the last micro-batch's gradient "
               "divided by K: the gradient norm falls by between √K (micro-batch gradients dominated by noise) and K "
               "(dominated by their common signal). Zero once per update, after optimizer.step()."),
    Case("dropout-in-eval", "dropout left on in evaluation (no model.eval())", {}, "measure-03-equivalence",
         {"dropout": 0.1}, {"dropout": 0.1}, mistake="dropout_in_eval", signal="eval_loss_spread",
         code_fix="model.eval() before evaluating (model.train() after)",
         words="The held-out loss changes each time the same batch is evaluated: dropout is still active. Call "
               "model.eval() before evaluating (and model.train() after)."),
    Case("rank-skips-collective", "a DDP rank skips a collective (mispaired, then a hang)", {},
         "measure-06-ddp-two-procs", {"world_size": 2}, {"world_size": 2}, mistake="rank_skips_collective",
         signal="timed_out", code_fix="every rank calls every collective, in the same order",
         words="Rank 1 skipped update 2's all_reduce. Collectives pair by call order, not by intent: rank 0's "
               "update-2 all_reduce did not wait -- it completed with rank 1's update-3 gradient, and every later "
               "one paired updates one apart. The ranks' parameters, identical after update 1, differ from update "
               "2 on: silent corruption, no error. Only rank 0's last call, with no partner left, hung until the "
               "process group's timeout (in a long run, only when a call of another shape or the end comes). "
               "TORCH_DISTRIBUTED_DEBUG=DETAIL said only that rank 1 failed to pass a monitoredBarrier; the "
               "per-rank sequence numbers that show the skip are in NCCL's flight recorder "
               "(TORCH_NCCL_TRACE_BUFFER_SIZE > 0, dumped on the watchdog's timeout). Every rank must call every "
               "collective, in the same order."),
    Case("accum-equivalent", HEALTHY, {}, "measure-03-equivalence", {"micro_batch": 8, "accum": 4, "lr": 6e-4},
         {"micro_batch": 32, "accum": 1, "lr": 6e-4}, signal="final_loss",
         words="Four micro-batches of 8 with the loss divided by 4 make the same update as one batch of 32: the "
               "loss curve matches the twin's to float rounding, each pass is as full as the other drills' (a "
               "micro-batch of 8), and the log shows the learning rate already scaled for 32 sequences (√4 x the "
               "course's 3e-4). Accumulation is how a batch too big for memory is made, not a mistake."),
    Case("ddp-equivalent", HEALTHY, {}, "measure-06-ddp-two-procs", {"world_size": 2, "micro_batch": 4},
         {"world_size": 1, "micro_batch": 8}, signal="final_loss",
         words="Two DDP ranks of 4 sequences each average their gradients into the same update as one process "
               "with 8: the same loss curve, one AllReduce per gradient bucket and update (one bucket here)."),
    Case("every-micro-k1", HEALTHY, {}, "measure-06-sync-sweep",
         {"world_size": 2, "accum": 1, "micro_batch": 4, "ddp_sync": "every_micro"},
         {"world_size": 2, "accum": 1, "micro_batch": 4, "ddp_sync": "no_sync"},
         signal="allreduce_calls_per_update",
         words="With one micro-batch per update there is nothing to accumulate: syncing every micro-batch is one "
               "AllReduce per bucket and update (one bucket here), exactly what no_sync gives."),
)
# Planned, for a later session: an unpadded vocabulary (the byte vocabulary is 256, already a multiple of
# 64: no knob makes it odd); fp16 overflow (NaN, a case of its own).
