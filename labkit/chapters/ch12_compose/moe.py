"""A mixture-of-experts layer written to be read (chapter 12): a top-k router, E expert MLPs, a capacity per
expert with the tokens over it dropped, and the auxiliary load-balancing loss; expert parallelism on real
ranks (two ``all_to_all_single`` calls, counted, beside the formula and the one-process layer); a tiny MoE
language model to train with and without that loss; the dropped-token sweep against the capacity factor.

    layer = moe.MoE(d_model=64, n_experts=8, top_k=2, d_expert=128, capacity_factor=1.25)
    y = x + layer(x)            # a dropped token adds nothing: it rides the residual
    layer.aux_loss              # E * sum_e f_e * P_e  (1.0 for a perfectly uniform router)
    demo = moe.ep_demo(world_size=4, n_experts=8, top_k=2, tokens=256, d_model=64)   # on 4 ranks
"""
from __future__ import annotations

import math
import os
import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...base.runtime import ConfigError
from ...engine import ddp as ddp_mod
from ...engine.config import PRESETS, real, whole
from ...engine.ddp import demo_batches
from ...engine.device import intra_op_threads
from ...engine.model import VOCAB
from ...tools.collectives import (CollectiveCounter, device_kind, figure, load_average, rank_device,
                                  rank_lab)

TOLERANCE = 1e-5  # max |EP output - one-process output| still called equal: fp32 sums in another order


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


# ---- expert parallelism on real ranks: rank r holds expert group r --------------------------------

def ep_forward(layer, x, group=None):
    """The MoE layer with its experts spread over the ranks: rank r runs only experts r*E/ws .. (r+1)*E/ws - 1.
    Every rank routes its own tokens (same router weights everywhere), sends each kept assignment's row to the
    rank holding its expert, runs its experts on what arrives, and sends the results back.
    Shown in 12_composing_the_layout (code-12-moe-ep)."""
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    n_local = layer.n_experts // ws                              # experts per rank
    gates, chosen, kept = layer.route(x)                         # capacity counted over this rank's tokens
    token, j = torch.nonzero(kept, as_tuple=True)
    expert = chosen[token, j]
    order = torch.argsort(expert, stable=True)                   # rows grouped by expert, hence by rank
    token, j, expert = token[order], j[order], expert[order]
    per_expert = torch.bincount(expert, minlength=layer.n_experts)
    # 0. counts first: rank r learns how many rows each rank will send to each of its experts
    incoming = torch.empty_like(per_expert)
    dist.all_to_all_single(incoming, per_expert, group=group)    # even splits: n_local counts per rank
    send = per_expert.view(ws, n_local).sum(dim=1).tolist()      # rows to each rank
    recv = incoming.view(ws, n_local).sum(dim=1).tolist()        # rows from each rank
    # 1. dispatch: uneven splits, rows grouped by destination
    inbox = x.new_empty(sum(recv), x.shape[-1])
    dist.all_to_all_single(inbox, x[token], recv, send, group=group)
    # 2. my experts; from each source rank the rows arrive grouped by expert
    mine = torch.arange(n_local).repeat(ws).repeat_interleave(incoming.cpu()).to(x.device)
    outbox = torch.empty_like(inbox)
    for e in range(n_local):
        rows = mine == e
        outbox[rows] = layer.experts[rank * n_local + e](inbox[rows])
    # 3. combine: the reverse exchange, then each token sums its gated expert outputs
    back = x.new_empty(len(token), x.shape[-1])
    dist.all_to_all_single(back, outbox, send, recv, group=group)
    out = torch.zeros_like(x)
    out.index_add_(0, token, gates[token, j, None] * back)
    return out


def alltoall_bytes(tokens: int, top_k: int, d_model: int, world_size: int, dtype_bytes: int = 4) -> dict:
    """One all-to-all of the MoE forward (dispatch, or combine) on one rank when nothing is dropped: the buffer
    holds tokens * top_k rows of d_model values; what stays local never crosses a link, and with routing
    spread evenly that is 1 / world_size of it."""
    for name, v in (("tokens", tokens), ("top_k", top_k), ("d_model", d_model), ("world_size", world_size),
                    ("dtype_bytes", dtype_bytes)):
        whole(name, v)
    buffer = tokens * top_k * d_model * dtype_bytes
    return {"buffer": buffer, "off_rank": buffer * (world_size - 1) / world_size}


