"""The drills' catalogue: planted mistakes, healthy look-alikes, and the evidence that tells each apart.

Each ``Case`` is data. ``knobs`` are the ``lk.Config`` fields of the run a learner diagnoses, ``twin`` those
of its healthy twin (the same run with the mistake taken out); ``fix`` is the knob change that repairs it
({} when nothing is wrong). A mistake that no Config knob can make (``zero_grad`` inside the micro-batch
loop, a rank skipping a collective) names its plain-torch loop in ``mistake`` (``drills.mistakes``); its
knobs then size that loop. ``signal`` is the evidence key (``drills.evidence``) that distinguishes the case
from its twin -- and from every other case a gauntlet can draw whose answer differs (``evidence.separated``
says how far apart two values must be: a test holds every pair to it). ``teaches`` is the chapter cell
(``measure-NN-topic``) that measures the effect; ``drills.scoring.fix_key`` is a case's right answer.

What a learner reads of a case lives in ``notebooks/interview_drills.md`` (``drills.bank`` parses and
checks it): its ``cause`` (the multiple choice), ``needs_gpu`` (why a CPU cannot show it; "" when it can),
``code_fix`` (a code-level mistake's fix, offered beside the knob changes), ``fix_words`` (a knob fix named
by its rule where the knob's value would hide it) and ``words`` (the reveal's explanation). ``SPECS`` below
is what runs; ``CASES`` joins each spec to its words.

    python -m labkit.drills     # parse and check the page; print what it holds
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import bank

# Every case's runs share these knobs: the CI-sized model, one thread (two threads fighting a shared
# machine's other programs for two cores measure the machine, not the mistake).
BASE = {"model": "tiny", "threads": 1, "seed": 0}


@dataclass(frozen=True)
class Case:
    id: str
    cause: str                # a short phrase; HEALTHY for a healthy case (the page's words)
    fix: dict                 # knob changes that repair it ({} for a healthy case)
    teaches: str              # the chapter cell that measures the effect: measure-NN-topic
    knobs: dict               # the case's lk.Config fields (BASE added when it runs)
    twin: dict                # the healthy twin's fields
    mistake: str = ""         # the planted code-level mistake in drills.mistakes, or ""
    signal: str = ""          # the evidence key that tells the case from its twin
    needs_gpu: str = ""       # why a CPU cannot show it; "" when it can (the page's words)
    words: str = ""           # what the reveal says (the page's words)
    speed_only: bool = field(default=False)  # only a speed tells it apart: CI tests its set-up, benchmarks its speed
    code_fix: str = ""        # a code-level mistake's fix, in words ("" when a knob change fixes it)
    fix_words: str = ""       # a knob fix's menu entry when "field=value" would not say the rule ("" otherwise)

    @property
    def healthy(self) -> bool:
        return self.cause == HEALTHY


# What runs: id, the fix, the teaching cell, the case's and the twin's knobs, the mistake and the signal
# ("healthy": nothing is wrong; the page's section of that id holds the words).
SPECS = (
    dict(id='sync-every-micro', fix={'ddp_sync': 'no_sync'}, teaches='measure-06-every-micro-real',
         knobs={'world_size': 2, 'accum': 4, 'micro_batch': 4, 'ddp_sync': 'every_micro', 'lr': 6e-4},
         twin={'world_size': 2, 'accum': 4, 'micro_batch': 4, 'ddp_sync': 'no_sync', 'lr': 6e-4},
         signal='allreduce_calls_per_update'),
    dict(id='loader-no-workers', fix={'workers': 1}, teaches='measure-05-starving', knobs={'data_cost_ms': 2.0,
         'workers': 0}, twin={'data_cost_ms': 2.0, 'workers': 1}, signal='data_wait_frac'),
    dict(id='fp32-on-fast-bf16', fix={'precision': 'bf16'}, teaches='measure-02-bf16-speed', knobs={'precision':
         'fp32', 'model': 'small'}, twin={'precision': 'bf16', 'model': 'small'}, signal='tokens_per_s',
         speed_only=True),
    dict(id='fp16-no-scaling', fix={'loss_scaling': 'on'}, teaches='measure-02-underflow', knobs={'precision':
         'fp16', 'loss_scaling': 'off'}, twin={'precision': 'fp16', 'loss_scaling': 'on'},
         mistake='fp16_without_scaler', signal='grad_zero_frac'),
    dict(id='bf16-with-scaler', healthy=True, fix={}, teaches='measure-02-bf16-scaler', knobs={'precision':
         'bf16', 'loss_scaling': 'on'}, twin={'precision': 'bf16', 'loss_scaling': 'off'}, signal='grad_scale'),
    dict(id='full-ckpt-ample-memory', fix={'checkpointing': 'none'}, teaches='measure-04-full-overhead',
         knobs={'checkpointing': 'full'}, twin={'checkpointing': 'none'}, signal='recompute_ratio'),
    dict(id='micro-batch-1', fix={'micro_batch': 8, 'accum': 1}, teaches='measure-01-low-mfu-suspect',
         knobs={'micro_batch': 1, 'accum': 8}, twin={'micro_batch': 8, 'accum': 1}, signal='mfu',
         speed_only=True),
    dict(id='pin-memory-off', fix={'pin_memory': True}, teaches='measure-05-pin-memory', knobs={'workers': 2,
         'pin_memory': False, 'model': 'small'}, twin={'workers': 2, 'pin_memory': True, 'model': 'small'},
         signal='data_wait_frac', speed_only=True),
    dict(id='step2-oom', fix={'micro_batch': 4, 'accum': 2}, teaches='measure-08-step2', knobs={'model': 'base',
         'micro_batch': 8, 'memory_budget_gb': 3.0, 'steps': 3}, twin={'model': 'base', 'micro_batch': 4, 'accum':
         2, 'memory_budget_gb': 3.0, 'steps': 3}, signal='oom_at_update'),
    dict(id='lr-not-scaled', fix={'lr': 6e-4}, teaches='measure-09-lr-batch', knobs={'micro_batch': 32, 'lr':
         3e-4, 'grad_clip': None}, twin={'micro_batch': 32, 'lr': 6e-4, 'grad_clip': None},
         signal='lr_vs_sqrt_rule'),
    dict(id='loss-not-divided', fix={}, teaches='measure-03-equivalence', knobs={'accum': 4, 'micro_batch': 2},
         twin={'accum': 4, 'micro_batch': 2}, mistake='loss_not_divided_by_k', signal='grad_norm'),
    dict(id='zero-grad-inside', fix={}, teaches='measure-03-equivalence', knobs={'accum': 4, 'micro_batch': 2},
         twin={'accum': 4, 'micro_batch': 2}, mistake='zero_grad_inside_loop', signal='grad_norm'),
    dict(id='dropout-in-eval', fix={}, teaches='measure-03-equivalence', knobs={'dropout': 0.1}, twin={'dropout':
         0.1}, mistake='dropout_in_eval', signal='eval_loss_spread'),
    dict(id='rank-skips-collective', fix={}, teaches='measure-06-ddp-two-procs', knobs={'world_size': 2},
         twin={'world_size': 2}, mistake='rank_skips_collective', signal='timed_out'),
    dict(id='accum-equivalent', healthy=True, fix={}, teaches='measure-03-equivalence', knobs={'micro_batch': 8,
         'accum': 4, 'lr': 6e-4}, twin={'micro_batch': 32, 'accum': 1, 'lr': 6e-4}, signal='final_loss'),
    dict(id='ddp-equivalent', healthy=True, fix={}, teaches='measure-06-ddp-two-procs', knobs={'world_size': 2,
         'micro_batch': 4}, twin={'world_size': 1, 'micro_batch': 8}, signal='final_loss'),
    dict(id='every-micro-k1', healthy=True, fix={}, teaches='measure-06-sync-sweep', knobs={'world_size': 2,
         'accum': 1, 'micro_batch': 4, 'ddp_sync': 'every_micro'}, twin={'world_size': 2, 'accum': 1,
         'micro_batch': 4, 'ddp_sync': 'no_sync'}, signal='allreduce_calls_per_update'),
)
# Planned, for a later session: an unpadded vocabulary (the byte vocabulary is 256, already a multiple of
# 64: no knob makes it odd); fp16 overflow (NaN, a case of its own).

PAGE = bank.load(cases={s["id"]: s.get("healthy", False) for s in SPECS})
HEALTHY = next((PAGE.cases[s["id"]]["cause"] for s in SPECS if s.get("healthy")), "nothing wrong")
_WORDS = ("cause", "needs_gpu", "words", "code_fix", "fix_words")
CASES = tuple(Case(**{k: v for k, v in s.items() if k != "healthy"}, **{k: PAGE.cases[s["id"]][k] for k in _WORDS})
              for s in SPECS)

