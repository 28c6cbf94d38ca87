"""Instrument one rank for `ddpkit check`: record steps, data samples, collectives and saves as JSON lines.

Everything recorded goes to this rank's own file (one JSON object per line, flushed at once, so a
killed rank leaves its record behind); nothing is sent over the user's process group. The parent
compares the ranks' files afterwards (ddpkit.check.analysis).
"""

from __future__ import annotations

import hashlib
import os
import sys
import weakref
from json import dumps  # bound here: the output probes patch json.dumps, which the record must not go through
from typing import Any

from ddpkit.check.outputs import OutputProbes
from ddpkit.hang import tracer
from ddpkit.check.samples import fingerprint, source
from ddpkit.parallel.strategy import full_tensor

__all__ = ["Recorder", "StopCheck"]


class StopCheck(BaseException):
    """Raised from the optimizer-step hook after --max-steps; BaseException so `except Exception` lets it by."""


def _parameters(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _hash_tensors(tensors) -> str:
    """A short digest of the tensors' dtypes, shapes and bytes: equal digests mean bit-identical tensors.

    An FSDP shard (DTensor) is hashed as the full tensor, so replicas compare whole parameters:
    an all-gather, which the optimizer-step hooks issue on every rank alike.
    """
    import torch

    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"<none>")
            continue
        t = full_tensor(t.detach()).cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _number(value: Any) -> float | None:
    """A learning rate as a float (a tensor lr too), None when it is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


class Recorder:
    """Installs the probes of one rank and writes its events to `path`."""

    def __init__(self, path: str, *, max_steps: int, epoch_steps: int):
        self.max_steps, self.epoch_steps = max_steps, epoch_steps
        self.steps = 0
        self._file = open(path, "a", buffering=1)
        self._loaders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._iterations: dict[int, int] = {}
        self._ddp_forwards = 0
        self._synced_forwards = 0
        self._pre: dict[int, tuple[str, str]] = {}
        self._datasets: dict[int, tuple[int, Any]] = {}  # id -> (ordinal, the dataset, kept alive)
        self._restore: list[tuple[Any, str, Any]] = []
        self._hooks: list[Any] = []
        self._outputs = OutputProbes(self.write)

    def write(self, event: str, **fields: Any) -> None:
        self._file.write(dumps({"ev": event, **fields}) + "\n")

    # tracer.Listener: record at entry, so a rank stuck inside still has the call on record
    def enter(self, call: tracer.Call) -> None:
        self.write("collective", i=call.index, op=call.op, shapes=call.shapes, site=call.site, step=self.steps)

    def exit(self, call: tracer.Call) -> None:
        pass

    def _patch(self, owner: Any, name: str, make) -> None:
        original = getattr(owner, name)
        self._restore.append((owner, name, original))
        setattr(owner, name, make(original))

    def install(self) -> None:
        import torch
        import torch.optim.optimizer as optim
        from torch.distributed.algorithms.join import Join
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import dataloader

        tracer.install(self)
        self._hooks.append(optim.register_optimizer_step_pre_hook(self._pre_step))
        self._hooks.append(optim.register_optimizer_step_post_hook(self._post_step))
        rec = self

        def ddp_forward(original):
            def forward(module, *args, **kwargs):
                rec._ddp_forwards += 1
                rec._synced_forwards += bool(module.require_backward_grad_sync)
                return original(module, *args, **kwargs)
            return forward

        def loader_iter(original):
            def __iter__(loader):
                it = original(loader)
                rec._start_iteration(loader, it, sys._getframe(1))
                return it
            return __iter__

        def next_index(original):
            def _next_index(it):
                state = getattr(it, "_ddpkit_iteration", None)
                if state is not None and rec.epoch_steps and rec.steps - state["step0"] >= rec.epoch_steps:
                    if not state["truncated"]:
                        state["truncated"] = True
                        rec.write("epoch_cut", loader=state["loader"], iter=state["iter"], steps=rec.steps)
                    raise StopIteration
                try:
                    index = original(it)
                except StopIteration:
                    if state is not None:
                        rec.write("epoch_end", loader=state["loader"], iter=state["iter"], steps=rec.steps)
                    raise
                if state is not None:
                    flat = index if isinstance(index, (list, tuple)) else [index]
                    idx = [int(i) for i in flat if isinstance(i, int)]
                    rec.write("batch", loader=state["loader"], iter=state["iter"], step=rec.steps, idx=idx,
                              src=[rec._source(state["dataset"], i) for i in idx])
                return index
            return _next_index

        def save(original):
            def save_(obj, f, *args, **kwargs):
                path = os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
                rec.write("save", path=path if isinstance(path, str) else None, site=tracer.user_site(sys._getframe(1)))
                return original(obj, f, *args, **kwargs)
            return save_

        def join_init(original):
            def __init__(join, joinables, *args, **kwargs):
                if args[0] if args else kwargs.get("enable", True):
                    rec.write("join", site=tracer.user_site(sys._getframe(1)))
                return original(join, joinables, *args, **kwargs)
            return __init__

        self._patch(DistributedDataParallel, "forward", ddp_forward)
        self._patch(Join, "__init__", join_init)
        self._patch(torch.utils.data.DataLoader, "__iter__", loader_iter)
        self._patch(dataloader._BaseDataLoaderIter, "_next_index", next_index)
        self._patch(torch, "save", save)
        self._outputs.install()

    def uninstall(self) -> None:
        self._outputs.uninstall()
        tracer.uninstall(self)
        for handle in self._hooks:
            handle.remove()
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    def _source(self, dataset, index: int) -> list[int]:
        """[dataset ordinal, index] of the sample behind `dataset[index]` (see ddpkit.check.samples)."""
        base, j = source(dataset, index)
        ordinal = self._datasets.setdefault(id(base), (len(self._datasets), base))[0]
        return [ordinal, j]

    def _start_iteration(self, loader, it, frame) -> None:
        from torch.utils.data import DistributedSampler, IterableDataset

        ordinal = self._loaders.setdefault(loader, len(self._iterations))
        n = self._iterations[ordinal] = self._iterations.get(ordinal, -1) + 1
        sampler = loader.sampler
        inner = getattr(loader.batch_sampler, "sampler", None)
        dist_sampler = next((s for s in (sampler, inner) if isinstance(s, DistributedSampler)), None)
        info: dict[str, Any] = {"sampler": type(inner if inner is not None else sampler).__name__,
                                "batch_size": loader.batch_size}
        try:
            info["dataset_len"] = len(loader.dataset)
        except TypeError:
            info["dataset_len"] = None
        if not isinstance(loader.dataset, IterableDataset):
            try:
                info["batches"] = len(loader)  # batches this rank's epoch will have
            except (TypeError, NotImplementedError):  # a batch sampler without a length
                pass
        if dist_sampler is not None:
            info.update(distributed=True, shuffle=dist_sampler.shuffle, epoch=dist_sampler.epoch,
                        drop_last=dist_sampler.drop_last, num_samples=dist_sampler.num_samples,
                        total_size=dist_sampler.total_size, num_replicas=dist_sampler.num_replicas)
        it._ddpkit_iteration = {"loader": ordinal, "iter": n, "step0": self.steps, "truncated": False,
                                "dataset": loader.dataset}
        self.write("epoch_start", loader=ordinal, iter=n, step=self.steps, site=tracer.user_site(frame), **info)

    def _pre_step(self, optimizer, args, kwargs) -> None:
        params = _parameters(optimizer)
        self._pre[id(optimizer)] = (_hash_tensors(params), _hash_tensors([p.grad for p in params]))

    def _post_step(self, optimizer, args, kwargs) -> None:
        self.steps += 1
        before, grads = self._pre.pop(id(optimizer), ("", ""))
        self.write("step", n=self.steps, site=tracer.user_site(sys._getframe(1)), optimizer=type(optimizer).__name__,
                   params_before=before, grads=grads, params_after=_hash_tensors(_parameters(optimizer)),
                   ddp_forwards=self._ddp_forwards, synced_forwards=self._synced_forwards,
                   lrs=[_number(g.get("lr")) for g in optimizer.param_groups])
        self._ddp_forwards = self._synced_forwards = 0
        if self.max_steps and self.steps >= self.max_steps:
            raise StopCheck(self.steps)

    def close(self, status: str, **fields: Any) -> None:
        # Fingerprint the datasets now, after training, not when first seen: fetching samples in the
        # main process before the loader forks its workers could change what the script does (a file
        # handle opened here and inherited by every worker).
        for ordinal, dataset in sorted(self._datasets.values(), key=lambda item: item[0]):
            self.write("dataset", ds=ordinal, **fingerprint(dataset))
        self.write("end", status=status, steps=self.steps, **fields)
        self._file.close()
