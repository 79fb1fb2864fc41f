# %% [markdown]
# ## Tensor parallelism: one layer split across GPUs
#
# FSDP gathers whole layers before using them; tensor parallelism (Megatron-LM, Shoeybi et al.
# 2019) never does: each GPU keeps a slice of every weight matrix and computes with its slice.
# The MLP is split column-then-row (the first layer's output columns, the second layer's input
# rows), attention by heads. The price: collectives inside every block, on the critical path.
# labkit's attention has one fused `qkv` projection, so we first permute its rows so that each
# rank's slice holds whole heads' q, k and v. Then the split block, counted and checked on real
# processes.

# %% tags=["code-10-tp-qkv"]
lk.course.show(par.permute_qkv_per_head)

# %% tags=["code-10-tp"]
lk.course.show(par.tensor.all_reduce, par.CopyToTP, par.ReduceFromTP, par.TPBlock)

# %% [markdown]
# `f` (`CopyToTP`) sits before each column-parallel layer, `g` (`ReduceFromTP`) after each
# row-parallel one. Before running it: how many AllReduce calls does one block make in its
# forward pass, and how many in its backward pass? And with q, k and v as three separate
# column-parallel layers?

# %% tags=["predict-10-tp"]
my_guess_forward_allreduces = None  # e.g. 4
my_guess_backward_allreduces = None  # e.g. 4
my_guess_backward_separate_qkv = None  # e.g. 6

# %% tags=["measure-10-tp"]
tp_run = par.tp_demo(model=size["model"], world_size=size["world_size"],
                     micro_batch=size["micro_batch"], repeats=3 if lk.course.smoke() else 5)
display(par.tp_demo_note(tp_run))
if tp_run["ok"]:
    display(par.plot_tp_demo(tp_run))

# %% [markdown]
# The DTensor version (`torch.distributed.tensor.parallel`) writes the same plan as a table:
# `ColwiseParallel` for `attn.qkv` and `fc`, `RowwiseParallel` for `attn.proj` and `out`. It
# still needs the permutation, and an attention forward that splits the width it receives:

# %% tags=["code-10-tp-dtensor"]
lk.course.show(par.LocalAttention, par.dtensor_block)

# %% [markdown]
# Why do tensor-parallel groups stay inside one node? Each block's AllReduces carry a whole
# (micro-batch, sequence, width) activation, four times per step, and nothing overlaps them: the
# next layer needs the sum. The table prices them for a GPT-3-sized block (predicted).

# %% tags=["measure-10-tp-link"]
tp_link_note, tp_link_rows = par.tp_link_table()
display(tp_link_note)

# %% [markdown]
# <!-- Exercise proposals for the lead (checkers to write):
#
# exercise-10-tp-count: "AllReduce calls per optimizer step, per GPU, for a TP model of n_layer
#   blocks (no sequence parallelism) trained with m micro-batches of gradient accumulation:
#   (a) fused qkv split per head, (b) separate q/k/v layers."
#   Right: (a) 4 * n_layer * m (2 forward + 2 backward per block per micro-batch),
#   (b) 6 * n_layer * m (2 forward + 4 backward); from formulas.tp_collectives_per_block.
#   Suggested values: n_layer = 24, m = 4 -> (a) 384, (b) 576.
#   Wrong answers to fail: 2 * n_layer * m (forward only, or backward only); 4 * n_layer
#   (forgets the micro-batches: TP collectives run every micro-batch, unlike DDP's one gradient
#   AllReduce per step); 8 * n_layer * m (one AllReduce per Linear per pass); 4 * n_layer * m
#   for (b) (ignores the separate f's); 5 * n_layer * m for (b); 12 * n_layer * m for (b)
#   (one per Linear forward and backward).
#
# exercise-10-tp-bytes: "Bytes one TP AllReduce sums for micro-batch b, sequence T, width d in
#   bf16; and bytes each GPU sends for it in a ring over t GPUs."
#   Right: b*T*d*2 (formulas.tp_allreduce_bytes) and 2*(t-1)/t times that
#   (netmodel.ring_bytes_sent). Suggested: b = 1, T = 2048, d = 12288, t = 8 ->
#   50,331,648 bytes summed; 88,080,384 bytes sent.
#   Wrong: b*T*4d*2 (the MLP's hidden width); b*T*3d*2 (qkv's output); b*T*d*2/t (a shard,
#   as in FSDP); 2 * bytes (the ring without (t-1)/t); (t-1) * bytes; b*T*d*4 (fp32).
#
# exercise-10-tp-split: "Which of qkv, proj, fc, out are column-parallel, which row-parallel,
#   and where is a row-parallel layer's bias added?" Right: qkv and fc column; proj and out row;
#   the bias once, after the AllReduce. Wrong: adding the bias on every rank before the sum
#   (counts it world_size times); fc row-parallel (then gelu would act on partial sums).
# -->
