"""Save and resume the whole training state: rank 0 writes atomically, every rank loads onto its own device.

    ckpt = ddpkit.load_checkpoint(ctx, "ckpt", model=model, optimizer=opt, loader=train)  # None if none
    step = ckpt["step"] if ckpt else 0
    ...
        if train.step_end and step % 100 == 0:
            ddpkit.save_checkpoint(ctx, "ckpt", step=step, model=model, optimizer=opt, loader=train)

What is saved: the unwrapped model, optimizer, scheduler, grad scaler, step, epoch, the loader's
position inside the epoch and its data seed, and every rank's RNG states. Resuming on the same
world size continues bit-identically (same samples in the same order, same random streams).
A sharded (FSDP) model is saved as a torch.distributed.checkpoint directory instead, each rank
writing its own shards (ddpkit.checkpoint.sharded); either kind loads into either strategy.
Resuming on another world size with the same global batch continues from the same global sample
position: rank r < old world size takes old rank r's RNG streams, new ranks get fresh seeds
(`ddpkit.rng.resumed_rank_seed`), so results match an uninterrupted run up to float reduction order
and, with randomness in the model (dropout), in distribution only.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpkit.checkpoint.files import (
    FORMAT,
    CheckpointError,
    CheckpointWarning,
    latest_checkpoint,
    rotate,
    verify_checkpoint,
    write_checkpoint_files,
)
from ddpkit.collectives import all_gather_object, broadcast_object

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "verify_checkpoint",
    "CheckpointError",
    "CheckpointWarning",
]

_PLAIN = (type(None), bool, int, float, str, bytes)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if isinstance(e, CheckpointError) else f"{type(e).__name__}: {text[:400]}"


def _check_plain(obj: Any, where: str) -> None:
    """Refuse at save time what `torch.load(weights_only=True)` would refuse at load time."""
    import torch

    if isinstance(obj, (_PLAIN, torch.Tensor, torch.dtype, torch.device)):
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, _PLAIN):
                raise TypeError(f"checkpoint key {where}[{key!r}] is a {type(key).__name__}; use str or int keys")
            _check_plain(value, f"{where}[{key!r}]")
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _check_plain(value, f"{where}[{i}]")
        return
    raise TypeError(
        f"checkpoint value {where} is a {type(obj).__module__}.{type(obj).__qualname__}; checkpoints hold "
        "only tensors and plain values (dict, list, tuple, str, int, float, bool, None) so that they load "
        "with weights_only=True: convert it (float(x), x.tolist(), obj.state_dict())"
    )


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step={step!r} must be an int >= 0 (the number of optimizer steps taken)")
    return step


def save_checkpoint(
    ctx: Context,
    directory: str | os.PathLike,
    *,
    step: int,
    model: torch.nn.Module,
    optimizer: Any = None,
    scheduler: Any = None,
    scaler: Any = None,
    loader: Any = None,
    epoch: int | None = None,
    extra: dict[str, Any] | None = None,
    keep_last: int | None = 3,
) -> Path:
    """Write `directory/ckpt-{step:08d}.pt` and its manifest; return the path. Collective.

    Every rank must call it at the same step: each contributes its RNG states, rank 0 writes
    (temporary file, fsync, sha256, rename, fsync the directory), then keeps the `keep_last`
    newest checkpoints. If rank 0's write fails, every rank raises CheckpointError and the previous
    checkpoints are untouched. Call it after an optimizer step (with a loader, when
    `loader.step_end` is True); `extra` takes plain values (tensors, numbers, strings, lists,
    dicts) to get back from load_checkpoint. With several nodes, `directory` must be on a
    filesystem every node sees.
    """
    import torch

    from ddpkit.rng import rng_state

    step = _check_step(step)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"save_checkpoint(model=...) needs a torch.nn.Module, got {type(model).__name__}")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
        raise ValueError(f"keep_last={keep_last!r} must be an int >= 1, or None to keep every checkpoint")
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"extra={type(extra).__name__} must be a dict of plain values, e.g. extra={{'best_acc': 0.9}}")
    loader_state = loader.state_dict() if loader is not None else None  # raises mid-accumulation, on every rank
    if epoch is None and loader_state is not None:
        epoch = loader_state["epoch"]
    # Every rank's generators: restoring them is what makes dropout and augmentation after a resume
    # identical to an uninterrupted run.
    rng = all_gather_object(ctx, rng_state(ctx.device))

    from ddpkit.parallel.strategy import is_sharded

    if is_sharded(model):
        from ddpkit.checkpoint.sharded import save_sharded

        payload, manifest = _payload(ctx, step, epoch, None, optimizer, scheduler, scaler, loader, loader_state, rng,
                                     extra)
        payload["optimizer"] = "sharded" if optimizer is not None else None  # its tensors are in the shards
        return save_sharded(ctx, directory, step, model, optimizer, payload, manifest, keep_last)
    outcome: tuple[bool, str] | None = None
    error: Exception | None = None
    if ctx.is_main:
        try:
            outcome = (True, str(_write(ctx, directory, step, epoch, model, optimizer, scheduler, scaler,
                                        loader, loader_state, rng, extra, keep_last)))
        except Exception as e:
            error = e
            outcome = (False, f"saving checkpoint step {step} in {directory} failed on rank 0: {_one_line(e)}; "
                              "the previous checkpoints are intact")
    # The broadcast is the barrier after the write: no rank goes on (or exits, or gets killed by a
    # failing peer) before the checkpoint is durable, and a failed write reaches every rank as an
    # error instead of leaving some rank waiting on a peer that has already given up.
    # Waiting here for rank 0's write is no hang, however large the checkpoint: the hang watchdog's
    # clock stops meanwhile.
    from ddpkit.hang.watchdog import running_watchdog

    watchdog = running_watchdog()
    with watchdog.expected_wait() if watchdog is not None else contextlib.nullcontext():
        ok, message = broadcast_object(ctx, outcome)
    if not ok:
        raise CheckpointError(message) from error
    return Path(message)


def _write(ctx, directory, step, epoch, model, optimizer, scheduler, scaler, loader, loader_state, rng, extra,
           keep_last) -> Path:
    import torch

    from ddpkit.parallel.strategy import unwrap

    payload, manifest = _payload(ctx, step, epoch, _compact(unwrap(model).state_dict()), optimizer, scheduler, scaler,
                                 loader, loader_state, rng, extra)
    payload["optimizer"] = optimizer.state_dict() if optimizer is not None else None
    path = write_checkpoint_files(directory, step, lambda f: torch.save(payload, f), manifest)
    rotate(directory, path, keep_last)
    return path


def _payload(ctx, step, epoch, model_state, optimizer, scheduler, scaler, loader, loader_state, rng, extra):
    """(payload, manifest) of a checkpoint; model and optimizer tensors are left to the caller."""
    import datetime

    import torch

    from ddpkit.version import __version__

    payload = {
        "format": FORMAT,
        "step": step,
        "epoch": epoch,
        "world_size": ctx.world_size,
        "seed": ctx.seed,
        "global_batch_size": loader.global_batch_size if loader is not None else None,
        "model": model_state,
        "optimizer": None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "loader": loader_state,
        "rng": rng,
        "extra": dict(extra or {}),
        "classes": {name: _class_name(obj) for name, obj in
                    (("optimizer", optimizer), ("scheduler", scheduler)) if obj is not None},
    }
    _check_plain(payload, "checkpoint")
    manifest = {
        "step": step, "epoch": epoch, "world_size": ctx.world_size,
        "global_batch_size": payload["global_batch_size"], "torch_version": torch.__version__,
        "ddpkit_version": __version__,
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return payload, manifest


def load_checkpoint(
    ctx: Context,
    source: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: Any = None,
    scheduler: Any = None,
    scaler: Any = None,
    loader: Any = None,
    strict: bool = True,
    restore_rng: bool = True,
) -> dict[str, Any] | None:
    """Restore the state `save_checkpoint` wrote into the given objects; return its metadata. Collective.

    `source` is a directory (its newest valid checkpoint is used; None is returned when there is
    none yet, so "resume if possible" is this one call) or a checkpoint file (which must verify).
    Rank 0 picks and verifies the file: a corrupt or truncated newest checkpoint is skipped with a
    CheckpointWarning and the previous valid one is used. Every rank then loads it to the CPU with
    torch.load(weights_only=True), and each object's load_state_dict puts its tensors where they
    belong (parameters on the rank's device): a file carrying pickled code is refused
    (CheckpointError), never executed. Returns {"path", "step", "epoch", "extra", "world_size",
    "global_batch_size", "loader"}.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"load_checkpoint(model=...) needs a torch.nn.Module, got {type(model).__name__}")
    found: tuple[bool, str | None] | None = None
    if ctx.is_main:
        try:
            found = (True, _resolve(Path(source)))
        except Exception as e:  # any failure must reach the other ranks, which wait in the broadcast
            found = (False, _one_line(e) if isinstance(e, CheckpointError) else
                     f"finding a checkpoint at {source} failed on rank 0: {_one_line(e)}")
    # Rank 0 decides which file every rank loads: ranks that verified on their own could pick
    # different files while rank 0 is still writing, and would read the whole file N times.
    ok, value = broadcast_object(ctx, found)
    if not ok:
        raise CheckpointError(value)
    if value is None:
        return None
    path, error, meta = Path(value), None, None
    try:
        meta = _apply(ctx, path, model, optimizer, scheduler, scaler, loader, strict)
    except Exception as e:
        error = e
    local = None
    if error is not None:
        local = _one_line(error) if isinstance(error, CheckpointError) else f"loading {path} failed: {_one_line(error)}"
    # Every rank learns whether every rank loaded: a rank that failed alone must not leave the
    # others to train (and hang at the first all-reduce) with it gone.
    failures = [(r, f) for r, f in enumerate(all_gather_object(ctx, local)) if f]
    if failures:
        rank, first = failures[0]
        where = f" [rank {rank}; {len(failures)} of {ctx.world_size} ranks failed]" if ctx.distributed else ""
        raise CheckpointError(first + where) from error
    states = meta.pop("_rng")
    if restore_rng:
        _restore_rng(ctx, states, meta["step"])
    return meta


