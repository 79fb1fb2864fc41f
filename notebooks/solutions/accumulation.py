"""Reference solutions for the exercises of chapter 03 (for instructors; the tests import them).

Each name matches the variable, function or class the learner fills in, in the notebook cell tagged
``exercise-NN-<name>``; the comment says which ``lk.check`` checker grades it.
"""

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
