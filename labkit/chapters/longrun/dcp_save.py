"""The checkpoint code a learner writes at work (taught in chapter 11, shown as ``lr.dcp.<name>``): a sharded
(FSDP2) or plain model and its optimizer saved and loaded with ``torch.distributed.checkpoint`` (DCP),
synchronously or with ``async_save``. Plain torch; ``dcp.dcp_demo`` measures it.
"""
from __future__ import annotations

import torch.distributed as dist


def save_checkpoint(model, optimizer, folder, process_group=None):
    """Save a model (sharded or not) and its optimizer to ``folder`` with DCP: each rank writes its shards.
    Shown in 11_long_runs_and_failures (code-11-dcp)."""
    import torch.distributed.checkpoint as dcp  # deferred: 2-3 s to import on a CPU
    from torch.distributed.checkpoint.state_dict import get_state_dict  # deferred: as above

    # keyed by parameter name (FQN); under FSDP2 every tensor is a DTensor: this rank's shard + its place
    model_sd, optim_sd = get_state_dict(model, optimizer)
    # every rank writes one file of its own shards (__<rank>_0.distcp), in parallel; rank 0 adds .metadata
    # (which slice of which tensor is where). No process group (one process): no_dist, no collectives
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder, process_group=process_group,
             no_dist=not dist.is_initialized())


def load_checkpoint(model, optimizer, folder):
    """Load ``folder`` into ``model`` and ``optimizer``, whatever world size (and sharding) wrote it.
    Shown in 11_long_runs_and_failures (code-11-dcp)."""
    import torch.distributed.checkpoint as dcp  # deferred: 2-3 s to import on a CPU
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # deferred: as above

    # the state dicts of THIS model's layout say what this rank must fill: its shards, or whole tensors
    model_sd, optim_sd = get_state_dict(model, optimizer)  # (a fresh optimizer's state is created here)
    state = {"model": model_sd, "optim": optim_sd}
    # in place: each rank reads every stored chunk that overlaps its shard and keeps the overlap (resharding)
    dcp.load(state, checkpoint_id=folder, no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def async_checkpoint(model, optimizer, folder, pending, process_group):
    """Start saving ``folder`` in the background; returns the future to wait on before the next save.
    Shown in 11_long_runs_and_failures (code-11-async-save)."""
    import torch.distributed.checkpoint as dcp  # deferred: 2-3 s to import on a CPU
    from torch.distributed.checkpoint.state_dict import get_state_dict  # deferred: as above

    if pending is not None:
        pending.result()  # one save in flight at a time: two would double the CPU copies and their collectives
    model_sd, optim_sd = get_state_dict(model, optimizer)
    # with no async_stager, DCP's default stager blocks while it copies the state to CPU memory (staging:
    # training may change the weights after that; on GPUs a DefaultStager(StagingOptions()) stages in the
    # background with pinned memory instead, and the loop waits only before its next optimizer step);
    # a thread then plans and writes, its collectives on process_group -- a gloo group of its own, so they
    # never interleave with the training loop's on the default group
    return dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder,
                          process_group=process_group)


def train_with_async_saves(model, optimizer, batches, every, folder_for):
    """A training loop that checkpoints every ``every`` updates without waiting for the files.
    Shown in 11_long_runs_and_failures (code-11-async-save)."""
    group = dist.new_group(backend="gloo")  # async_save needs a CPU group; one of its own (see above)
    pending = None
    for step, (x, y) in enumerate(batches, start=1):
        model(x, y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % every == 0:
            pending = async_checkpoint(model, optimizer, folder_for(step), pending, group)
    if pending is not None:
        pending.result()  # before exiting: a save still writing is a checkpoint that is not there yet
    dist.destroy_process_group(group)
