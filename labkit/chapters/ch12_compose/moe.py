"""A mixture-of-experts layer written to be read (chapter 12): a top-k router, E expert MLPs, a capacity per
expert with the tokens over it dropped, and the auxiliary load-balancing loss; a tiny MoE language model to
train with and without that loss; the dropped-token sweep against the capacity factor; and the active-versus-
total arithmetic of a public MoE shape. Expert parallelism over real ranks lives in ``moe_ranks``.

    layer = moe.MoE(d_model=64, n_experts=8, top_k=2, d_expert=128, capacity_factor=1.25)
    y = x + layer(x)            # a dropped token adds nothing: it rides the residual
    layer.aux_loss              # E * sum_e f_e * P_e  (1.0 for a perfectly uniform router)
"""
from __future__ import annotations

import contextlib
import math
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...base.runtime import ConfigError
from ...engine.config import PRESETS, real, whole
from ...engine.ddp import demo_batches
from ...engine.model import VOCAB
from ...tools.collectives import figure
from .moe_ranks import (  # noqa: F401 -- the notebook reads them as moe.*
    TOLERANCE, alltoall_bytes, counted_bytes, drop_verdict, ep_figures, ep_forward, ep_rows, ep_run, ep_verdict)


def capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(capacity_factor * tokens * top_k / n_experts). A perfectly balanced router sends
    tokens * top_k / n_experts assignments to each expert; the factor is the head-room over that.
    Shown in 12_composing_the_layout (code-12-moe)."""
    whole("tokens", tokens)
    whole("n_experts", n_experts)
    whole("top_k", top_k)
    if top_k > n_experts:
        raise ConfigError("top_k", top_k, f"at most n_experts = {n_experts}: each token picks distinct experts")
    real("capacity_factor", capacity_factor, strict=True, allowed="a number > 0 (1.0 = exactly the balanced load)")
    return math.ceil(capacity_factor * tokens * top_k / n_experts)


def load_balancing_loss(probs, chosen, n_experts: int):
    """The auxiliary loss of Switch Transformer / GShard: E * sum_e f_e * P_e, where f_e is the fraction of the
    token-expert assignments that chose expert e (counted before the capacity drops any) and P_e the mean
    router probability of expert e. f carries no gradient (argmax); P does, and the sum is smallest when the
    probabilities are spread evenly. Convention: normalised so a perfectly uniform router gives exactly 1.
    Shown in 12_composing_the_layout (code-12-moe)."""
    f = torch.bincount(chosen.flatten(), minlength=n_experts).to(probs.dtype) / chosen.numel()
    P = probs.mean(dim=0)
    return n_experts * torch.sum(f * P)


class Router(nn.Module):
    """A linear layer scores every expert for every token; softmax over the experts; each token keeps its
    top-k experts, and their gates are renormalised to sum to 1 (Mixtral's choice; Switch, k = 1, keeps the
    raw probability). Shown in 12_composing_the_layout (code-12-moe)."""

    def __init__(self, d_model: int, n_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(d_model, n_experts, bias=False)

    def forward(self, x):  # x: (N tokens, d)
        probs = F.softmax(self.gate(x), dim=-1)                 # (N, E): what the aux loss reads
        gates, chosen = probs.topk(self.top_k, dim=-1)           # (N, k) each: weights and expert ids
        gates = gates / gates.sum(dim=-1, keepdim=True)          # the k gates of a token sum to 1
        return probs, gates, chosen


def within_capacity(chosen, n_experts: int, slots: int):
    """(N, k) bool, True where a token-expert assignment got one of the expert's ``slots``. First choices
    queue before any second choice (GShard's order), then by token position: the first ``slots`` arrivals
    at an expert are kept, the rest dropped. Shown in 12_composing_the_layout (code-12-moe)."""
    n, k = chosen.shape
    queue = chosen.t().reshape(-1)                               # all first choices, then all second ...
    arrivals = F.one_hot(queue, n_experts).cumsum(dim=0)         # running count per expert
    place = arrivals[torch.arange(queue.numel()), queue] - 1     # each assignment's place in its queue
    return (place < slots).view(k, n).t()


class Expert(nn.Module):
    """One expert: the transformer's MLP, d -> d_expert -> d with GELU."""

    def __init__(self, d_model: int, d_expert: int):
        super().__init__()
        self.fc, self.out = nn.Linear(d_model, d_expert), nn.Linear(d_expert, d_model)

    def forward(self, x):
        return self.out(F.gelu(self.fc(x)))


class MoE(nn.Module):
    """The MoE layer in one process: route, keep what fits each expert's capacity, run every expert on its
    tokens, add the gated outputs. After a forward: ``aux_loss`` (to add, weighted, to the training loss),
    ``load`` (assignments per expert, before capacity) and ``dropped`` (assignments over capacity).
    Shown in 12_composing_the_layout (code-12-moe)."""

    def __init__(self, d_model: int, n_experts: int, top_k: int, d_expert: int, capacity_factor: float = 1.25):
        super().__init__()
        whole("d_model", d_model)
        whole("d_expert", d_expert)
        capacity(1, n_experts, top_k, capacity_factor)  # the same checks as the formula's, before any weight
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.router = Router(d_model, n_experts, top_k)
        self.experts = nn.ModuleList(Expert(d_model, d_expert) for _ in range(n_experts))

    def route(self, x):
        """Router, then capacity: each token's gates, chosen experts and which assignments got a slot."""
        probs, gates, chosen = self.router(x)                    # x: (N tokens, d)
        slots = capacity(x.shape[0], self.n_experts, self.top_k, self.capacity_factor)
        kept = within_capacity(chosen, self.n_experts, slots)
        self.aux_loss = load_balancing_loss(probs, chosen, self.n_experts)
        self.load = torch.bincount(chosen.flatten(), minlength=self.n_experts)
        self.dropped = int((~kept).sum())
        return gates, chosen, kept

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])                             # (N tokens, d)
        gates, chosen, kept = self.route(x)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, j = torch.nonzero((chosen == e) & kept, as_tuple=True)  # expert e's kept tokens
            out.index_add_(0, token, gates[token, j, None] * expert(x[token]))
        return out.view(shape)  # a dropped assignment adds 0: the token passes on the residual x + moe(x)


