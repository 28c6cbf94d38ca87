"""Probes for what a rank puts out under `ddpkit check`: figures it reports, files it writes, downloads it runs.

Reported figures: the text of every `print`, logging record, `tqdm` postfix/description/write,
`json.dump(s)` called by the script, TensorBoard `add_scalar(s)`, W&B `Run.log` and MLflow
`log_metric(s)`, with the script's line (the first frame outside Python, torch, ddpkit and installed
packages). Files: every path opened for writing (`open`, hence `np.save`, `csv`, `savefig`, log
files), TensorBoard log directories, W&B and MLflow runs. Downloads: every HTTP request made through
`http.client` (urllib, requests) and every torchvision dataset built with `download=True`.
Each becomes one event in the rank's record (ddpkit.check.probes.Recorder.write); the parent
compares them across ranks and across world sizes (ddpkit.check.analysis, ddpkit.check.figures).
Libraries the script has not imported yet are patched when it imports them.
"""

from __future__ import annotations

import builtins
import functools
import importlib.abc
import io
import json
import logging
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Callable
from typing import Any

from ddpkit.hang import tracer

__all__ = ["OutputProbes", "script_site"]

_TEXT_LIMIT = 2000
"""Characters of a report kept: enough for a line of metrics, not a printed tensor's whole body."""
_PACKAGES = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("purelib", "platlib")})
_inside = threading.local()


def _script_frame(frame: Any) -> Any:
    while frame is not None:
        frame = tracer.user_frame(frame)
        if frame is None or not os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGES):
            break
        frame = frame.f_back
    return frame


def script_site(frame: Any) -> str | None:
    """'file:line' of the innermost frame from `frame` outwards that is the script's own code, not
    Python's, torch's, ddpkit's or an installed package's (None when there is none: a library thread)."""
    frame = _script_frame(frame)
    return None if frame is None else tracer.format_site(frame.f_code.co_filename, frame.f_lineno)


def _importing(frame: Any) -> bool:
    """Whether `frame` runs inside the import of a library, below the script's own code: a library
    writing its own cache at import (matplotlib's font list), which is no write of the script."""
    script = _script_frame(frame)
    while frame is not None and frame is not script:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def _quietly(hook: Callable[[Any], None], module: Any) -> None:
    """Patch a library; another release of it without the names patched is left unprobed, never broken."""
    try:
        hook(module)
    except Exception:
        pass


