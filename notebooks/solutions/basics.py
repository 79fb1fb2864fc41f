"""Reference solutions for the exercises of chapters 00-01 (for instructors; the tests import them).

Each name matches the variable, function or class the learner fills in, in the notebook cell tagged
``exercise-NN-<name>``; the comment says which ``lk.check`` checker grades it.
"""

# ---- 00 start here -------------------------------------------------------------------------

# exercise-00-bytes-per-param -> lk.check.bytes_per_param_mixed_adam
# 16-bit weights 2 + 16-bit gradients 2 + fp32 master weights 4 + Adam m 4 + Adam v 4
bytes_per_param = 16

# exercise-00-llm-memory -> lk.check.llm_memory_gb (a 13 B-parameter model, GB = 1e9 bytes)
llm_gb = 13e9 * 16 / 1e9  # 208 GB before a single activation


# exercise-00-state-bytes -> lk.check.training_state_bytes
def training_state_bytes(n_params, optimizer):
    """fp32 training: weights (4) + gradients (4) + optimizer state (AdamW: m and v; SGD: momentum)."""
    state = {"adamw": 8, "sgd": 4}[optimizer]
    return n_params * (4 + 4 + state)


# ---- 01 measure first ------------------------------------------------------------------------

# exercise-01-linear-flops -> lk.check.flops_linear
def linear_flops(tokens, d_in, d_out):
    forward = 2 * tokens * d_in * d_out       # one multiply-add (2 FLOPs) per weight per token
    backward = 2 * forward                    # grad wrt input + grad wrt weight
    return forward + backward


# exercise-01-mfu -> lk.check.mfu_from_numbers
N, tokens_per_s, n_gpus, peak_dense = 1.3e9, 240_000, 8, 989e12
my_mfu = 6 * N * tokens_per_s / (n_gpus * peak_dense)  # about 0.237


# exercise-01-bottleneck -> lk.check.find_bottleneck
def bottleneck(breakdown):
    parts = {"data": breakdown["data_wait_s"], "compute": breakdown["compute_s"],
             "optimizer": breakdown["optimizer_s"]}
    return max(parts, key=parts.get)
