"""Checkpoints of sharded (FSDP) models through torch.distributed.checkpoint, and one-file exports.

`ddpkit.save_checkpoint` comes here when the model is sharded: every rank writes its own shards of
the model and optimizer state (no rank gathers the full model) into a temporary directory, rank 0
adds the rest of the training state as `ddpkit.pt`, every rank hashes a share of the files, and
rank 0 renames the directory into place beside its manifest (ddpkit.checkpoint.files). Loading goes
through `get_state_dict`/`set_state_dict`, which reshard to the loading run's layout: another
world size, or an unsharded (DDP, one-process) model, loads the same directory.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpkit.checkpoint.files import CheckpointError, file_digest, rotate, write_checkpoint_dir
from ddpkit.collectives import all_gather_object, broadcast_object

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["PAYLOAD", "save_sharded", "read_payload", "load_sharded", "load_full", "check_metadata",
           "export_state_dict"]

PAYLOAD = "ddpkit.pt"
"""The file inside a sharded checkpoint with everything but the model and optimizer tensors."""


def _agree(ctx: Context, error: BaseException | None, what: str) -> None:
    """Raise on every rank if any rank failed `what`. Collective: the failing rank must not leave the rest waiting."""
    local = None if error is None else f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
    failures = [(r, f) for r, f in enumerate(all_gather_object(ctx, local)) if f]
    if failures:
        rank, first = failures[0]
        raise CheckpointError(f"{what} failed on rank {rank}: {first}") from error


def _state_dicts(model: torch.nn.Module, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return get_model_state_dict(model), None
    return get_state_dict(model, optimizer)


def save_sharded(ctx: Context, directory: str | os.PathLike, step: int, model: torch.nn.Module, optimizer: Any,
                 payload: dict[str, Any], manifest: dict[str, Any], keep_last: int | None) -> Path:
    """Write the sharded checkpoint of `step`, then rotate; return its path. Collective: every rank, same step.

    Raises CheckpointError on every rank when any rank fails; nothing is renamed into place then.
    """
    import torch
    import torch.distributed.checkpoint as dcp

    directory = Path(directory)
    tmp: str | None = None
    error: BaseException | None = None
    if ctx.is_main:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            tmp = str(directory / f".ckpt-{step:08d}.dcp.tmp-{os.getpid()}")
            os.mkdir(tmp)
        except OSError as e:
            error = e
    _agree(ctx, error, f"creating a checkpoint directory in {directory}")
    tmp_path = Path(broadcast_object(ctx, tmp))
    try:
        model_state, optim_state = _state_dicts(model, optimizer)
        state = {"model": model_state} if optim_state is None else {"model": model_state, "optimizer": optim_state}
        # Each rank writes only its own shards; rank 0 writes the metadata after all have written.
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path)))
        if ctx.is_main:
            with open(tmp_path / PAYLOAD, "wb") as f:
                torch.save(payload, f)
                f.flush()
                os.fsync(f.fileno())
    except Exception as e:
        error = e
    _agree(ctx, error, f"writing checkpoint step {step} into {tmp_path}")
    names = broadcast_object(ctx, sorted(p.name for p in tmp_path.iterdir()) if ctx.is_main else None)
    # Hashing is shared out: rank r hashes every W-th file, so no rank reads the whole checkpoint.
    digests: dict[str, Any] = {}
    try:
        digests = {n: file_digest(tmp_path / n) for n in names[ctx.rank::ctx.world_size]}
    except OSError as e:
        error = e
    _agree(ctx, error, f"hashing checkpoint step {step} in {tmp_path}")
    files: dict[str, Any] = {}
    for part in all_gather_object(ctx, digests):
        files.update(part)
    result: tuple[bool, str] | None = None
    if ctx.is_main:
        try:
            path = write_checkpoint_dir(directory, step, tmp_path, files, manifest)
            rotate(directory, path, keep_last)
            result = (True, str(path))
        except Exception as e:
            result = (False, f"{type(e).__name__}: {e}")
    ok, message = broadcast_object(ctx, result)
    if not ok:
        raise CheckpointError(f"publishing checkpoint step {step} in {directory} failed on rank 0: {message}; the "
                              "previous checkpoints are intact")
    return Path(message)


_SAFE_MODULES = ("torch.distributed.checkpoint.",)
_SAFE_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                 ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
                 ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module.startswith(_SAFE_MODULES) or (module, name) in _SAFE_GLOBALS or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")


def check_metadata(path: Path) -> None:
    """Refuse a checkpoint whose DCP metadata pickle names anything but DCP's own metadata classes.

    torch.distributed.checkpoint reads `.metadata` with plain pickle; reading it first with this
    allow-list keeps ddpkit's rule that loading a checkpoint never runs code from it.
    """
    try:
        with open(path / ".metadata", "rb") as f:
            _MetadataUnpickler(f).load()
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"refused to load {path}: its .metadata holds pickled objects other than "
                              f"torch.distributed.checkpoint's metadata ({e}); ddpkit never runs code from a "
                              "checkpoint") from None
    except (OSError, EOFError) as e:
        raise CheckpointError(f"{path}/.metadata is unreadable ({type(e).__name__}: {e})") from None


def read_payload(path: Path) -> dict[str, Any]:
    """The training state (everything but model and optimizer tensors) of a sharded checkpoint."""
    import torch

    check_metadata(path)
    try:
        return torch.load(path / PAYLOAD, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"refused to load {path / PAYLOAD}: it holds pickled objects other than tensors and "
                              f"plain data ({' '.join(str(e).split())[:200]})") from None


def load_sharded(path: Path, model: torch.nn.Module, optimizer: Any, strict: bool) -> None:
    """Load a sharded checkpoint's model (and optimizer) state into `model`, sharded or not, on any world size.

    Collective when the model is sharded or a process group exists (torch.distributed.checkpoint's
    planning); every rank must call it.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    model_state, optim_state = _state_dicts(model, optimizer)
    state = {"model": model_state} if optim_state is None else {"model": model_state, "optimizer": optim_state}
    planner = dcp.DefaultLoadPlanner(allow_partial_load=not strict)
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), planner=planner)
    options = StateDictOptions(strict=strict)
    if optim_state is None:
        set_model_state_dict(model, state["model"], options=options)
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=options)


