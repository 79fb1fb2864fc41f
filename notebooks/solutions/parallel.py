"""Reference solutions for chapter 10 (when the model does not fit). For instructors: not imported by the
notebook.

Each name matches the placeholder the learner fills in; tests/test_check_parallel.py checks that the
checkers accept these and reject the usual wrong answers.
"""


def my_tp_allreduces(n_layer, micro_batches, qkv):
    """exercise-10-tp-allreduces: AllReduce calls per optimizer update of a Megatron-style TP GPT, no
    sequence parallelism (the embeddings and the head are replicated: no TP collective there)."""
    forward = 2  # one after each row-parallel layer: attention's output projection, the MLP's second layer
    # backward: one for the input gradient of each column-parallel layer -- the fused per-head qkv (1) or
    # separate q, k, v (3) -- plus the MLP's first layer (fc)
    backward = (1 if qkv == "per_head" else 3) + 1
    return (forward + backward) * n_layer * micro_batches  # every micro-batch runs every block


def my_bubble(p, m):
    """exercise-10-bubble: the idle share of a GPipe/1F1B step, idle time / step time. The step lasts
    m + p - 1 slots (micro-batch slots of forward + backward); each stage is busy in m of them and idles
    in p - 1 (the fill and the drain). Megatron-LM's paper writes (p - 1)/m: relative to the ideal time."""
    return (p - 1) / (m + p - 1)


def my_layout_bytes(n_params, dp, tp, pp, zero_stage):
    """exercise-10-layout-bytes: model-state bytes per GPU, mixed-precision Adam (2 + 2 + 12 bytes/param)."""
    n = n_params / (tp * pp)  # TP splits every block's weights, PP gives each stage its own layers
    weights, grads, optimizer = 2 * n, 2 * n, 12 * n
    if zero_stage >= 1:
        optimizer /= dp  # ZeRO-1: fp32 master weights, m and v sharded over the data-parallel group
    if zero_stage >= 2:
        grads /= dp
    if zero_stage >= 3:
        weights /= dp
    return weights + grads + optimizer


# exercise-10-layout-fits: 70 B parameters, 80 layers, d_model 8192, 64 heads, sequence 4096, micro-batch 1,
# 64 GPUs of 80 GB, 8 to a node (labkit.check.parallel.LAYOUT_SCENARIO).
# Activations (bf16, flash attention, no recomputation, no sequence parallelism; Korthikanti et al. 2022):
#   s·b·h·(10 + 24/tp) bytes a layer; under 1F1B the first stage holds L layers' worth of one micro-batch,
#   whatever pp is: 80 × 4096 × 8192 × (10 + 3) = 34.9 GB at tp = 8 (91.3 GB at tp = 1: FSDP alone never fits).
# tp = 8 (one node), pp = 2, dp = 4, ZeRO-1: 70e9 / 16 = 4.375e9 parameters a GPU;
#   2 + 2 bytes of each = 17.5 GB, 12 / 4 = 3 bytes of optimizer state each = 13.1 GB: 30.6 GB of state,
#   65.5 GB with the activations, under 80 GB. (Also fit: dp=8, tp=8, pp=1 at ZeRO-2 or 3; dp=2, tp=8, pp=4.)
my_layout = dict(dp=4, tp=8, pp=2, zero_stage=1)
