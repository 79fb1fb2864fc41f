# %% [markdown]
# ## FSDP2 in practice: what each rank holds, and which collectives it pays for
#
# Chapter 09 sharded the GPT once with `fully_shard` and looked at the bytes. Here every knob you
# will set at work is measured on real processes: the model state per rank against the world size
# (ZeRO-3's arithmetic), `reshard_after_forward` (AllGather calls against memory),
# `MixedPrecisionPolicy`, gradient clipping when every gradient is split over ranks, and gradient
# accumulation with and without a ReduceScatter per micro-batch. The collectives are counted by
# wrapping the two functions FSDP2 calls for them (`dist.all_gather_single`,
# `dist.reduce_scatter_single`); the ranks are separate Python processes.

# %% tags=["code-10-fsdp"]
lk.course.show(par.fsdp2_shard, par.fsdp2_train_step)

# %% [markdown]
# The model has `L` blocks, each its own FSDP unit, plus the root unit (embeddings, final norm,
# the tied head). Before running: how many AllGather calls does one training step make with
# `reshard_after_forward=True`, and how many bytes of model state (fp32 weights, gradients,
# AdamW's two moments) does each rank hold?

# %%
# predicted: AllGather calls in one step, reshard_after_forward=True, a 2-block GPT (+ the root)
my_guess_allgathers = None  # e.g. 3
# predicted: model-state bytes per parameter on each of 2 ranks (fp32 weights, grads, AdamW)
my_guess_bytes_per_param = None  # e.g. 16

# %% tags=["measure-10-fsdp-memory"]
fsdp_world_sizes = (1, 2) if lk.course.smoke() else (1, 2, 4)  # 4 ranks: the full mode only
fsdp = par.fsdp_lab(model=size["model"], world_sizes=fsdp_world_sizes,
                    micro_batch=size["micro_batch"], steps=lk.course.steps(3, minimum=1),
                    accumulation=4, detail_world_size=size["world_size"])
if not fsdp["ok"]:
    lk.course.say(f"FSDP2 did not run here: {fsdp['error']}")
else:
    if fsdp["kinds"][size["world_size"]] == "cpu":
        lk.course.say("These ranks use gloo on the CPU (no GPU for each rank here): the counts "
                      "and bytes are the same code's as on GPUs; only the speed differs.")
    display(par.fsdp_memory_table(fsdp))
    display(par.fsdp_memory_note(fsdp))
    mem = fsdp["memory"][size["world_size"]]
    per_param = mem["ranks"][0]["total"] / mem["n_params"]
    lk.course.compare_prediction(my_guess_bytes_per_param, per_param,
                                 f"model-state bytes per parameter, rank 0 of {size['world_size']}")
    par.fsdp_memory_chart(fsdp)

# %% tags=["measure-10-reshard"]
if fsdp["ok"]:
    lk.course.compare_prediction(my_guess_allgathers, fsdp["reshard"][True]["allgather"],
                                 "AllGather calls per step (reshard_after_forward=True)")
    display(par.fsdp_reshard_note(fsdp))
    display(par.fsdp_precision_note(fsdp))
    par.fsdp_calls_chart(fsdp)

# %% tags=["measure-10-fsdp-clip"]
if fsdp["ok"]:
    display(par.fsdp_clip_note(fsdp))

# %% tags=["measure-10-fsdp-accum"]
if fsdp["ok"]:
    display(par.fsdp_accum_note(fsdp))
    *first, last = fsdp["world_sizes"]
    lk.course.say(f"The whole FSDP2 lab: {fsdp['seconds']['total']:.1f} s on "
                  f"{', '.join(map(str, first))} and {last} processes.")

# %% [markdown]
# <!-- Exercise proposals for the lead (checkers to write):
#
# exercise-10-fsdp-bytes: "A model of N = 1.2e9 parameters trains in fp32 with AdamW under FSDP2
# (full sharding) on 8 GPUs. How many bytes of model state (weights + gradients + optimizer) does
# each GPU hold?"
#   right: 16 * N / 8 = 2.4e9 bytes (accept 1% tolerance; also accept the same number given in GB,
#   2.4).
#   plausible wrong answers: 16 * N = 19.2e9 (no sharding: DDP); 4 * N / 8 = 0.6e9 (weights only);
#   (4 + 4) * N + 8 * N / 8 = 10.8e9 (ZeRO-1: only the optimizer sharded); (4 + 8 * N / 8 ...)
#   mixes; 12 * N / 8 = 1.8e9 (forgot the gradients); 20 * N / 8 (counted the moments as 12 bytes
#   AND fp32 grads); 2 * N / 8 + ... (the mixed-precision split 2 + 2 + 12 gives the same 16:
#   accept it, it is the same total).
#   A variant asks for the mixed-precision split per GPU: params 2N/8, grads 2N/8, optimizer 12N/8
#   (par.layout_state_bytes(N, dp=8, zero_stage=3)).
#
# exercise-10-allgathers: "A GPT with L = 12 blocks is sharded with one fully_shard per block plus
# the root. How many AllGather calls does one training step make (one micro-batch) with
# reshard_after_forward=True, and with False? And with 4 micro-batches per update?"
#   right: True 2L + 1 = 25, False L + 1 = 13 (par.expected_calls(12, True / False)["allgather"]);
#   with 4 micro-batches: 4 x 25 = 100 and 4 x 13 = 52 (gathering happens every micro-batch,
#   synced or not).
#   plausible wrong answers: 2L + 2 = 26 (the root resharded too: FSDP keeps the root gathered);
#   2L = 24 and
#   L = 12 (forgot the root); 13 for True (forgot the backward's re-gather); 25 for False; 1 (one
#   flat buffer);
#   with 4 micro-batches: 25 (thinking no_sync also skips gathers).
#
# exercise-10-accum-reducescatter: "Same model, 4 micro-batches per update. ReduceScatter calls
# per update when every micro-batch syncs, and with set_requires_gradient_sync(False) on the first
# 3?"
#   right: 4 x 13 = 52 and 13 (par.expected_calls(12, micro_batches=4,
#   sync_every_micro_batch=...)).
#   plausible wrong answers: 48 / 12 (forgot the root), 4 / 1 (one per step, not per unit), 0
#   (thinking no-sync skips all of them), 26 (counting AllReduce-style 2 per unit). A follow-up:
#   what does the no-sync rank keep between micro-batches? right: full-size (unsharded) gradients,
#   4 N bytes in fp32 -- not 4 N / G.
# -->