def counted_bytes(send, d_model: int, n_experts: int, dtype_bytes: int = 4) -> list:
    """Per rank, the bytes ``CollectiveCounter`` notes for one ``ep_forward`` with routing ``send`` (send[i][j]:
    the rows rank i dispatches to rank j): the counter notes each call's receive buffer -- the counts
    (n_experts int64), the dispatch (rows the others send me) and the combine (my own rows, back) -- and the
    bytes this rank sends off-rank in the dispatch (its rows minus those for its own experts)."""
    ws, row = len(send), d_model * dtype_bytes
    return [{"counts": n_experts * 8, "dispatch": sum(send[i][r] for i in range(ws)) * row,
             "combine": sum(send[r]) * row, "off_rank": (sum(send[r]) - send[r][r]) * row} for r in range(ws)]


def ep_demo(world_size: int = 4, n_experts: int = 8, top_k: int = 2, tokens: int = 256, d_model: int = 64,
            d_expert: int = 128, factors=(None, 1.0), seed: int = 0, timeout_s: float = 120.0) -> dict:
    """Run ``ep_forward`` on ``world_size`` processes for a ``MoE(d_model, n_experts, top_k, d_expert)``
    built from ``seed`` on every rank, each rank with its own ``tokens`` (random, seeded by rank), once per
    capacity factor (None: n_experts / top_k, room for every assignment: nothing dropped). Per rank: the
    collectives counted by name and bytes, the routing, max |EP - the one-process layer on the same tokens|.
    ``ok`` False and ``error`` where a rank failed or was late."""
    for name, v in (("world_size", world_size), ("n_experts", n_experts), ("top_k", top_k), ("tokens", tokens),
                    ("d_model", d_model), ("d_expert", d_expert)):
        whole(name, v)
    if world_size < 2 or n_experts % world_size:
        raise ConfigError("world_size", world_size, f"2 or more ranks dividing the {n_experts} experts: one "
                          "expert group per rank")
    if top_k > n_experts:
        raise ConfigError("top_k", top_k, f"at most n_experts = {n_experts}")
    if isinstance(factors, (str, bytes)) or not isinstance(factors, (tuple, list)) or not factors:
        raise ConfigError("factors", factors, "a tuple of capacity factors (None: nothing dropped)")
    factors = tuple(n_experts / top_k if f is None else real("factors", f, strict=True) for f in factors)
    whole("seed", seed, 0)
    real("timeout_s", timeout_s, strict=True, allowed="seconds > 0")
    kind, load = device_kind(world_size), load_average()
    lab = {"ok": True, "world_size": world_size, "n_experts": n_experts, "top_k": top_k, "tokens": tokens,
           "d_model": d_model, "kind": kind, "backend": "nccl" if kind == "cuda" else "gloo"}
    args = (n_experts, top_k, tokens, d_model, d_expert, factors, seed, kind)
    lab = rank_lab(lab, _ep_rank, args, "expert-parallel demo", timeout_s, "labkit-ep-")
    if not lab["ok"]:
        return lab
    ranks = lab.pop("ranks")  # per rank, one result per factor: regrouped per factor
    sends = [[r[i]["send"] for r in ranks] for i in range(len(factors))]  # keys in the old order
    settings = [{"factor": f, "send": sent, "formula": counted_bytes(sent, d_model, n_experts),
                 "ranks": [r[i] for r in ranks]} for i, (f, sent) in enumerate(zip(factors, sends))]
    return {**lab, "no_drop": alltoall_bytes(tokens, top_k, d_model, world_size), "settings": settings,
            "load": max(load, load_average()), "cores": os.cpu_count()}


