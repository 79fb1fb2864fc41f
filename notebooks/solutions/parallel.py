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


# exercise-10-layout-fits: Llama 2 70B (68.98 B parameters from its shape), 80 layers, d_model 8192, 64 heads
# (8 K/V heads), sequence 4096, micro-batch 1, 128 sequences a step, 64 GPUs of 80 GB (73.6 GB usable: the
# what-if model keeps 8 % back), 8 to a node (labkit.check.parallel.LAYOUT_SCENARIO).
# Activations, as the layout model counts them: bf16, flash attention, no recomputation, WITH sequence
# parallelism (Megatron pairs it with TP, so every activation term splits over tp): 34·s·b·h/tp bytes a layer --
# GPT-3's breakdown (Korthikanti et al. 2022) applied to Llama's shape, an approximation. Under 1F1B the first
# stage holds L layers' worth of one micro-batch whatever pp is: 80 × 4096 × 8192 × 34 / 8 = 11.4 GB at tp = 8
# (91.3 GB at tp = 1: no ZeRO stage shards activations, so FSDP alone never fits without recomputation).
# ZeRO-2/3 do not combine with PP (DeepSpeed's pipeline engine refuses them; Megatron's distributed optimizer is
# ZeRO-1), so with pp > 1 the stage is 0 or 1.
# tp = 8 (one node), pp = 2, dp = 4, ZeRO-1: 68.98e9 / 16 = 4.31e9 parameters a GPU;
#   2 + 2 bytes of each = 17.2 GB, 12 / 4 = 3 bytes of optimizer state each = 12.9 GB: 30.2 GB of state,
#   41.6 GB with the activations, under 73.6 GB. (Also fit: dp=2, tp=4, pp=8, ZeRO-1 -- 21.6 + 22.8 = 44.4 GB,
#   the tool's fastest; dp=8, tp=8, pp=1 at ZeRO-3; dp=2, tp=2, pp=16, ZeRO-1 at 67.2 GB, close to the edge.)
my_layout = dict(dp=4, tp=8, pp=2, zero_stage=1)
