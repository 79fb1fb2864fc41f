"""Reference solutions for the exercises of chapters 07 and 08 (for instructors; the tests import them).

Each name matches the variable or function the learner fills in, in the notebook cell tagged
``exercise-NN-<name>``; the comment says which ``lk.check`` checker grades it.
"""
import math
import re

# ---- 07 why MFU is low when nothing waits ------------------------------------------------------


# exercise-07-pad-vocab -> lk.check.pad_vocab
def pad_vocab(n, multiple=64):
    return -(-n // multiple) * multiple  # round up; a size that already divides stays as it is


# exercise-07-breakeven -> lk.check.compile_breakeven
def breakeven_steps(compile_s, eager_step_s, compiled_step_s):
    saved = eager_step_s - compiled_step_s  # what each compiled update saves
    if saved <= 0:
        return math.inf                     # not faster: the compile never pays for itself
    return math.ceil(compile_s / saved)


# exercise-07-read-profile -> lk.check.read_profile
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _seconds(text):
    m = re.fullmatch(r"([0-9.]+)(us|ms|s)", text.strip())
    return float(m.group(1)) * _UNITS[m.group(2)]


def read_profile_text(printed_table, phases):
    """What a learner does by eye: the first aten:: row of the profiler's table (sorted by self time) is
    the top operation; the optimizer range's total over the step range's total is its share.
    ``phases``: {range name: total seconds}, as the chapter's phase table lists them."""
    top = next(line.split()[0] for line in printed_table.splitlines() if line.strip().startswith("aten::"))
    return top, phases["optimizer"] / phases["step"]


# ---- 08 memory in practice -------------------------------------------------------------------------


# exercise-08-activation-formula -> lk.check.activation_formula
def activation_bytes_formula(n_layer, d_model, n_head, seq_len, batch, attention):
    per_token = 16 * d_model + n_head + 4            # fused attention: labkit.tools.memory's count (chapter 04)
    if attention == "math":
        per_token += n_head * (seq_len - 1)          # the T×T probabilities, without the log-sum-exp
    return n_layer * batch * seq_len * per_token * 4  # fp32


# exercise-08-step2 -> lk.check.step2_extra_bytes (n_params: the chapter's model)
def step2_extra(n_params):
    return 8 * n_params  # AdamW's exp_avg and exp_avg_sq, fp32, created by the first optimizer.step()


# exercise-08-bytes-per-param -> lk.check.bytes_per_param_fp32_accum
# 16-bit weights 2 + 16-bit gradients 2 + fp32 accumulator 4 + fp32 master 4 + AdamW m 4 + v 4: the 16-bit
# .grad stays allocated beside the accumulator (Megatron Core keeps none: 18, a hint the checker gives)
bytes_fp32_accum = 20


# exercise-08-budget -> lk.check.memory_budget
def my_budget(config):
    """Weights, gradients and AdamW state (16 bytes per parameter in fp32) plus the activations."""
    s = config.spec
    d, L, V, T, B = s.d_model, s.n_layer, 256, s.seq_len, config.micro_batch
    n_params = V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d   # tied head: counted once
    state = 16 * n_params
    acts = activation_bytes_formula(L, d, s.n_head, T, B, config.attention)
    acts += B * T * (2 * d + 2 + V) * 4                              # embedding sum, final LayerNorm, log-softmax
    return state + acts