def load_full(model: torch.nn.Module, optimizer: Any, model_state: dict[str, Any],
              optim_state: dict[str, Any] | None, strict: bool) -> None:
    """Load a full (unsharded, as DDP saves it) model and optimizer state into a sharded model. Collective.

    The optimizer state's parameters are numbered in the optimizer's order, as `optimizer.state_dict()`
    numbers them; they are renamed to the parameters' names, which `set_state_dict` expects.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    options = StateDictOptions(full_state_dict=True, strict=strict)
    if optimizer is None:
        set_model_state_dict(model, model_state, options=options)
        return
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved_ids = [i for group in optim_state["param_groups"] for i in group["params"]]
    if len(saved_ids) != len(order):
        raise CheckpointError(f"the checkpoint's optimizer state covers {len(saved_ids)} parameters but this "
                              f"optimizer has {len(order)}; build the optimizer the run was saved with")
    fqn = dict(zip(saved_ids, order))
    by_name = {"state": {fqn[i]: s for i, s in optim_state["state"].items()},
               "param_groups": [{**g, "params": [fqn[i] for i in g["params"]]} for g in optim_state["param_groups"]]}
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=by_name, options=options)


def export_state_dict(ctx: Context, model: torch.nn.Module, path: str | os.PathLike) -> Path:
    """Write the model's full state_dict to one file for inference (`torch.load(path)` reads it). Collective.

    Works for every strategy: a sharded model's shards are gathered to rank 0 one tensor at a time
    (to CPU), the other ranks keep nothing; rank 0 writes a temporary file and renames it into
    place. Keys are the unwrapped module's (no `module.`/`_orig_mod.` prefixes).
    """
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from ddpkit.parallel.strategy import is_sharded
    from ddpkit.parallel.strategy import unwrap

    path = Path(path)
    error: BaseException | None = None
    state = None
    try:
        if is_sharded(model):
            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        elif ctx.is_main:
            state = {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}
    except Exception as e:
        error = e
    _agree(ctx, error, "gathering the model's state_dict")
    result: tuple[bool, str] | None = None
    if ctx.is_main:
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            result = (True, str(path))
        except Exception as e:
            tmp.unlink(missing_ok=True)
            result = (False, f"{type(e).__name__}: {e}")
    ok, message = broadcast_object(ctx, result)
    if not ok:
        raise CheckpointError(f"exporting the state_dict to {path} failed on rank 0: {message}")
    return Path(message)
