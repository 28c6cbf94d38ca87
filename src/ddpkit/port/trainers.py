"""Classes of the project that train a module the script hands them, with their own optimizer, through a method of
that module other than forward, or in steps whose number may differ between ranks.

A policy-gradient agent (`agent = PPO(actor_critic, ...)`) builds its optimizer over `actor_critic.parameters()` and
computes its loss through `actor_critic.evaluate_actions(...)`; the module's forward may even raise. A DDP wrapper
averages gradients only for the calls of its own forward, so "wrap the model before its optimizer" cannot work
there: the TODO at the script's call names the method the loss goes through and where, and what would. A DQN agent
that optimizes once per environment step inside `while not done:` takes as many steps as its episodes last, which
differ between ranks: wrapped, the ranks' all-reduces would not pair up.
"""

from __future__ import annotations

import ast
import os
import re

from ddpkit.port.weights import Definition, ast_dotted

__all__ = ["trained_elsewhere"]

_OPTIMIZER = re.compile(r"(^|\.)(optim\.\w+|SGD|Adam\w*|RMSprop|Adagrad|KFAC\w*|LBFGS)$")
_MODULE_METHODS = frozenset({"parameters", "named_parameters", "forward", "train", "eval", "to", "cuda", "cpu",
                             "zero_grad", "state_dict", "load_state_dict", "modules", "children", "apply",
                             "requires_grad_", "half", "float", "double", "buffers", "named_modules"})


def trained_elsewhere(tree: ast.Module, definition: Definition) -> list[tuple[int, str]]:
    """(line of the script's call, TODO) where the script hands a module it does not wrap to a class of its
    project whose __init__ builds an optimizer over that module's parameters and whose methods run backward() on a
    loss computed through another method of the module than forward, or from a `while` loop."""
    wrapped = {ast_dotted(t) for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and ast_dotted(n.value.func) == "ddpkit.wrap" for t in n.targets}
    out: list[tuple[int, str]] = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        found = definition(ast_dotted(call.func)) if ast_dotted(call.func) else None
        if found is None or not isinstance(found[2], ast.ClassDef) or not found[0]:
            continue
        for arg, param in _handed(call, found[2]):
            if arg in wrapped:
                continue
            step = _foreign_step(found[2], param)
            if step is not None:
                out.append((call.lineno, _message(arg, found, step)))
                break
    return out


def _handed(call: ast.Call, cls: ast.ClassDef) -> list[tuple[str, str]]:
    """(the script's name, the __init__ parameter it is bound to) for each plain name the call hands the class."""
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    params = [a.arg for a in init.args.args[1:]] if init is not None else []
    pairs = [(ast_dotted(a), p) for a, p in zip(call.args, params) if isinstance(a, ast.Name)]
    pairs += [(ast_dotted(k.value), k.arg) for k in call.keywords if k.arg in params and isinstance(k.value, ast.Name)]
    return pairs


def _foreign_step(cls: ast.ClassDef, param: str) -> tuple[int, int, str] | None:
    """(line of the optimizer, line of the call, what) where the class builds an optimizer over `param.parameters()`
    (or over the attribute it keeps it in) and a method that runs backward() calls another method of that module
    than forward (what: the method's name), or calls its forward but runs from a `while` loop of another method
    (what: "" and the loop's line for the call's): the steps a rank takes there (an episode of an environment) may
    differ between ranks, and DDP's all-reduce in backward() then waits for a step the others never take. None
    otherwise."""
    names = {param} | {ast_dotted(t) for n in ast.walk(cls) if isinstance(n, ast.Assign) and _kept(n.value, param)
                       for t in n.targets if ast_dotted(t).startswith("self.")}
    optimizer = next((n for n in ast.walk(cls) if isinstance(n, ast.Call) and _OPTIMIZER.search(ast_dotted(n.func))
                      and any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in (
                          "parameters", "named_parameters") and ast_dotted(c.func.value) in names
                              for a in n.args for c in ast.walk(a))), None)
    if optimizer is None:
        return None
    for method in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"):
        if not any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "backward"
                   for c in ast.walk(method)):
            continue
        through = [c for c in ast.walk(method) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                   and ast_dotted(c.func.value) in names and c.func.attr not in _MODULE_METHODS]
        if through and not any(isinstance(c, ast.Call) and ast_dotted(c.func) in names for c in ast.walk(method)):
            first = min(through, key=lambda c: c.lineno)
            return optimizer.lineno, first.lineno, first.func.attr
        loop = _stepped_in_while(cls, method.name)
        if loop is not None:
            return optimizer.lineno, loop, ""
    return None


def _kept(value: ast.expr, param: str) -> bool:
    """`policy_net`, `policy_net.to(self.device)`, `policy_net.cuda()`: the module itself."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in ("to", "cuda"):
        value = value.func.value
    return ast_dotted(value) == param


def _stepped_in_while(cls: ast.ClassDef, name: str) -> int | None:
    """The line of a `while not done:` loop (a flag the loop's own work sets, as an environment's episode end) of
    another method of the class that calls `self.<name>()`; not a loop on a step count (`while self.step <
    self.num_steps:`), which runs as many passes on every rank."""
    for method in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name != name):
        for loop in (n for n in ast.walk(method) if isinstance(n, ast.While) and isinstance(n.test, ast.UnaryOp)
                     and isinstance(n.test.op, ast.Not) and isinstance(n.test.operand, (ast.Name, ast.Attribute))):
            if any(isinstance(c, ast.Call) and ast_dotted(c.func) == f"self.{name}" for c in ast.walk(loop)):
                return loop.lineno
    return None


def _message(arg: str, found: tuple[str, str, ast.AST], step: tuple[int, int, str]) -> str:
    where = os.path.basename(found[0])
    line_opt, line_call, method = step
    if not method:
        return (f"`{found[1]}` in {where} (read, not ported) trains `{arg}` itself: it builds the optimizer over its "
                f"parameters ({where}:{line_opt}) and runs its training steps from a `while` loop ({where}:"
                f"{line_call}), whose number of passes (an episode's length) may differ between ranks: wrapped, DDP's "
                f"all-reduce in backward() would wait for a step the other ranks never take (a hang), and unwrapped "
                f"each rank trains its own copy; give every rank the same number of steps (a fixed count of updates "
                f"per round) before handing it `{arg} = ddpkit.wrap({arg}, ctx)`, and read its state_dict through "
                f"ddpkit.unwrap({arg}) there")
    return (f"`{found[1]}` in {where} (read, not ported) trains `{arg}` itself: it builds the optimizer over its "
            f"parameters ({where}:{line_opt}) and computes the loss through `{arg}.{method}(...)` ({where}:"
            f"{line_call}), not through forward; a DDP wrapper averages gradients only for calls of its forward, so "
            f"wrapping `{arg}` would not synchronise the ranks, and left as it is each rank trains its own copy: "
            f"route that call through forward (a forward that runs {method}, called on the wrapper handed to "
            f"{found[1]}), or all-reduce the gradients (ddpkit.all_reduce_sum over each p.grad, divided by "
            "ctx.world_size) before its optimizer.step()")
