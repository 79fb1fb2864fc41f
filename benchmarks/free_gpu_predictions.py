"""Predicted time per update of each chapter's GPU run on the free GPUs (Colab's T4, Kaggle's P100), from the
what-if model (``lk.predict``): the numbers in notebooks/README.md's time table until someone measures them.

    python benchmarks/free_gpu_predictions.py            # a markdown table: chapter, T4 ms, P100 ms

A prediction, not a measurement: chapter wall times come from ``benchmarks/chapter_times.py`` run on the GPU.
The P100's fp16 figure is its datasheet's CUDA-core rate, which assumes fp16 accumulation (PyTorch accumulates
in fp32): its fp16 rows are optimistic. A current PyTorch (sm_70+ build) has no P100 kernels at all.
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
    print("| chapter | GPU run | T4, predicted (ms/update) | P100, predicted (ms/update) |\n|---|---|---:|---:|")
    for chapter, knobs in RUNS.items():
        cfg = lk.Config(model="base", **knobs)
        world = 2 if chapter == "06" else 1  # chapter 06 on Kaggle's 2 x T4; Kaggle's P100 comes alone
        t4 = lk.predict(cfg, "t4", world_size=world, progress=False).step_time_s
        p100 = (f"{lk.predict(cfg, 'p100-pcie', progress=False).step_time_s * 1e3:,.0f}" if world == 1
                else "— (one GPU: two CPU processes)")
        run = ", ".join(f"{k}={v}" for k, v in knobs.items()) + (", 2 GPUs" if world == 2 else "")
        print(f"| {chapter} | base, {run} | {t4 * 1e3:,.0f} | {p100} |")


if __name__ == "__main__":
    main()
