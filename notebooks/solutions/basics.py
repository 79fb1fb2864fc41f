"""Reference solutions for the exercises of chapters 00-03 (for instructors; the tests import them).

Each name matches the variable, function or class the learner fills in, in the notebook cell tagged
``exercise-NN-<name>``; the comment says which ``lk.check`` checker grades it.
"""
import contextlib

import torch

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


# ---- 02 mixed precision ----------------------------------------------------------------------

# exercise-02-flush -> lk.check.fp16_flush_fraction
def flush_fraction(g):
    return ((g != 0) & (g.half() == 0)).float().mean().item()


# exercise-02-loss-scaler -> lk.check.loss_scaler
class MyLossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.scale = init_scale
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.good_steps = 0

    def update(self, found_inf):
        """Call once per optimizer update; returns whether to take the optimizer step."""
        if found_inf:
            self.scale *= self.backoff_factor  # overflow: smaller scale, skip this step
            self.good_steps = 0
            return False
        self.good_steps += 1
        if self.good_steps == self.growth_interval:  # a calm stretch: try a larger scale
            self.scale *= self.growth_factor
            self.good_steps = 0
        return True


# exercise-02-find-the-bug -> lk.check.fixed_training_loop
def train_update(ddp_model, optimizer, micro_batches):
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        # no_sync on the first K-1 micro-batches: gradients add up locally, one AllReduce at the end
        sync = contextlib.nullcontext() if k == K - 1 else ddp_model.no_sync()
        with sync:
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                loss = ddp_model(x, y) / K
            loss.backward()  # bf16 has fp32's range: no GradScaler
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# ---- 03 gradient accumulation ----------------------------------------------------------------

# exercise-03-accum-steps -> lk.check.accum_steps_needed
K_needed = 524_288 // (4 * 2048 * 8)  # 8


# exercise-03-token-weights -> lk.check.token_weights
def token_weights(token_counts):
    total = sum(token_counts)
    return [n / total for n in token_counts]


# exercise-03-accumulation-loop -> lk.check.accumulation_loop
def accumulate_update(model, optimizer, micro_batches):
    K = len(micro_batches)
    for x, y in micro_batches:
        loss = model(x, y) / K  # K micro-batches of loss/K add up to the big batch's mean
        loss.backward()         # gradients add up in .grad
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # once per update, never inside the loop
