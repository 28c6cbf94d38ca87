"""See every torch.distributed collective the user's code issues: op, tensor shapes and call site.

`ddpkit check` and the hang watchdog both need to know "which collective, called from which line".
`install()` replaces the collective functions of `torch.distributed` (and of `distributed_c10d`,
which torch's own object collectives call) with thin wrappers that notify listeners before and
after the real call. The wrappers add no communication: the user's group sees exactly the calls it
saw before. Nested calls (all_gather_object calls all_gather inside) are reported once, as the
outer call. This is process-wide instrumentation by nature; `uninstall()` restores the originals.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Call", "Listener", "install", "uninstall", "traced", "user_site", "user_frame", "format_site",
           "describe_tensors", "COLLECTIVES"]

COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter",
    "barrier", "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object",
    "scatter_object_list",
)
"""Names wrapped when torch has them (point-to-point send/recv are not matched across ranks)."""


@dataclass
class Call:
    """One collective as issued by the user's code."""

    op: str
    """torch.distributed function name, e.g. 'all_reduce'."""
    shapes: list[str]
    """The tensor arguments, e.g. ['float32[4]']; empty for object collectives and barrier."""
    site: str
    """'file:line' of the user's code that issued it (first frame outside torch and ddpkit)."""
    index: int
    """0-based position in this process's sequence of collectives."""
    start: float = field(default_factory=time.monotonic)
    """time.monotonic() when the call began."""
    result: Any = None
    """What the call returned once it has: a Work handle for `async_op=True`, else usually None."""
    on_cuda: bool = False
    """Whether a tensor argument lives on a CUDA device (NCCL enqueues it and returns before it is done)."""


class Listener(Protocol):
    def enter(self, call: Call) -> None: ...

    def exit(self, call: Call) -> None: ...


_state = threading.local()
_listeners: list[Listener] = []
_originals: dict[tuple[Any, str], Any] = {}
_count = [0]
_lock = threading.Lock()

_TORCH_DIR: str | None = None
_DDPKIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
_LIBRARY: dict[str, bool] = {}
"""filename -> _is_library(filename): the stack walk runs on every collective, over the same few files."""


def _is_library(filename: str) -> bool:
    global _TORCH_DIR
    known = _LIBRARY.get(filename)
    if known is not None:
        return known
    if _TORCH_DIR is None:
        torch = sys.modules.get("torch")
        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep if torch else "\0"
    path = os.path.abspath(filename)
    known = _LIBRARY[filename] = filename.startswith("<") or path.startswith((_TORCH_DIR, _DDPKIT_DIR, *_STDLIB_DIRS))
    return known


def user_frame(frame):
    """The innermost frame, from `frame` outwards, that belongs to the user's code (None if none)."""
    while frame is not None and _is_library(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def format_site(filename: str, lineno: int) -> str:
    """'file:line', relative to the working directory when the file is below it."""
    path = os.path.abspath(filename)
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            path = rel
    except ValueError:  # another drive (Windows)
        pass
    return f"{path}:{lineno}"


def user_site(frame=None) -> str:
    """'file:line' of the user's code that is running at `frame` (default: the caller)."""
    frame = user_frame(frame if frame is not None else sys._getframe(1))
    return format_site(frame.f_code.co_filename, frame.f_lineno) if frame is not None else "<unknown>"


def _tensors(args: tuple, kwargs: dict) -> list:
    import torch

    out = []
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, (list, tuple)) else [value]
        out.extend(item for item in items if isinstance(item, torch.Tensor))
    return out


def describe_tensors(args: tuple, kwargs: dict) -> list[str]:
    """'dtype[shape]' of the tensor arguments (and tensors in list arguments), in order."""
    return [f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in _tensors(args, kwargs)]


def _wrap(name: str, original):
    def collective(*args, **kwargs):
        if getattr(_state, "depth", 0) or not _listeners:
            return original(*args, **kwargs)
        tensors = [] if name.endswith(("_object", "_object_list")) else _tensors(args, kwargs)
        shapes = [f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in tensors]
        with _lock:
            index = _count[0]
            _count[0] += 1
        call = Call(op=name, shapes=shapes, site=user_site(sys._getframe(1)), index=index,
                    on_cuda=any(t.device.type == "cuda" for t in tensors))
        for listener in list(_listeners):
            listener.enter(call)
        _state.depth = 1
        try:
            call.result = original(*args, **kwargs)
            return call.result
        finally:
            _state.depth = 0
            for listener in list(_listeners):
                listener.exit(call)

    collective.__wrapped__ = original
    collective._ddpkit_traced = True
    collective.__name__ = name
    collective.__doc__ = original.__doc__
    return collective


def traced(name: str, fn):
    """`fn` reported to listeners as a collective called `name` (ddpkit's own exchanges, e.g. shm_all_reduce)."""
    return _wrap(name, fn)


def install(listener: Listener) -> None:
    """Start reporting collectives to `listener` (wraps torch.distributed's functions on first use)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    with _lock:
        if not _originals:
            for module in (dist, c10d):
                for name in COLLECTIVES:
                    original = getattr(module, name, None)
                    if original is None or getattr(original, "_ddpkit_traced", False):
                        continue
                    _originals[(module, name)] = original
                    setattr(module, name, _wrap(name, original))
        if listener not in _listeners:
            _listeners.append(listener)


def uninstall(listener: Listener) -> None:
    """Stop reporting to `listener`; the last one out restores torch.distributed's functions."""
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)
        if not _listeners:
            for (module, name), original in _originals.items():
                setattr(module, name, original)
            _originals.clear()