class _Unbound:
    """A callable that, like a builtin function, is not a descriptor: stored in a class, it is no method."""

    def __init__(self, fn: Callable[..., Any]):
        self._fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls hooks[name](module) once the module `name` has been executed by an import."""

    def __init__(self, hooks: dict[str, Callable[[Any], None]]):
        self.hooks = hooks

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader, hook = spec.loader, self.hooks.pop(name)
        if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec  # a loader shared by many modules (builtin, frozen) is left alone
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _quietly(hook, module)
        loader.exec_module = exec_and_patch
        return spec


class OutputProbes:
    """Installs the output probes of one rank; `write(event, **fields)` records an event."""

    def __init__(self, write: Callable[..., None]):
        self._write = write
        self._restore: list[tuple[Any, str, Any]] = []
        self._finder: _AfterImport | None = None
        self._written: set[str] = set()
        self._fetched: set[str] = set()

    # -- recording ---------------------------------------------------------------------------------
    def _outermost(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` runs for the outermost probed call only: tqdm.write printing, logging through a
        probed stream or json.dumps inside a probe are recorded once."""
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> None:
            if getattr(_inside, "depth", 0):
                return
            _inside.depth = 1
            try:
                fn(*args, **kwargs)
            except Exception:  # a probe must never break the script
                pass
            finally:
                _inside.depth = 0
        return call

    def report(self, channel: str, text: str, frame: Any) -> None:
        site = script_site(frame)
        if site is not None:
            self._write("report", channel=channel, site=site, text=text[:_TEXT_LIMIT])

    def wrote(self, path: Any, what: str, frame: Any) -> None:
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, (str, os.PathLike)):
            return
        path = os.fspath(path)
        path = path if path.startswith("<") else os.path.abspath(path)  # "<W&B run ...>": a tracker run
        device = path.startswith(("/dev/", "/proc/")) and not path.startswith("/dev/shm/")  # /dev/shm holds files
        if device or path in self._written or _importing(frame):
            return
        site = script_site(frame)
        if site is not None:
            self._written.add(path)
            self._write("write", path=path, what=what, site=site)

    def fetched(self, url: str, what: str, frame: Any) -> None:
        site = script_site(frame)
        if site is not None and url not in self._fetched:
            self._fetched.add(url)
            self._write("download", url=url, what=what, site=site)

    # -- patching ----------------------------------------------------------------------------------
    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        self._restore.append((owner, name, original))
        setattr(owner, name, make(original))

    def _around(self, owner: Any, name: str, before: Callable[..., None]) -> None:
        """Replace owner.name by a function that calls before(frame, *args, **kwargs), then the original."""
        probe = self._outermost(before)

        def make(original: Any) -> Any:
            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                probe(sys._getframe(1), *args, **kwargs)
                return original(*args, **kwargs)
            # print and open are builtins, which do not bind as methods: `opener = open` in a class body
            # must keep calling open(path), not open(self, path)
            return _Unbound(wrapper) if isinstance(original, types.BuiltinFunctionType) else wrapper
        self._patch(owner, name, make)

    def install(self) -> None:
        rec = self

        def on_print(frame, *args, sep=" ", end="\n", file=None, flush=False):
            rec.report("print", (" " if sep is None else sep).join(map(str, args)), frame)

        def on_log(frame, logger, record):
            # shown: a handler is configured, or logging's last resort prints it (warnings and up)
            if logger.hasHandlers() or record.levelno >= getattr(logging.lastResort, "level", logging.WARNING):
                rec.report("logging", record.getMessage(), frame)

        def on_json(frame, obj, *args, **kwargs):
            if _script_frame(frame) is frame:  # called by the script itself, not by a library
                rec.report("json", _text(obj), frame)

        def on_open(frame, file, mode="r", *args, **kwargs):
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                rec.wrote(file, f"open(mode={mode!r})", frame)

        def on_request(frame, conn, method, url, *args, **kwargs):
            scheme = "https" if type(conn).__name__.startswith("HTTPS") or conn.port == 443 else "http"
            full = url if "://" in url else f"{scheme}://{conn.host}:{conn.port}{url}"
            rec.fetched(full, f"{method} request", frame)

        import http.client

        self._around(builtins, "print", on_print)
        self._around(logging.Logger, "handle", on_log)
        self._around(json, "dumps", on_json)
        self._around(json, "dump", on_json)
        self._around(builtins, "open", on_open)
        self._around(io, "open", on_open)
        self._around(http.client.HTTPConnection, "putrequest", on_request)
        hooks = {"tqdm.std": self._tqdm, "torch.utils.tensorboard.writer": self._tensorboard,
                 "tensorboardX.writer": self._tensorboard, "wandb.sdk.wandb_run": self._wandb_run,
                 "wandb.sdk.wandb_init": self._wandb_init, "mlflow.tracking.fluent": self._mlflow,
                 "torchvision.datasets": self._torchvision}
        for name in [n for n in hooks if n in sys.modules]:
            _quietly(hooks.pop(name), sys.modules[name])
        self._finder = _AfterImport(hooks)
        sys.meta_path.insert(0, self._finder)

    def uninstall(self) -> None:
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    # -- libraries, patched when imported ----------------------------------------------------------
    def _tqdm(self, module: Any) -> None:
        rec, bar = self, module.tqdm

        def on_postfix(frame, self_, ordered_dict=None, refresh=True, **kwargs):
            rec.report("tqdm", _text({**dict(ordered_dict or {}), **kwargs}), frame)

        def on_text(frame, self_, s="", *args, **kwargs):
            if s:
                rec.report("tqdm", str(s), frame)

        self._around(bar, "set_postfix", on_postfix)
        for name in ("set_postfix_str", "set_description", "set_description_str"):
            self._around(bar, name, on_text)
        write = bar.__dict__["write"].__func__
        probe = self._outermost(lambda frame, cls, s, *a, **k: rec.report("tqdm", str(s), frame))

        def make(original: Any) -> Any:
            def write_(cls, s, *args, **kwargs):
                probe(sys._getframe(1), cls, s)
                return write(cls, s, *args, **kwargs)
            return classmethod(write_)
        self._patch(bar, "write", make)

    def _tensorboard(self, module: Any) -> None:
        rec, writer = self, module.SummaryWriter

        def on_scalar(frame, self_, tag, value, *args, **kwargs):
            rec.report("tensorboard", f"{tag}: {_text(value)}", frame)

        def on_scalars(frame, self_, main_tag, values, *args, **kwargs):
            rec.report("tensorboard", f"{main_tag}: {_text(values)}", frame)

        def make_init(original: Any) -> Any:
            @functools.wraps(original)
            def __init__(self_, *args, **kwargs):
                original(self_, *args, **kwargs)
                log_dir = getattr(self_, "log_dir", None) or getattr(self_, "logdir", None)
                rec.wrote(log_dir, "SummaryWriter log directory", sys._getframe(1))
            return __init__

        self._around(writer, "add_scalar", on_scalar)
        self._around(writer, "add_scalars", on_scalars)
        self._patch(writer, "__init__", make_init)

    def _wandb_run(self, module: Any) -> None:
        self._around(module.Run, "log",
                     lambda frame, run, data, *a, **k: self.report("wandb", _text(data), frame))

    def _wandb_init(self, module: Any) -> None:
        self._around(module, "init", lambda frame, *a, **k: self.wrote(
            f"<W&B run of project {k.get('project')!r}>", "wandb.init", frame))

    def _mlflow(self, module: Any) -> None:
        rec = self
        self._around(module, "log_metric",
                     lambda frame, key, value, *a, **k: rec.report("mlflow", f"{key}: {_text(value)}", frame))
        self._around(module, "log_metrics",
                     lambda frame, metrics, *a, **k: rec.report("mlflow", _text(metrics), frame))
        self._around(module, "start_run", lambda frame, *a, **k: rec.wrote(
            f"<MLflow run of experiment {k.get('experiment_id')!r}>", "mlflow.start_run", frame))

    def _torchvision(self, module: Any) -> None:
        import inspect

        rec = self
        for cls in {c for c in vars(module).values() if isinstance(c, type) and "__init__" in c.__dict__}:
            try:
                params = inspect.signature(cls.__init__).parameters
            except (TypeError, ValueError):
                continue
            if "download" not in params:
                continue
            names = list(params)[1:]

            def on_init(frame, self_, *args, _names=names, _cls=cls, **kwargs):
                bound = dict(zip(_names, args), **kwargs)
                if bound.get("download"):
                    root = bound.get("root", "")
                    rec.fetched(f"{_cls.__name__}(root={os.fspath(root) if root else ''!r}, download=True)",
                                "torchvision dataset download", frame)
            self._around(cls, "__init__", on_init)