def _resolve(source: Path) -> str | None:
    if source.suffix == ".dcp" and source.is_dir():  # one sharded checkpoint, named directly
        verify_checkpoint(source)
        return str(source)
    if source.is_dir() or (not source.exists() and source.suffix != ".pt"):
        latest = latest_checkpoint(source)
        return None if latest is None else str(latest)
    if not source.is_file():
        raise CheckpointError(f"checkpoint file {source} does not exist; pass an existing file or its directory")
    verify_checkpoint(source)
    return str(source)


_UNSAFE = re.compile(r"GLOBAL ([\w.]+)|[Uu]nsupported operand \S+|[Uu]nsupported class ([\w.]+)")


def _load_file(path: Path) -> dict[str, Any]:
    import pickle

    import torch

    try:
        # To the CPU, whatever the rank's device: each load_state_dict then places its own tensors.
        # Optimizers put their states beside the parameters but keep Adam's `step` counters on the
        # CPU (unless capturable/fused); loaded straight to cuda:r, those counters would stay on the
        # GPU and every step would wait for the GPU to read them.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        match = _UNSAFE.search(str(e))
        what = f" ({match.group(0)})" if match else ""
        raise CheckpointError(
            f"refused to load {path}: it holds pickled objects other than tensors and plain data{what}; "
            "ddpkit loads checkpoints with weights_only=True and never runs code from them; re-save it with "
            "ddpkit.save_checkpoint, or load it yourself with weights_only=False only if you trust its source"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path} has format {found!r}, not {FORMAT!r}; it was not written by ddpkit.save_checkpoint")
    return state


