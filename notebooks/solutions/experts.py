"""Reference solution for chapter 12's layout exercise with experts (exercise-12-moe-layout). For
instructors: not imported by the notebook; tests/test_check_compose.py checks that the checker
accepts it and rejects the usual wrong answers.
"""

# exercise-12-moe-layout: Qwen3-235B-A22B (235.1 B parameters from its shape, 22.2 B active; 94
# layers, 128 experts of width 1536 per MoE layer, top-8, 64 heads, 4 K/V heads) on 64 H100s of 80
# GB (73.6 GB usable), 8 to a node, 256 sequences of 4,096 tokens a step, full recomputation
# (labkit.check.compose.MOE_SCENARIO; the chapter's layout model, moelayout.layouts, judges).
# The routed experts are 231 B of the 235 B parameters: 16 bytes each is 3.7 TB, 58 GB per GPU even
# spread over all 64 -- so the expert state must be split as far as it goes, and split by EP and PP,
# not ZeRO: ZeRO shards expert state only over edp = dp x tp / ep replicas, and with pp > 1 only
# ZeRO-1.
# tp divides the 4 K/V heads: 1, 2 or 4. EP is carved out of the dp x tp ranks of a stage (expert TP
# 1), so ep divides dp x tp; an EP group larger than a node (8) sends most of every dispatch and
# combine over InfiniBand (50 GB/s a GPU against NVLink's 450): predicted several times slower.
# dp = 4, tp = 2, pp = 8, ep = 8 (dp x tp = 8: one EP group per node), ZeRO-1: each GPU holds 12
# layers' 128 / 8 = 16 experts: 58.0 GB of expert state, 5.2 GB of dense state, 5.0 GB of
# activations = 68.2 GB. (Also within the factor: dp=2, tp=2, pp=16, ep=4, ZeRO-1 -- the model's
# fastest; dp=2, tp=4, pp=8, ep=8; dp=1, tp=4, pp=16, ep=4 at ZeRO-0.)
my_moe_layout = dict(dp=4, tp=2, pp=8, ep=8, zero_stage=1)
