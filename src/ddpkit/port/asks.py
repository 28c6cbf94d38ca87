"""What the project's own code does on every rank besides writing files: asks the terminal, starts or records into an
experiment tracker's run, opens a window, stops training on its own loss, trains a model past its DDP wrapper.

Under torchrun only rank 0 reads stdin: an `input()` leaves the other ranks waiting or on another answer. A tracker's
`start_run`/`log_metric` made on every rank is one run per rank, each with its shard's figures; `env.render()` is a
window per rank. A training function that raises, breaks or returns on its own loss (`if math.isnan(loss): raise`)
leaves the other ranks waiting in their next all-reduce. A training function that runs a model through `.module`
(`gen.module.infer(z)`, written for nn.DataParallel) goes past the DDP wrapper: that forward's gradients are never
averaged, and each rank's copy drifts apart. The places are found by the walk of ddpkit.port.diskwrites
(the project's functions, classes and methods a call of the script reaches).
"""

from __future__ import annotations

import ast
import functools
import re

from ddpkit.port.diskwrites import Site, reached, read_module
from ddpkit.port.weights import Follow, ast_dotted

__all__ = ["bypass_of", "bypasses_reached", "prompt_of", "prompts_reached", "stop_of", "stops_reached", "tracker_of", "trackers_reached"]

_PROMPTS = frozenset({"input", "raw_input", "getpass", "getpass.getpass", "click.prompt", "click.confirm",
                      "typer.prompt", "typer.confirm", "Prompt.ask", "Confirm.ask"})
"""Calls that wait for an answer typed at the terminal."""
_TRACKER_CALL = re.compile(r"^(mlflow|wandb|neptune|comet_ml|swanlab|clearml|aim)\.(?!get_|set_tracking_uri$)\w+$")
"""Calls of an experiment tracker's module that start a run or record into it (its getters record nothing)."""
_WINDOW = re.compile(r"(^|\.)env\.render$")
"""A gym environment's `render()`: a window on every rank's display."""


def prompt_of(node: ast.AST) -> str:
    """What a call asks the terminal (`input(...)`, `getpass.getpass(...)`, click's `prompt`/`confirm`), else ""."""
    func = ast_dotted(node.func) if isinstance(node, ast.Call) else ""
    return func if func in _PROMPTS else ""


def tracker_of(node: ast.AST) -> str:
    """A call that starts or records into an experiment tracker's run (`mlflow.start_run`, `wandb.log`), or opens an
    environment's window (`env.render()`): its name, else ""."""
    func = ast_dotted(node.func) if isinstance(node, ast.Call) else ""
    return func if _TRACKER_CALL.match(func) or _WINDOW.search(func) else ""


def _loss_names(defn: ast.AST, seeds: set[str] = frozenset()) -> set[str]:
    """Names that hold a training function's loss (what it calls `.backward()` on, or `seeds`) or a figure computed
    from it (`value = loss.item()`, `total += loss.item()`); none where the function calls no `loss.backward()`
    itself and no seed is given."""
    names = {n.func.value.id for n in ast.walk(defn) if isinstance(n, ast.Call) and isinstance(
        n.func, ast.Attribute) and n.func.attr == "backward" and isinstance(n.func.value, ast.Name)
        and n.func.value.id not in ("self", "cls")} | set(seeds)  # `self.backward(loss)`: the object's helper
    assigns = [n for n in ast.walk(defn) if isinstance(n, (ast.Assign, ast.AugAssign))]
    changed = bool(names)
    while changed:
        changed = False
        for a in (a for a in assigns if any(isinstance(x, ast.Name) and x.id in names for x in ast.walk(a.value))):
            new = {n for t in (a.targets if isinstance(a, ast.Assign) else [a.target]) for n in _bound_names(t)}
            changed = changed or bool(new - names)
            names |= new
    return names


def _trained_figures(defn: ast.AST, path: str) -> set[str]:
    """Names `defn` binds to what a training function of its module returns from its own loss (`epoch_loss =
    self.train_epoch(epoch)`, where `train_epoch` calls `loss.backward()` and returns the mean of its losses)."""
    calls = {t.id: _called_name(a.value) for a in ast.walk(defn) if isinstance(a, ast.Assign)
             and isinstance(a.value, ast.Call) for t in a.targets if isinstance(t, ast.Name)}
    if not any(calls.values()):
        return set()
    module = read_module(path) if path else None
    trained = {f.name for f in ast.walk(module) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
               and _returns_loss(f)} if module is not None else set()
    return {name for name, called in calls.items() if called in trained}


def _called_name(call: ast.Call) -> str:
    """`self.train_epoch(...)`, `train_epoch(...)`: "train_epoch"; another object's method or a lookup: ""."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _returns_loss(defn: ast.AST) -> bool:
    """`defn` calls `loss.backward()` and returns a figure of that loss."""
    loss = _loss_names(defn)
    return bool(loss) and any(isinstance(r, ast.Return) and r.value is not None and any(
        isinstance(x, ast.Name) and x.id in loss for x in ast.walk(r.value)) for r in ast.walk(defn))


def _bound_names(target: ast.AST) -> list[str]:
    """Names an assignment target binds (`a`, `a, b`), not the objects it stores into (`self.x`, `d[k]`)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _bound_names(e)]
    return _bound_names(target.value) if isinstance(target, ast.Starred) else []