def _compact(state: dict[str, Any]) -> dict[str, Any]:
    """`state` with every tensor that views a larger storage (a parameter carved out of one flat
    buffer) copied out: torch.save writes a view's whole storage."""
    import torch

    return {k: v.clone() if isinstance(v, torch.Tensor) and v.untyped_storage().nbytes() != v.nbytes else v
            for k, v in state.items()}


def _apply(ctx, path, model, optimizer, scheduler, scaler, loader, strict) -> dict[str, Any]:
    from ddpkit.checkpoint import sharded as ckptshards
    from ddpkit.parallel.strategy import is_sharded
    from ddpkit.parallel.strategy import unwrap

    sharded_file = path.is_dir()
    state = ckptshards.read_payload(path) if sharded_file else _load_file(path)
    saved_classes = state.get("classes") or {}  # absent in checkpoints of ddpkit 0.1
    for name, obj in (("optimizer", optimizer), ("scheduler", scheduler)):
        saved = saved_classes.get(name)
        if obj is not None and saved is not None and saved != _class_name(obj):
            raise CheckpointError(
                f"{path} holds the state of a {saved} {name} but load_checkpoint got {name}={_class_name(obj)}; build "
                f"the {name} the run was saved with (or leave {name}= out and start a fresh one)")
    if optimizer is not None and state.get("optimizer") is None:
        raise CheckpointError(f"{path} holds no optimizer state but load_checkpoint got optimizer=; pass "
                              "optimizer=None, or save with save_checkpoint(..., optimizer=...)")
    if sharded_file:  # model and optimizer shards, resharded to this run's layout and strategy
        ckptshards.load_sharded(path, model, optimizer, strict)
    elif is_sharded(model):
        ckptshards.load_full(model, optimizer, state["model"], state["optimizer"], strict)
    else:
        # save_checkpoint stores unwrap(model)'s state, so the keys match unwrap(model) here as they are.
        unwrap(model).load_state_dict(state["model"], strict=strict)
    for name, obj in (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler), ("loader", loader)):
        if obj is None or name == "optimizer" and (sharded_file or is_sharded(model)):
            continue
        if state.get(name) is None:
            raise CheckpointError(
                f"{path} holds no {name} state but load_checkpoint got {name}=; pass {name}=None, or save "
                f"with save_checkpoint(..., {name}=...)"
            )
        obj.load_state_dict(state[name])
    return {
        "path": path, "step": state["step"], "epoch": state["epoch"], "extra": state.get("extra") or {},
        "world_size": state["world_size"], "global_batch_size": state.get("global_batch_size"),
        "loader": state.get("loader"), "_rng": state.get("rng") or [],
    }


def _class_name(obj: Any) -> str:
    """The optimizer's or scheduler's class name."""
    return type(obj).__name__


def _restore_rng(ctx, states: list[dict[str, Any]], step: int) -> None:
    """Rank r continues saved rank r's streams; a rank the saved run did not have gets fresh ones."""
    from ddpkit.rng import resumed_rank_seed, seed_everything, set_rng_state

    if ctx.rank < len(states):
        set_rng_state(states[ctx.rank], ctx.device)
    else:
        seed_everything(resumed_rank_seed(ctx.seed, ctx.rank, step))
