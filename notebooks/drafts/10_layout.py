# %% [markdown]
# ## Choosing a layout for the GPUs you have — predicted
#
# An interviewer's question: *the model does not fit one GPU and you cannot get more — what layout do you choose?*
# Here every DP × TP × PP (× ZeRO stage) that obeys the rules is enumerated for a model, a GPU of the catalogue, a
# node size and an interconnect; each gets its bytes per GPU (the formulas you counted above) and a **predicted**
# step time from the what-if model's achievable peak plus the communication the layout adds (TP AllReduces inside
# the node, the pipeline bubble and sends, DP's gradients across nodes). Nothing below ran on a GPU: every time
# is *predicted*, with no overlap of communication and compute assumed.

# %%
from labkit.chapters.parallel import context as cx
from labkit.chapters.parallel import fp8
from labkit.chapters.parallel import layout as lay

# Llama 2 70B on 64 H100s in 8 nodes, 128 sequences of 4,096 tokens per step
scenario = dict(model="llama2-70b", gpu="h100-sxm", n_gpus=64, node_size=8,
                interconnect="infiniband", global_batch=128)
shape = lay.MODELS[scenario["model"]]
print(f"{shape.name}: {shape.n_params / 1e9:,.1f} B parameters (from its shape), "
      f"{shape.n_layer} layers, {shape.n_head} heads; plain DDP would need "
      f"{16 * shape.n_params / 1e9:,.0f} GB per GPU of model state")

# %% [markdown]
# **Predict first.** Which (dp, tp, pp) will the tool pick for this 70B model on 64 H100s? Will it use all 8 GPUs
# of a node for TP, or fewer?

# %%
my_guess_layout = None  # e.g. (dp, tp, pp) = (8, 8, 1)

# %% tags=["measure-10-layout"]
widget = lay.layout_widget(**scenario)
display(widget)
rows, table, choice = widget.view()  # the same rows without a front end
if not lk.course.smoke():
    display(table)
display(choice)

# %%
import matplotlib.pyplot as plt

top = [r for r in rows if r["fits"]][:6]
fig, ax = plt.subplots(figsize=(7.5, 2.8))
left = [0.0] * len(top)
for part in lay.PARTS:
    vals = [r["parts"][part] for r in top]
    ax.barh(range(len(top)), vals, left=left, label=part)
    left = [a + b for a, b in zip(left, vals)]
names = [f"DP{r['dp']} TP{r['tp']} PP{r['pp']} Z{r['zero_stage']}" for r in top]
ax.set_yticks(range(len(top)), names)
ax.invert_yaxis()
ax.set_xlabel("predicted seconds per step")
ax.set_title("Where the predicted step goes, fastest layouts that fit", fontsize=9)
ax.legend(fontsize=7, ncol=3, loc="lower right")
plt.tight_layout()
plt.show()

# %% [markdown]
# ### Against published layouts
# Would the tool have picked what teams actually ran? Each layout below is cited with its table, and marked
# verified (confirmed through labkit's reference search) or not.

# %% tags=["measure-10-published-layout"]
display(lay.published_note())

# %% [markdown]
# ### FP8: the linear layers at twice the peak — predicted
# FP8 changes the arithmetic of the linear layers' GEMMs only; this machine cannot run it (see the skip line), so
# the step below is the what-if arithmetic with those GEMMs at the catalogue's FP8 peak.

# %%
display(fp8.fp8_facts_note())
my_guess_fp8_speedup = None  # e.g. 2.0

# %% tags=["measure-10-fp8"]
print(fp8.fp8_skip_reason() or "this GPU has FP8 units; the figures below are still predicted")
best = lay.best_layout(rows)
cmp = fp8.fp8_compare(**scenario, dp=best["dp"], tp=best["tp"], pp=best["pp"],
                      zero_stage=best["zero_stage"])
display(fp8.fp8_note(cmp, scenario["gpu"]))

# %% [markdown]
# ### Context parallelism: a 128K-token sequence over cp ranks — predicted
# Ring attention gives each rank T/cp tokens; K and V blocks go round the ring (cp − 1 steps forward and
# backward) while each rank computes attention on the block it holds. Compute per step falls with (T/cp)², the
# bytes only with T/cp — so the send hides until the blocks get small.

# %%
my_guess_cp_exposed = None  # e.g. "the send is exposed from cp = 8"

# %% tags=["measure-10-context"]
ctx = cx.context_rows("llama3-405b", "h100-sxm", 131072, cps=(1, 2, 4, 8, 16, 32), tp=8)
display(cx.context_table(ctx), cx.context_note(ctx, "llama3-405b", 131072))
for link in ("infiniband", "ethernet"):
    s = cx.hide_threshold_tokens("llama3-405b", "h100-sxm", link)
    print(f"over {link}: the K/V send hides while a rank holds more than {s:,.0f} tokens "
          f"(predicted; cp up to {131072 / s:,.0f} at 128K tokens)")

# %% [markdown]
# <!-- Exercise proposals (the lead writes the checkers):
#
# 1. exercise-10-layout-fits — "Pick a layout that fits: Llama 2 70B (80 layers, 64 heads), 64 H100 80 GB,
#    8 per node, InfiniBand, 128 sequences of 4,096 tokens per step, micro-batch 1. Give (dp, tp, pp, zero_stage)."
#    Checker: lay.check_layout(scenario, answer) with scenario = the `scenario` dict above.
#    Right: any row of lay.layouts(**scenario) that fits, e.g. (2, 4, 8, 1), (4, 8, 2, 3), (2, 8, 4, 1).
#    Plausible wrong, each with its reason from check_layout: (64, 1, 1, 0) plain DDP — does not fit (~1.1 TB of
#    state); (4, 4, 8, 1) — 128 GPUs, more than 64; (1, 16, 4, 0) — tp 16 larger than a node; (16, 3, 1, 0) —
#    48 GPUs; (8, 8, 1, 0) — does not fit (ZeRO-0 over TP 8 alone: 138 GB of state per GPU); tp 3 with 48 GPUs
#    — does not divide the node; pp not dividing 80 layers (e.g. a 405B scenario with pp 8 on 126 layers).
#
# 2. exercise-10-layout-bytes — "Model-state bytes per GPU of Llama 2 70B (68.98 B parameters from its shape)
#    at DP 4 × TP 4 × PP 4 with ZeRO-1 (bf16 weights and gradients, fp32 Adam state)."
#    Right: layout_state_bytes(68.98e9, dp=4, tp=4, pp=4, zero_stage=1)["total"] = (2 + 2 + 12/4) x N/16
#    ≈ 30.2 GB (accept ±2 %). Wrong: 16 N / 16 = 69 GB (forgot ZeRO-1's sharding); 16 N / 64 = 17 GB (sharded
#    everything over all 64 GPUs: ZeRO-3 over DP and model parallelism at once, not ZeRO-1); (2 + 2 + 12) N / 4 =
#    276 GB (divided by DP only); 4 N / 16 = 17 GB (weights + gradients only, forgot the optimizer);
#    12 N / 64 = 12.9 GB (the optimizer state alone).
# -->
