"""Reference solutions for the exercises of chapter 02 (for instructors; the tests import them).

Each name matches the variable, function or class the learner fills in, in the notebook cell tagged
``exercise-NN-<name>``; the comment says which ``lk.check`` checker grades it.
"""
import contextlib

import torch

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
