"""Predicted time per update of each chapter's GPU run on the free GPUs (Colab's T4, Kaggle's T4 × 2) and an
L4, from the what-if model (``lk.predict``): the numbers in notebooks/README.md's time table until someone
measures them.

    python benchmarks/free_gpu_predictions.py            # a markdown table: chapter, T4 ms, L4 ms

A prediction, not a measurement: chapter wall times come from ``benchmarks/chapter_times.py`` run on the GPU.
The L4 has bf16 units, so where a chapter's 16-bit run is fp16 on a T4 it is bf16 there (``lk.course.sizes``).
No P100 column: current PyTorch builds ship no sm 6.0 kernels, and labkit refuses the card in one line.
"""
from __future__ import annotations

import labkit as lk

# each chapter's GPU baseline (lk.course.sizes(gpu=...)): the base model, fp16 where the chapter runs 16-bit
RUNS = {"00": dict(micro_batch=8, precision="fp16"), "01": dict(micro_batch=8, precision="fp16"),
        "02": dict(micro_batch=8, precision="fp16"), "03": dict(micro_batch=4, precision="fp32"),
        "04": dict(micro_batch=8, precision="fp32"), "05": dict(micro_batch=8, precision="fp16"),
        "06": dict(micro_batch=4, precision="fp16", accum=4), "07": dict(micro_batch=8, precision="fp16"),
        "08": dict(micro_batch=4, precision="fp32"), "09": dict(micro_batch=8, precision="fp16")}


def main() -> None:
    print("| chapter | GPU run (on a T4) | T4, predicted (ms/update) | L4, predicted (ms/update) |\n|---|---|---:|---:|")
    for chapter, knobs in RUNS.items():
        cfg = lk.Config(model="base", **knobs)
        world = 2 if chapter == "06" else 1  # chapter 06 on Kaggle's 2 x T4; an L4 comes alone
        t4 = lk.predict(cfg, "t4", world_size=world, progress=False).step_time_s
        on_l4 = cfg.replace(precision="bf16") if cfg.precision == "fp16" else cfg  # bf16 units: no GradScaler
        l4 = (f"{lk.predict(on_l4, 'l4', progress=False).step_time_s * 1e3:,.0f}" + (" (bf16)" if on_l4 is not cfg else "")
              if world == 1 else "— (one GPU: two CPU processes)")
        run = ", ".join(f"{k}={v}" for k, v in knobs.items()) + (", 2 GPUs" if world == 2 else "")
        print(f"| {chapter} | base, {run} | {t4 * 1e3:,.0f} | {l4} |")


if __name__ == "__main__":
    main()