def _exit_in(body: list[ast.stmt]) -> str:
    """"raise", "break", "return" or "exit" where a block leaves its loop or function, else ""."""
    for node in (n for s in body for n in ast.walk(s)):
        if isinstance(node, (ast.Raise, ast.Break, ast.Return)):
            return type(node).__name__.lower()
        if isinstance(node, ast.Call) and ast_dotted(node.func) in ("exit", "quit", "sys.exit", "os._exit"):
            return "exit"
    return ""


def stop_of(node: ast.AST, defn: ast.AST, path: str = "") -> str:
    """`if value > 1e8 or math.isnan(value): raise ...` in a training function, on its own loss, or on the loss a
    training function of the module (`path`) returns to it: "raise on `...`"."""
    if not isinstance(node, ast.If) or not _exit_in(node.body):
        return ""
    tested = {x.id for x in ast.walk(node.test) if isinstance(x, ast.Name)}
    if not tested & _loss_names(defn) and not tested & _loss_names(defn, _trained_figures(defn, path)):
        return ""
    return f"{_exit_in(node.body)} on `{ast.unparse(node.test)[:40]}`"


def prompts_reached(path: str, defn: ast.AST, follow: Follow, owner: tuple | None = None,
                    call: ast.Call | None = None, handed: list[tuple[str, ast.ClassDef]] = ()) -> list[Site]:
    """Every question to the terminal `defn` asks on every rank, followed as diskwrites.writes_reached follows."""
    return reached(path, defn, follow, owner, call, handed, lambda _, n, __, ___: prompt_of(n))


def trackers_reached(path: str, defn: ast.AST, follow: Follow, owner: tuple | None = None,
                     call: ast.Call | None = None, handed: list[tuple[str, ast.ClassDef]] = ()) -> list[Site]:
    """Every tracker run, record or window `defn` makes on every rank, followed as diskwrites.writes_reached
    follows."""
    return reached(path, defn, follow, owner, call, handed, lambda _, n, __, ___: tracker_of(n))


def stops_reached(path: str, defn: ast.AST, follow: Follow, owner: tuple | None = None,
                  call: ast.Call | None = None, handed: list[tuple[str, ast.ClassDef]] = ()) -> list[Site]:
    """Every stop on a rank's own loss (`stop_of`) in the training code `defn` runs, followed as
    diskwrites.writes_reached follows."""
    return reached(path, defn, follow, owner, call, handed, lambda where, n, d, __: stop_of(n, d, where))


_NOT_FORWARD = frozenset({"state_dict", "load_state_dict", "parameters", "named_parameters", "buffers",
                          "named_buffers", "modules", "named_modules", "children", "named_children", "train", "eval",
                          "to", "cuda", "cpu", "apply", "zero_grad", "requires_grad_", "half", "float", "double",
                          "save", "save_pretrained", "register_buffer", "register_forward_hook", "get_parameter"})
"""Methods of a module that run no forward: reading or moving it past the wrapper is fine."""


@functools.lru_cache(maxsize=256)
def _without_grad(defn: ast.AST) -> frozenset[int]:
    """Ids of the nodes of `defn` under `with torch.no_grad():` (or `inference_mode`), and whether it trains:
    -1 is in the set where `defn` calls `.backward()`."""
    quiet = {id(n) for w in ast.walk(defn) if isinstance(w, (ast.With, ast.AsyncWith)) and any(
        ast_dotted(i.context_expr.func if isinstance(i.context_expr, ast.Call) else i.context_expr).rsplit(".", 1)[-1]
        in ("no_grad", "inference_mode") for i in w.items) for s in w.body for n in ast.walk(s)}
    trains = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
                 for n in ast.walk(defn))
    return frozenset(quiet | ({-1} if trains else set()))


def bypass_of(node: ast.AST, defn: ast.AST) -> str:
    """A call in a training function `defn` (one that calls `.backward()`) that runs a model through `.module`
    (`gen.module.infer(z)`, `model.module(x)`, `net.module.encoder(x)`), with gradients on: its code, else ""."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute | ast.Name):
        return ""
    parts = ast_dotted(node.func).split(".")
    if "module" not in parts[1:] or parts[-1] in _NOT_FORWARD or parts[0] in ("self", "cls") and parts[1] == "module":
        return ""
    quiet = _without_grad(defn)
    return f"`{ast.unparse(node.func)[:50]}(...)`" if -1 in quiet and id(node) not in quiet else ""


def bypasses_reached(path: str, defn: ast.AST, follow: Follow, owner: tuple | None = None,
                     call: ast.Call | None = None, handed: list[tuple[str, ast.ClassDef]] = ()) -> list[Site]:
    """Every forward past the DDP wrapper (`bypass_of`) in the training code `defn` runs, followed as
    diskwrites.writes_reached follows."""
    return reached(path, defn, follow, owner, call, handed, lambda _, n, d, __: bypass_of(n, d))
