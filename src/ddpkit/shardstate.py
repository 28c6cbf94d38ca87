"""Where a sharded optimizer's parameters and optimizer state live: shared segments, cut per rank.

ddpkit.optim's shard_optimizer builds one `Shard` per optimizer. The shard translates between the
optimizer's per-piece state and the unsharded state dict, which any one rank can read.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Shard", "options", "WHAT", "FIX"]

WHAT, FIX = "shard_optimizer()", "step the optimizer unsharded otherwise"
"""How a failure to map a segment is worded (see ddpkit.shm.map_segment)."""


def options(group: dict[str, Any]) -> dict[str, Any]:
    """A parameter group's settings, without its parameters."""
    return {k: v for k, v in group.items() if k != "params"}


class Shard:
    """This rank's share of the parameters, and where the optimizer state of every share lives.

    The state segment holds, per per-element key, one region laid out like the parameters, then
    per (parameter, rank, scalar key) an 8-byte slot, then per (parameter, rank) a byte saying
    whether that rank's piece of the parameter has state yet.
    """

    def __init__(self, params, views, offsets, total, group_params, group_keys, rank, world, barrier) -> None:
        """Maps the state segment: a collective."""
        import torch

        from ddpkit.shm import map_segment

        self.params, self.rank, self.world = params, rank, world
        self._barrier = barrier
        self._words = {call: (f"in optimizer.{call}() for rank {{peer}}",
                              f"skipped a {call}() (every rank must call {call}() of a sharded optimizer as often as "
                              "the others)") for call in ("step", "load_state_dict")}
        elementwise = list(dict.fromkeys(k for keys, _ in group_keys for k in keys))
        self.scalar_dtypes: dict[str, Any] = {}
        for _, scalars in group_keys:
            self.scalar_dtypes.update(scalars)
        self.scalar_keys = list(self.scalar_dtypes)
        self.group_of = {i: g for g, ids in enumerate(group_params) for i in ids}
        self.group_params, self.group_keys = group_params, group_keys
        self._ptrs = [p.data_ptr() for p in params]
        n = len(params)
        size = len(elementwise) * total + n * world * (len(self.scalar_keys) * 8 + 1)
        self._arena = arena = map_segment(size, required=True, what=WHAT, fix=FIX)[1]
        base = arena.numel() - size  # after the barrier's header lines
        self._regions = {k: arena[base + j * total: base + (j + 1) * total] for j, k in enumerate(elementwise)}
        self._offsets = offsets
        self._scalar_base = base + len(elementwise) * total
        flag_base = self._scalar_base + n * world * len(self.scalar_keys) * 8
        self.flags = arena[flag_base:flag_base + n * world]
        # This rank's contiguous range of the parameters' elements, cut into pieces at their borders.
        numel = sum(p.numel() for p in params)
        share = -(-numel // world)
        lo, hi = min(rank * share, numel), min((rank + 1) * share, numel)
        self.pieces, self.where, self.group_pieces = [], [], [[] for _ in group_params]
        start = 0
        for i, v in enumerate(views):
            a, b = max(lo - start, 0), min(hi - start, v.numel())
            if a < b:
                self.group_pieces[self.group_of[i]].append(len(self.pieces))
                self.pieces.append(v.view(-1)[a:b])
                self.where.append((i, a, b))
            start += v.numel()
        self._targets: list[dict[str, torch.Tensor]] = []
        for piece, (i, a, b) in zip(self.pieces, self.where):
            keys, scal = group_keys[self.group_of[i]]
            t = {k: self.region(k, i)[a:b] for k in keys}
            t.update({k: self.slot(i, rank, k) for k in scal})
            self._targets.append(t)

    def barrier(self, call: str) -> None:
        """Wait for every rank inside the optimizer's `call` (the name words the error if one never comes)."""
        b = self._barrier
        b.waiting, b.skipped = self._words[call]
        b.wait()

    def region(self, key: str, i: int):
        """Parameter i's whole per-element state `key` (flat), shared by every rank."""
        p = self.params[i]
        o = self._offsets[i]
        return self._regions[key][o:o + p.numel() * p.element_size()].view(p.dtype)

    def slot(self, i: int, rank: int, key: str):
        o = self._scalar_base + ((i * self.world + rank) * len(self.scalar_keys) + self.scalar_keys.index(key)) * 8
        dtype = self.scalar_dtypes[key]
        return self._arena[o:o + 8].view(dtype)[0]

    def before_step(self, optimizer, args, kwargs) -> None:
        rest = args[1:] if args and args[0] is optimizer else args  # torch passes step()'s self along
        if any(a is not None for a in rest) or kwargs.get("closure") is not None:
            raise TypeError("a sharded optimizer's step() takes no closure: run forward and backward before step()")
        for i, p in enumerate(self.params):
            if p.data_ptr() != self._ptrs[i]:
                raise RuntimeError(
                    f"parameter {i} {tuple(p.shape)} no longer lives in the shared segment shard_optimizer() put it "
                    "in (was the model moved, or its parameters replaced, e.g. load_state_dict(assign=True)?); "
                    "copy values in place instead")
        self.barrier("step")  # every rank's backward (which reads the parameters) is done
        for piece, (i, a, b) in zip(self.pieces, self.where):
            g = self.params[i].grad
            piece.grad = None if g is None else g.reshape(-1)[a:b]

    def after_step(self, optimizer, args, kwargs) -> None:
        self.publish(optimizer.state)
        self.barrier("step")  # every rank's update is done before anyone reads the parameters again

    def publish(self, state, everything: bool = False) -> None:
        """Move this rank's pieces' optimizer state into the shared segment (once; or again if
        the optimizer replaced a tensor) and mark which pieces have state."""
        for j, piece in enumerate(self.pieces):
            entry = state.get(piece)
            i = self.where[j][0]
            if not entry:
                if everything:
                    self.flags[i * self.world + self.rank] = 0
                continue
            targets = self._targets[j]
            for key, value in entry.items():
                target = targets.get(key)
                if target is None:
                    raise RuntimeError(f"sharded optimizer: unexpected optimizer state {key!r} of parameter {i}")
                if value is not target:
                    if value.shape != target.shape or value.dtype != target.dtype:
                        raise RuntimeError(f"sharded optimizer state {key!r} of parameter {i} is {value.dtype} "
                                           f"{tuple(value.shape)}, expected {target.dtype} {tuple(target.shape)}")
                    target.copy_(value)
                    entry[key] = target
            self.flags[i * self.world + self.rank] = 1

    def full_state_dict(self, param_groups) -> dict[str, Any]:
        groups = [{**options(g), "params": list(ids)}
                  for g, ids in zip(param_groups, self.group_params)]
        state: dict[int, dict[str, Any]] = {}
        flags = self.flags.tolist()
        for i, p in enumerate(self.params):
            owners = [r for r in range(self.world) if flags[i * self.world + r]]
            if not owners:
                continue
            keys, scal = self.group_keys[self.group_of[i]]
            entry = {k: self.slot(i, owners[0], k).clone() for k in scal}
            entry.update({k: self.region(k, i).view(p.shape).clone() for k in keys})
            state[i] = entry
        return {"state": state, "param_groups": groups}

    def piece_state_dict(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """`state_dict` (unsharded, as state_dict() returns it) cut down to this rank's pieces."""
        import torch

        saved_groups = state_dict.get("param_groups")
        if not isinstance(saved_groups, list) or len(saved_groups) != len(self.group_params) or any(
                len(g.get("params", ())) != len(ids) for g, ids in zip(saved_groups, self.group_params)):
            sizes = [len(ids) for ids in self.group_params]
            raise ValueError(f"optimizer state dict does not fit this optimizer: it needs {len(sizes)} parameter "
                             f"group(s) of {sizes} parameters")
        saved_ids = [pid for g in saved_groups for pid in g["params"]]
        saved_state = state_dict.get("state", {})
        state: dict[int, dict[str, Any]] = {}
        for j, (i, a, b) in enumerate(self.where):
            entry = saved_state.get(saved_ids[i])
            if entry is None:
                continue
            keys = self.group_keys[self.group_of[i]][0]
            out = {}
            for k, v in entry.items():
                if k in keys:
                    if not isinstance(v, torch.Tensor) or v.numel() != self.params[i].numel():
                        raise ValueError(f"optimizer state {k!r} of parameter {i} has shape "
                                         f"{tuple(getattr(v, 'shape', ()))}, the parameter "
                                         f"{tuple(self.params[i].shape)}; load a state saved for this model")
                    v = v.reshape(-1)[a:b]
                out[k] = v
            state[j] = out
        groups = [{**options(g), "params": list(pieces)}
                  for g, pieces in zip(saved_groups, self.group_pieces)]
        return {"state": state, "param_groups": groups}