def _ep_rank(rank, n_experts, top_k, tokens, d_model, d_expert, factors, seed, kind) -> list:
    """A spawned rank: the same MoE layer from ``seed`` on every rank, its own tokens, one counted
    ``ep_forward`` per capacity factor beside the one-process layer's output on the same tokens."""
    device = rank_device(kind, rank.rank)
    ws, out = rank.world_size, []
    with ddp_mod.process_group(kind, rank.rank, ws, rank.file_store()):
        torch.manual_seed(seed)
        # every expert on every rank only for the one-process reference; ep_forward runs its own group alone
        layer = MoE(d_model, n_experts, top_k, d_expert).to(device)
        x = torch.randn(tokens, d_model, generator=torch.Generator().manual_seed(seed + 1 + rank.rank)).to(device)
        for f in factors:
            layer.capacity_factor = f
            with torch.no_grad():
                ref = layer(x)  # the one-process layer: every expert, this rank's tokens
                _, chosen, kept = layer.route(x)
                send = torch.bincount(chosen[kept] // (n_experts // ws), minlength=ws).tolist()
                with CollectiveCounter() as counter:
                    ep = ep_forward(layer, x)
            out.append({"error": (ep - ref).abs().max().item(), "calls": counter.calls, "send": send,
                        "dropped": layer.dropped, "assignments": tokens * top_k})
    return out


def ep_rows(demo: dict) -> list:
    """One row per capacity factor and rank: assignments dropped, the all-to-all calls counted, the bytes of
    the counts, dispatch and combine calls as counted beside the formula's, bytes sent off-rank, max error."""
    if not isinstance(demo, dict) or not demo.get("ok"):
        raise ConfigError("demo", type(demo).__name__, "the dict ep_demo returns, with ok True")
    rows = []
    for s in demo["settings"]:
        for r, (got, want) in enumerate(zip(s["ranks"], s["formula"])):
            sizes = [b for name, b in got["calls"] if name.startswith(("alltoall", "all_to_all"))]
            rows.append({"factor": s["factor"], "rank": r, "dropped": got["dropped"], "calls": len(sizes),
                         "counted": tuple(sizes), "formula": (want["counts"], want["dispatch"], want["combine"]),
                         "off_rank": want["off_rank"], "error": got["error"]})
    return rows


def ep_verdict(demo: dict) -> str:
    """'agree': on every rank and factor the EP output equals the one-process layer's (within ``TOLERANCE``)
    and the three all-to-alls' counted bytes equal the formula's; 'bytes_differ' or 'outputs_differ' else."""
    rows = ep_rows(demo)
    if any(r["error"] > TOLERANCE for r in rows):
        return "outputs_differ"
    return "agree" if all(r["counted"] == r["formula"] for r in rows) else "bytes_differ"


def ep_figures(demo: dict) -> dict:
    """The figures the chapter's sentences quote: ranks, backend, all-to-all calls per forward, the largest
    |EP - one process|, assignments dropped at the smallest factor, rank 0's rows as bytes (nothing dropped)."""
    rows = ep_rows(demo)
    tight, loose = min(s["factor"] for s in demo["settings"]), max(s["factor"] for s in demo["settings"])
    return {"world_size": demo["world_size"], "backend": demo["backend"], "n_experts": demo["n_experts"],
            "calls": max(r["calls"] for r in rows), "max_error": max(r["error"] for r in rows),
            "tight": tight, "dropped": sum(r["dropped"] for r in rows if r["factor"] == tight),
            "assignments": demo["world_size"] * demo["tokens"] * demo["top_k"],
            "rank0_rows_bytes": next(r["counted"][2] for r in rows if r["factor"] == loose),
            "buffer": demo["no_drop"]["buffer"]}


def drop_verdict(demo: dict) -> str:
    """At the smallest capacity factor: 'none_dropped'; 'shrank' when every rank's combine buffer (its own kept
    rows, back) is exactly (tokens * k - its dropped assignments) rows: a dropped assignment sends no bytes;
    'differ' else."""
    rows = ep_rows(demo)
    tight = [r for r in rows if r["factor"] == min(s["factor"] for s in demo["settings"])]
    if not any(r["dropped"] for r in tight):
        return "none_dropped"
    row = demo["d_model"] * 4
    full = demo["tokens"] * demo["top_k"]
    return "shrank" if all(r["counted"][2] == (full - r["dropped"]) * row for r in tight) else "differ"


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
    with intra_op_threads(1):  # tiny matmuls: one thread is as fast, and leaves the other cores alone
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


def balance_verdict(lab: dict) -> str:
    """'more_even' when the run with the balancing loss had its second-half imbalance below the other run's
    with the interquartile ranges apart; 'less_even' the other way round; 'no_clear_difference' else."""
    (a1, _, a3), (b1, _, b3) = (statistics.quantiles(late(lab[k]["imbalance"]), n=4, method="inclusive")
                                for k in ("off", "on"))
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
    return _labelled(fig, ax, "training step", "busiest expert / mean load",
                     "Measured: load imbalance while training, same seed and data")


def _labelled(fig, ax, xlabel, ylabel, title):
    """The two MoE charts' axis labels, legend and title, at their sizes."""
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
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
        with intra_op_threads(1):
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
    return [{"factor": f, "slots": capacity(x.numel(), m0.n_experts, m0.top_k, f),
             "balanced": balanced_drop_share(x.numel(), m0.n_experts, m0.top_k, f),
             **{name: dropped_share(m, x, y, f) for name, m in models.items()}} for f in factors]


def plot_capacity(rows: list, names, width: float = 7.0, height: float = 2.8):
    fig, ax = figure(width, height)
    xs = [r["factor"] for r in rows]
    ax.plot(xs, [100 * r["balanced"] for r in rows], "k:", marker="o", label="perfectly balanced (formula)")
    for name in names:
        ax.plot(xs, [100 * r[name] for r in rows], marker="o", label=f"{name} (measured)")
    return _labelled(fig, ax, "capacity factor", "assignments dropped (%)",
                     "Tokens dropped against the capacity factor, one real batch")