def ep_demo(**kw) -> dict:
    """Expert parallelism of this module's ``MoE`` on real ranks: ``moe_ranks.ep_run(MoE, **kw)``."""
    return ep_run(MoE, **kw)


def balanced_drop_share(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> float:
    """The share of assignments a perfectly balanced router would drop: every expert gets tokens*k/E of them
    (a fractional load taken as it is) and keeps ``capacity()`` of them."""
    slots = capacity(tokens, n_experts, top_k, capacity_factor)
    load = tokens * top_k / n_experts
    return max(0.0, load - slots) / load


# ---- a tiny MoE language model: the course's tiny GPT shape, MoE layers for MLPs, no attention ------------

class MoEBlock(nn.Module):
    """Pre-LayerNorm residual around the MoE layer (no attention: see TinyMoELM)."""

    def __init__(self, d, moe_kwargs):
        super().__init__()
        self.ln, self.moe = nn.LayerNorm(d), MoE(d, **moe_kwargs)

    def forward(self, x):
        return x + self.moe(self.ln(x))


class TinyMoELM(nn.Module):
    """The course's tiny GPT shape (byte vocabulary, learned positions, tied head, 2 layers of width 64) with
    each block's MLP an MoE layer and no attention: each position predicts the next byte from its own byte
    and place (a bigram model). Attention was left out on purpose: at initialisation its causal averages
    give every token's residual stream a shared direction, and a fresh router then sends almost every token
    to one expert -- the imbalance would be there before any training."""

    def __init__(self, n_layer=2, d_model=64, seq_len=64, n_experts=8, top_k=2, d_expert=128,
                 capacity_factor=1.25):
        super().__init__()
        kw = dict(n_experts=n_experts, top_k=top_k, d_expert=d_expert, capacity_factor=capacity_factor)
        self.wte, self.wpe = nn.Embedding(VOCAB, d_model), nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(MoEBlock(d_model, kw) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)
        self.head.weight = self.wte.weight
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    def moes(self):
        return [b.moe for b in self.blocks]


def tiny_model(seed: int = 0, **shape) -> TinyMoELM:
    """A freshly initialised TinyMoELM from ``seed``: the state both balance runs start from."""
    whole("seed", seed, 0)
    torch.manual_seed(seed)
    return TinyMoELM(**shape)


@contextlib.contextmanager
def one_thread():
    """Tiny matmuls run as fast on one thread, which does not fight the machine's other work for cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def imbalance(load) -> float:
    """The busiest expert's load over the mean load: 1.0 is perfectly even, E / k means one expert took
    every token's assignment."""
    load = load.float()
    return (load.max() / load.mean()).item()


def balance_run(aux_weight: float, steps: int, seed: int = 0, batch: int = 8, lr: float = 3e-3, **shape):
    """Train a fresh ``TinyMoELM`` (seeded) for ``steps`` AdamW updates on the course's byte corpus, the loss
    being the LM loss + ``aux_weight`` * the layers' summed aux loss. Per step: the worst layer's imbalance,
    the LM loss. Returns the trained model too. Shown in 12_composing_the_layout (code-12-moe-balance)."""
    real("aux_weight", aux_weight, allowed="a number >= 0 (0 = no balancing loss)")
    whole("steps", steps)
    model = tiny_model(seed, **shape)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    out = {"aux_weight": aux_weight, "imbalance": [], "lm_loss": [], "aux_loss": []}
    with one_thread():
        for x, y in demo_batches(PRESETS["tiny"], batch, steps, seed):
            lm = model(x, y)
            aux = sum(m.aux_loss for m in model.moes())
            (lm + aux_weight * aux).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out["imbalance"].append(max(imbalance(m.load) for m in model.moes()))
            out["lm_loss"].append(lm.item())
            out["aux_loss"].append(aux.item() / len(model.blocks))
    out["model"] = model
    return out


def balance_lab(steps: int = 60, aux_weight: float = 0.01, seed: int = 0, batch: int = 8) -> dict:
    """The same seed, data and model trained twice: without the balancing loss and with ``aux_weight``."""
    real("aux_weight", aux_weight, strict=True, allowed="a number > 0 (the run with the balancing loss)")
    whole("steps", steps, 4)
    whole("seed", seed, 0)
    whole("batch", batch)
    runs = [balance_run(w, steps, seed, batch) for w in (0.0, aux_weight)]
    return {"off": runs[0], "on": runs[1], "steps": steps, "aux_weight": aux_weight, "seed": seed,
            "n_experts": runs[0]["model"].moes()[0].n_experts, "top_k": runs[0]["model"].moes()[0].top_k}


def late(values):
    """The second half of a run's per-step values: after the router has had time to drift."""
    return values[len(values) // 2:]


def quartiles(values):
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def balance_verdict(lab: dict) -> str:
    """'more_even' when the run with the balancing loss had its second-half imbalance below the other run's
    with the interquartile ranges apart; 'less_even' the other way round; 'no_clear_difference' else."""
    (a1, _, a3), (b1, _, b3) = quartiles(late(lab["off"]["imbalance"])), quartiles(late(lab["on"]["imbalance"]))
    if b3 < a1:
        return "more_even"
    if a3 < b1:
        return "less_even"
    return "no_clear_difference"


def balance_figures(lab: dict) -> dict:
    """The medians of each run's second half, for the sentences."""
    med = {k: statistics.median(late(lab[k]["imbalance"])) for k in ("off", "on")}
    loss = {k: statistics.median(late(lab[k]["lm_loss"])) for k in ("off", "on")}
    return {"off": med["off"], "on": med["on"], "ratio": med["off"] / med["on"], "loss_off": loss["off"],
            "loss_on": loss["on"], "aux_weight": lab["aux_weight"], "steps": lab["steps"],
            "worst": lab["n_experts"] / lab["top_k"]}


def loss_verdict(lab: dict, tolerance: float = 0.02) -> str:
    """How the balancing loss changed the second-half median LM loss: 'within' ``tolerance`` (relative),
    'lower' or 'higher'."""
    f = balance_figures(lab)
    if abs(f["loss_on"] - f["loss_off"]) <= tolerance * f["loss_off"]:
        return "within"
    return "lower" if f["loss_on"] < f["loss_off"] else "higher"


def plot_balance(lab: dict, width: float = 7.0, height: float = 2.8):
    """Per step, the worst layer's busiest-expert load over the mean load, both runs."""
    fig, ax = figure(width, height)
    for key, color in (("off", "#dd8452"), ("on", "#4c72b0")):
        run = lab[key]
        ax.plot(range(1, len(run["imbalance"]) + 1), run["imbalance"], color=color,
                label=f"aux-loss weight {run['aux_weight']:g}")
    ax.axhline(1.0, color="black", lw=0.8, ls=":", label="perfectly even")
    ax.set_xlabel("training step", fontsize=8)
    ax.set_ylabel("busiest expert / mean load", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7)
    ax.set_title("Measured: load imbalance while training, same seed and data", fontsize=9)
    return fig


# ---- tokens dropped against the capacity factor ------------------------------------------------------------

FACTORS = (0.5, 1.0, 1.25, 2.0)


@torch.no_grad()
def dropped_share(model: TinyMoELM, x, y, capacity_factor: float) -> float:
    """The share of token-expert assignments dropped over all layers when ``model`` sees batch x at
    ``capacity_factor`` (each layer's factor set for this forward, then restored)."""
    real("capacity_factor", capacity_factor, strict=True, allowed="a number > 0")
    saved = [m.capacity_factor for m in model.moes()]
    for m in model.moes():
        m.capacity_factor = capacity_factor
    try:
        with one_thread():
            model(x, y)
        total = sum(m.load.sum().item() for m in model.moes())
        return sum(m.dropped for m in model.moes()) / total
    finally:
        for m, cf in zip(model.moes(), saved):
            m.capacity_factor = cf


def capacity_rows(models: dict, factors=FACTORS, batch: int = 8, seed: int = 123) -> list:
    """One row per capacity factor: the share dropped by each model in ``models`` ({name: TinyMoELM}) on one
    real batch (drawn with ``seed``, not the training runs' seed), beside what a balanced router would drop."""
    if not isinstance(models, dict) or not models or not all(isinstance(m, TinyMoELM) for m in models.values()):
        raise ConfigError("models", type(models).__name__, "a dict {name: TinyMoELM}")
    for f in factors:
        real("factors", f, strict=True, allowed="capacity factors > 0")
    x, y = next(demo_batches(PRESETS["tiny"], batch, 1, seed))
    m0 = next(iter(models.values())).moes()[0]
    rows = []
    for f in factors:
        row = {"factor": f, "slots": capacity(x.numel(), m0.n_experts, m0.top_k, f),
               "balanced": balanced_drop_share(x.numel(), m0.n_experts, m0.top_k, f)}
        row.update({name: dropped_share(m, x, y, f) for name, m in models.items()})
        rows.append(row)
    return rows


def plot_capacity(rows: list, names, width: float = 7.0, height: float = 2.8):
    fig, ax = figure(width, height)
    xs = [r["factor"] for r in rows]
    ax.plot(xs, [100 * r["balanced"] for r in rows], "k:", marker="o", label="perfectly balanced (formula)")
    for name in names:
        ax.plot(xs, [100 * r[name] for r in rows], marker="o", label=f"{name} (measured)")
    ax.set_xlabel("capacity factor", fontsize=8)
    ax.set_ylabel("assignments dropped (%)", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7)
    ax.set_title("Tokens dropped against the capacity factor, one real batch", fontsize=9)
    return fig


# ---- active versus total parameters ----------------------------------------------------------------------

# Mixtral 8x7B's shape, from Mistral AI's paper "Mixtral of Experts" (Jiang et al., 2024, arXiv:2401.04088,
# Table 1) and its released config: 32 layers, d 4096, 32 query heads and 8 key-value heads of 128, SwiGLU
# experts of 14336, 8 experts, top-2, vocabulary 32000, RMSNorm, rotary positions, untied head.
MIXTRAL_8X7B = dict(n_layer=32, d_model=4096, n_experts=8, top_k=2, d_expert=14336, vocab=32000, kv_dim=1024,
                    gated=True, bias=False, tied=False, positions=0, norm="rms")


def moe_params(n_layer, d_model, n_experts, top_k, d_expert, vocab, kv_dim=None, gated=False, bias=True,
               tied=True, positions=0, norm="layer", attention=True, dtype_bytes=2) -> dict:
    """Total and active (per token) parameters of a decoder whose every MLP is an MoE layer, the weights'
    bytes with every expert held (``dtype_bytes`` each), and training FLOPs per token, 6 x the active matmul
    weights (the course's 6 N rule, N what a token actually multiplies by). ``kv_dim``: the width of k and v
    (grouped-query attention; default d_model); ``gated``: SwiGLU experts (3 matrices, else 2); a norm
    before each sublayer and one at the end; ``attention`` False: MoE blocks only (``TinyMoELM``)."""
    for name, v in (("n_layer", n_layer), ("d_model", d_model), ("d_expert", d_expert), ("vocab", vocab)):
        whole(name, v)
    capacity(1, n_experts, top_k, 1.0)  # n_experts and top_k checked as the layer checks them
    whole("positions", positions, 0)
    whole("dtype_bytes", dtype_bytes)
    if norm not in ("layer", "rms"):
        raise ConfigError("norm", norm, "'layer' (weight and bias) or 'rms' (weight)")
    d, kv = d_model, whole("kv_dim", kv_dim) if kv_dim is not None else d_model
    attn = (d * (d + 2 * kv) + d * d + (2 * d + 2 * kv if bias else 0)) if attention else 0
    expert = (3 if gated else 2) * d * d_expert + (d_expert + d if bias else 0)
    router, norms = d * n_experts, (2 if norm == "layer" else 1) * d
    embed = vocab * d + positions * d
    head = 0 if tied else vocab * d
    per_layer = attn + n_experts * expert + router + (2 if attention else 1) * norms
    total = n_layer * per_layer + norms + embed + head
    active = total - n_layer * (n_experts - top_k) * expert
    matmul = n_layer * (attn + top_k * expert + router) + vocab * d  # the head (tied or not) is a matmul
    return {"total": total, "active": active, "active_share": active / total, "weights_bytes": total * dtype_bytes,
            "active_bytes": active * dtype_bytes, "flops_per_token": 6 * matmul,
            "dense_flops_per_token": 6 * (matmul + n_layer * (n_experts - top_k) * expert)}


def tiny_shape(model: TinyMoELM) -> dict:
    """``moe_params``' arguments for a TinyMoELM (fp32: 4 bytes a weight)."""
    m = model.moes()[0]
    return dict(n_layer=len(model.blocks), d_model=model.wte.embedding_dim, n_experts=m.n_experts, top_k=m.top_k,
                d_expert=m.experts[0].fc.out_features, vocab=VOCAB, positions=model.wpe.num_embeddings,
                attention=False, dtype_bytes=4)
