"""Where each value of a ported scope lives after the port: on ctx.device or on the host (the CPU).

On a GPU rank the model and everything it returns are on ctx.device, and so are the batches of ddpkit.loader and
ddpkit.eval_loader. A torch DataLoader the port keeps delivers CPU batches, and a tensor the script makes without
`device=` (`torch.randn(...)`, `torch.FloatTensor(n).normal_()`, `torch.zeros(...)`, `from_numpy(a)`, also in a
helper function of the script or at module level) is on the CPU. The original script moved such values itself
(`.cuda()`, `.to(device)`), sometimes after they met another value; on one device, or on a CPU-only run, every value
is on the same device and nothing fails, so a CPU check never sees a mismatch. This module walks each ported scope
in statement order, gives every local name a place (device, host, or unknown) and, where a host value meets a device
value (arithmetic, a comparison, a loss, a torch function of both) before any move:

- makes it on ctx.device where it is assigned, when every assignment of the name in the scope is a new tensor made
  there (or already on the device), the scope runs inside ddpkit.init, and nothing hands the name to a dataset, a
  loader or numpy (then moving it keeps the script's meaning);
- else leaves a TODO naming the value, where it was made (line) and the value it meets.

A CPU tensor of zero dimensions (`torch.tensor(0.5)`) mixes with CUDA tensors; it is never called a host value.
`Plan.host_loaders` is the other half: a loader name the port leaves a torch DataLoader on some path (also one a
function of the script returns: `train_loader, val_loader = make_loaders(...)`) keeps its batches' moves (`x.cuda()` becomes `x.to(ctx.device)` instead of being dropped).
"""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import ENTRY, dotted, is_device_expr, loader_expr, root_name, statements_of, walk
from ddpkit.port.inputs import CREATORS
from ddpkit.port.models import move_receiver

__all__ = ["DEVICE", "HOST", "Placement", "plan_placement", "host_loader_names"]

DEVICE = "device"
HOST = "host"

_LEGACY = frozenset({"FloatTensor", "LongTensor", "IntTensor", "DoubleTensor", "ByteTensor", "BoolTensor", "Tensor",
                     "HalfTensor", "ShortTensor", "CharTensor"})
_MADE = CREATORS | _LEGACY | {"from_numpy", "normal"}
_RUNS_MODEL = re.compile(r"(^|\.)(onnx\.export|jit\.trace|jit\.trace_module|export\.export|add_graph|summary)$")
"""Library calls that run the model handed to them on the inputs handed with it."""
_LEGACY_DTYPES = {"FloatTensor": "torch.float32", "DoubleTensor": "torch.float64", "HalfTensor": "torch.float16",
                  "LongTensor": "torch.int64", "IntTensor": "torch.int32", "ShortTensor": "torch.int16",
                  "CharTensor": "torch.int8", "ByteTensor": "torch.uint8", "BoolTensor": "torch.bool"}
"""Legacy constructors and their dtype: `torch.FloatTensor(x)` of a tensor on a GPU raises TypeError (they make
CPU tensors only), `torch.as_tensor(x, dtype=torch.float32)` keeps x where it is."""
_SHAPE_FREE = frozenset({"tensor", "as_tensor"})
"""Creators whose value may be a zero-dimensional tensor (`torch.tensor(0.5)`): a host one of those is harmless."""
_KEEPS = frozenset({
    "squeeze", "unsqueeze", "float", "double", "long", "int", "half", "bool", "byte", "view", "view_as", "reshape",
    "reshape_as", "permute", "transpose", "contiguous", "clone", "detach", "sum", "mean", "max", "min", "argmax",
    "argmin", "abs", "exp", "log", "sigmoid", "softmax", "log_softmax", "clamp", "clamp_", "flatten", "expand",
    "expand_as", "repeat", "type_as", "t", "pow", "sqrt", "mul", "add", "sub", "div", "masked_fill", "index_select",
    "gather", "norm", "round", "floor", "ceil", "squeeze_", "unsqueeze_", "normal_", "fill_", "zero_", "uniform_",
    "random_", "bernoulli_", "requires_grad_", "type", "to", "narrow", "chunk", "split", "std", "var",
    "neg", "tanh", "relu", "softplus", "cumsum", "prod", "topk", "sort", "roll", "flip", "tril", "triu"})
"""Tensor methods whose result lives where their receiver does (`.to(dtype)` too: a move is told apart first)."""
_SAME_PLACE = frozenset({"data", "T", "mT", "real", "imag", "values", "indices"})
"""Attributes of a tensor that live where it does (`.values`, `.indices` of `x.max(dim=1)`, `x.topk(k)`)."""
_WRAPPERS = frozenset({"Variable", "autograd.Variable", "torch.autograd.Variable"})
_LOSS = re.compile(r"loss|criterion|crit$", re.IGNORECASE)
_MIX_OPS = (cst.Equal, cst.NotEqual, cst.LessThan, cst.GreaterThan, cst.LessThanEqual, cst.GreaterThanEqual)
_HANDED = re.compile(r"Dataset|Loader|DataLoader|^np\.|^numpy\.|^pd\.|^plt\.")
"""Calls a host tensor may be handed to that need it on the host (or would pin or copy it): it is not moved."""
_DEPTH = 2


class Placement:
    """The place of each local name of one scope, statement by statement. Reports (quiet=False) each host value
    meeting a device value as (meeting node, host expression, device expression, where the host value was made)."""

    def __init__(self, plan: Any, key: str, depth: int = 0, quiet: bool = False,
                 host_names: frozenset[str] = frozenset()) -> None:
        self.p, self.f, self.key, self.depth, self.quiet = plan, plan.f, key, depth, quiet
        self.state: dict[str, tuple[str | None, cst.CSTNode | None]] = {}
        """name -> (place, the expression that made a host value)."""
        self.assigns: dict[str, tuple[cst.Assign, ...]] = {}
        """name -> the assignments of this scope that may have made its host value (one per branch)."""
        self.meetings: list[tuple[cst.CSTNode, cst.BaseExpression, cst.BaseExpression, cst.CSTNode | None,
                                  tuple[cst.Assign, ...]]] = []
        self.host_names = host_names
        self.lists: set[str] = set()
        """Names last bound to a list display or comprehension (`returns = []`): `torch.tensor(returns)` is no
        zero-dimensional tensor."""
        self.legacy: list[tuple[cst.Call, cst.BaseExpression]] = []
        """`torch.FloatTensor(batch)` of a value on ctx.device: (call, that value)."""

    # ---- walking -------------------------------------------------------------------------------------
    def run(self, statements: list[cst.BaseStatement]) -> Placement:
        for stmt in statements:
            self._statement(stmt)
        return self

    def _statement(self, stmt: cst.CSTNode) -> None:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            return
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                self._small(small)
            return
        if isinstance(stmt, cst.If):
            self._branches(stmt)
            return
        if isinstance(stmt, cst.For):
            self.place(stmt.iter)
            self._bind_loop(stmt)
        elif isinstance(stmt, cst.While):
            self.place(stmt.test)
        elif isinstance(stmt, cst.With):
            for item in stmt.items:
                self.place(item.item)
        for block in self.p.blocks_of(stmt):
            for inner in block:
                self._statement(inner)

    def _branches(self, stmt: cst.If) -> None:
        """Each branch from the state before the `if`; after it a name keeps a place every branch that binds it
        agrees on (with the assignments of all of them), else it is unknown."""
        self.place(stmt.test)
        before = (dict(self.state), dict(self.assigns))
        outs = []
        suites, node = [], stmt
        while isinstance(node, cst.If):
            suites.append(node.body)
            node = node.orelse
        if isinstance(node, cst.Else):
            suites.append(node.body)
        for suite in suites:
            self.state, self.assigns = dict(before[0]), dict(before[1])
            if isinstance(suite, cst.SimpleStatementSuite):  # `if use_cuda: x = x.cuda()` on one line
                for small in suite.body:
                    self._small(small)
            else:
                for inner in suite.body:
                    self._statement(inner)
            outs.append((self.state, self.assigns))
        tail = stmt.orelse
        while isinstance(tail, cst.If):
            tail = tail.orelse
        if not isinstance(tail, cst.Else):
            outs.append(before)
        self.state, self.assigns = {}, {}
        for name in sorted({n for state, _ in outs for n in state}):
            found = [(state[name], assigns.get(name, ())) for state, assigns in outs if name in state]
            if len({place for (place, _), _ in found}) == 1:
                self.state[name] = found[0][0]
                self.assigns[name] = tuple({id(a): a for _, made in found for a in made}.values())
            else:
                self.state[name], self.assigns[name] = (None, None), ()

    def _small(self, small: cst.BaseSmallStatement) -> None:
        if isinstance(small, cst.Assign):
            value = self.place(small.value)
            if id(small) in self.p.to_device:
                value = DEVICE  # another rule makes it on ctx.device where it is assigned
            for t in small.targets:
                self._bind(t.target, small.value, value, small)
        elif isinstance(small, cst.AnnAssign) and small.value is not None:
            self._bind(small.target, small.value, self.place(small.value), small)
        elif isinstance(small, cst.AugAssign):
            left = self.place(small.target)
            right = self.place(small.value)
            self._meet(small, small.target, left, small.value, right)
        elif isinstance(small, (cst.Expr, cst.Return)) and small.value is not None:
            self.place(small.value)

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression, place: str | None,
              assign: cst.CSTNode) -> None:
        if isinstance(target, cst.Name):
            (self.lists.add if isinstance(value, (cst.List, cst.ListComp)) else self.lists.discard)(target.value)
            self.state[target.value] = (place, value if place == HOST else None)
            self.assigns[target.value] = (assign,) if place == HOST and isinstance(assign, cst.Assign) else ()
        elif isinstance(target, (cst.Tuple, cst.List)):
            names = [e.value for e in target.elements]
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(names):
                for n, v in zip(names, value.elements):
                    self._bind(n, v.value, self.place(v.value), assign)
                return
            call = value if isinstance(value, cst.Call) else None
            for i, n in enumerate(names):
                if not isinstance(n, cst.Name):
                    continue
                where = self._returned(call, i) if call is not None and self._callee(call) else (place, None)
                self.state[n.value], self.assigns[n.value] = where, ()

    def _bind_loop(self, loop: cst.For) -> None:
        role = self.p.loop_role(self.key, loop) if self.key in self.f.scopes else None
        place = (HOST if self.p.host_loop(self.key, loop) else DEVICE) if role else None
        for n in (x for x in walk(loop.target) if isinstance(x, cst.Name)):
            self.state[n.value], self.assigns[n.value] = (place, loop if place == HOST else None), ()

    # ---- places ----------------------------------------------------------------------------------------
    def place(self, expr: cst.BaseExpression) -> str | None:
        if isinstance(expr, cst.Name):
            return self._name(expr.value)
        if isinstance(expr, cst.BinaryOperation):
            left, right = self.place(expr.left), self.place(expr.right)
            self._meet(expr, expr.left, left, expr.right, right)
            return DEVICE if DEVICE in (left, right) else HOST if HOST in (left, right) else None
        if isinstance(expr, cst.UnaryOperation):
            return self.place(expr.expression)
        if isinstance(expr, cst.Comparison):
            left = self.place(expr.left)
            places = [left]
            for c in expr.comparisons:
                right = self.place(c.comparator)
                if isinstance(c.operator, _MIX_OPS):
                    self._meet(expr, expr.left, left, c.comparator, right)
                places.append(right)
            return DEVICE if DEVICE in places else HOST if HOST in places else None
        if isinstance(expr, cst.Subscript):
            for s in expr.slice:
                if isinstance(s.slice, cst.Index):
                    self.place(s.slice.value)
            return self.place(expr.value)
        if isinstance(expr, cst.Attribute):
            return self.place(expr.value) if expr.attr.value in _SAME_PLACE else None
        if isinstance(expr, (cst.Tuple, cst.List)):
            for e in expr.elements:
                self.place(e.value)
            return None
        if isinstance(expr, cst.Call):
            return self._call(expr)
        return None

    def _name(self, name: str) -> str | None:
        if name in self.state:
            return self.state[name][0]
        if name in self.host_names:
            return HOST
        return None

    def _call(self, call: cst.Call) -> str | None:
        name = dotted(call.func)
        args = [self.place(a.value) for a in call.args]
        if self._is_model(call.func):
            return DEVICE
        handed = [a.value for a in call.args if self._is_model(a.value)]
        if handed and _RUNS_MODEL.search(name):
            # a library call handed the model and its inputs runs the model on them (`torch.onnx.export(model, x,
            # path)`, `torch.jit.trace(model, x)`, `writer.add_graph(model, x)`): they meet its parameters
            for a, where in zip(call.args, args):
                if where == HOST:
                    self._meet(call, a.value, HOST, handed[0], DEVICE)
        if move_receiver(call) is not None:
            target = next((a.value for a in call.args if a.keyword is None), None)
            if isinstance(target, cst.Attribute) and target.attr.value == "device" and not is_device_expr(
                    target.value) and root_name(target.value) in self.state:
                return self.state[root_name(target.value)][0]  # `.to(x.device)`: where x is
            self.place(call.func.value)
            if isinstance(target, cst.SimpleString) and "cpu" in target.value:
                return None
            return DEVICE
        if name in _WRAPPERS and call.args:
            return args[0]
        if self._draws_batch(call):
            return DEVICE  # `next(batches)`, `batches.next()` of `batches = iter(loader)`: a ddpkit loader's batch
        last = name.rsplit(".", 1)[-1]
        if name.startswith("torch.") and name.count(".") == 1 and last in _LEGACY and args == [DEVICE] and \
                not call.args[0].keyword and not call.args[0].star:
            # the original made it on the CPU from a CPU batch; the port's loader delivers the batch on ctx.device
            if not self.quiet:
                self.legacy.append((call, call.args[0].value))
            return DEVICE
        if name.startswith("torch.") and name.count(".") == 1 or name in ("from_numpy", "torch.cuda." + last):
            device = next((a.value for a in call.args if a.keyword and a.keyword.value == "device"), None)
            if name.startswith("torch.cuda."):
                return DEVICE
            if last.endswith("_like") and call.args:
                return args[0]
            if last in _MADE:
                if device is not None:
                    return DEVICE if is_device_expr(device) and "cpu" not in self.f.code(device) else None
                first = call.args[0].value if call.args else None
                if last in _SHAPE_FREE and not (isinstance(first, (cst.List, cst.Tuple, cst.ListComp)) or isinstance(
                        first, cst.Name) and first.value in self.lists):
                    return None  # `torch.tensor(0.5)`: a zero-dimensional tensor mixes with any device
                return HOST
            return self._mix(call, args)
        if name.startswith(("F.", "torch.nn.functional.", "nn.functional.")) or _LOSS.search(last):
            return self._mix(call, args)
        if isinstance(call.func, cst.Attribute):
            receiver = self.place(call.func.value)
            if self._is_model(call.func.value) or root_name(call.func.value) in self._models():
                # a method of the model (`model.avg(x)`, `model.decode(z)`): its parameters are on ctx.device, and
                # no DDP forward moves its inputs there
                for a, where in zip(call.args, args):
                    if where == HOST:
                        self._meet(call, a.value, HOST, call.func, DEVICE)
                return DEVICE
            if call.func.attr.value in _KEEPS:
                return receiver
            return None
        if self._callee(call):
            return self._returned(call, None)[0]
        return None

    def _mix(self, call: cst.Call, args: list[str | None]) -> str | None:
        """A torch function or a loss of several tensors: they must share a device."""
        values = [a.value for a in call.args]
        nested = [(e.value, self.place(e.value)) for v in values if isinstance(v, (cst.List, cst.Tuple))
                  for e in v.elements]
        pairs = list(zip(values, args)) + nested
        dev = next((v for v, p in pairs if p == DEVICE), None)
        host = next((v for v, p in pairs if p == HOST), None)
        if dev is not None and host is not None:
            self._meet(call, host, HOST, dev, DEVICE)
        places = {p for _, p in pairs}
        return DEVICE if DEVICE in places else HOST if HOST in places else None

    def _draws_batch(self, call: cst.Call) -> bool:
        """`next(it)`, `it.next()`, `it.__next__()` of an iterator over a ddpkit loader (on every path)."""
        if dotted(call.func) == "next" and call.args:
            it = call.args[0].value
        elif isinstance(call.func, cst.Attribute) and call.func.attr.value in ("next", "__next__") and not call.args:
            it = call.func.value
        else:
            return False
        name = dotted(it)
        return bool(name) and self.key in self.f.scopes and self.p.role(self.key, name) in ("train", "eval") and \
            name not in getattr(self.p, "host_loaders", {}).get(self.key, set())

    def _models(self) -> set[str]:
        if self.key not in self.f.scopes:
            return set()
        return {k for k, v in self.f.scopes[self.key].roles.items() if v == "model"}

    def _is_model(self, func: cst.BaseExpression) -> bool:
        return self.key in self.f.scopes and bool(dotted(func)) and (self.p.role(self.key, dotted(func)) == "model"
                                                                       or self.p.is_model_copy(self.key, dotted(func)))

    def _callee(self, call: cst.Call) -> str | None:
        if self.depth >= _DEPTH:
            return None
        found = self.f.callees(call, self.key) if self.key in self.f.scopes else []
        return found[0] if found and not found[0].endswith(".__init__") else None

    def _returned(self, call: cst.Call | None, index: int | None) -> tuple[str | None, cst.CSTNode | None]:
        """Where a function of the script puts what it returns (at `index` of a returned tuple)."""
        func = self._callee(call) if call is not None else None
        if func is None:
            return None, None
        node = self.f.scopes[func].node
        inner = Placement(self.p, func, self.depth + 1, quiet=True).run(statements_of(node))
        places = []
        for ret in (n for n in walk(node) if isinstance(n, cst.Return)):
            value = ret.value
            if value is None:
                return None, None
            if index is not None:
                if not isinstance(value, (cst.Tuple, cst.List)) or index >= len(value.elements):
                    return None, None
                value = value.elements[index].value
            where = inner.state.get(value.value, (None, None)) if isinstance(value, cst.Name) else \
                (inner.place(value), value)
            places.append(where)
        if places and all(p == HOST for p, _ in places):
            return HOST, call  # the TODO names the call that brings it into this scope
        if places and all(p == DEVICE for p, _ in places):
            return DEVICE, None
        return None, None

    # ---- meetings ----------------------------------------------------------------------------------------
    def _meet(self, node: cst.CSTNode, a: cst.BaseExpression, pa: str | None, b: cst.BaseExpression,
              pb: str | None) -> None:
        if self.quiet or {pa, pb} != {HOST, DEVICE}:
            return
        host, dev = (a, b) if pa == HOST else (b, a)
        made = self.state.get(root_name(host), (None, None))[1] if root_name(host) else None
        self.meetings.append((node, host, dev, made, self.assigns.get(root_name(host), ()) if root_name(host) else ()))


def host_loader_names(plan: Any, kept: list[tuple[str, str]]) -> dict[str, set[str]]:
    """Names that may hold a torch DataLoader the port keeps (its batches stay on the CPU), per scope: the
    assignment's target, names bound from it, and the parameters of the script's functions it is handed to."""
    found: dict[str, set[str]] = {}
    for key, name in kept:
        found.setdefault(key, set()).add(name)
    for _ in range(6):
        changed = False
        for key in sorted(plan.f.ported):
            names = found.get(key, set())
            for node in plan.nodes(key) if names else ():
                if isinstance(node, cst.Assign) and len(node.targets) == 1 and dotted(
                        loader_expr(node.value)) in names and dotted(node.targets[0].target) not in names:
                    names.add(dotted(node.targets[0].target))
                    changed = True
                if not isinstance(node, cst.Call):
                    continue
                for callee in plan.f.callees(node, key):
                    params = plan.f.scopes[callee].params
                    given = [(params[i] if i < len(params) else None, a) for i, a in enumerate(
                        a for a in node.args if a.keyword is None and not a.star)]
                    given += [(a.keyword.value, a) for a in node.args if a.keyword is not None and
                              a.keyword.value in params]
                    for param, arg in given:
                        if param and dotted(arg.value) in names and param not in found.get(callee, set()):
                            found.setdefault(callee, set()).add(param)
                            changed = True
            for node in plan.nodes(key):  # `train_loader, val_loader = make_loaders(...)` of a function returning them
                if not isinstance(node, cst.Assign) or len(node.targets) != 1 or not isinstance(node.value, cst.Call):
                    continue
                for callee in plan.f.callees(node.value, key):
                    for name in _returned(plan, callee, found.get(callee, set()), node.targets[0].target):
                        if name not in found.setdefault(key, set()):
                            found[key].add(name)
                            changed = True
        if not changed:
            break
    return found


def _returned(plan: Any, callee: str, kept: set[str], target: cst.BaseExpression) -> list[str]:
    """The names of `target` (a name, or a tuple unpacked by position) that receive one of `kept`, a function's names
    for a kept torch DataLoader, from its `return` statements."""
    if not kept:
        return []
    out = []
    for node in plan.nodes(callee):
        if not isinstance(node, cst.Return) or node.value is None:
            continue
        if isinstance(target, cst.Name) and dotted(node.value) in kept:
            out.append(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)) and isinstance(node.value, cst.Tuple) and len(
                target.elements) == len(node.value.elements):
            out += [t.value.value for t, v in zip(target.elements, node.value.elements)
                    if isinstance(t.value, cst.Name) and dotted(v.value) in kept]
    return out


def plan_placement(plan: Any) -> None:
    """Each host value that meets a device value in a ported scope: made on ctx.device where it is assigned (when
    that is plainly a new tensor made there), else a TODO naming it, where it was made and what it meets."""
    told = {(line, m) for line, m in plan.todos}
    for key in sorted(plan.f.ported):
        walker = Placement(plan, key, host_names=frozenset(_module_hosts(plan, key))).run(
            plan.f.scope_statements(key))
        for call, batch in walker.legacy:
            last = dotted(call.func).rsplit(".", 1)[-1]
            if _in_ctx(plan, key, call) and last in _LEGACY_DTYPES:
                plan.as_tensor[id(call)] = _LEGACY_DTYPES[last]
                continue
            plan.todo(call, f"`{_short(plan, call)}` makes a CPU tensor of `{_short(plan, batch)}`, which the port's "
                      "loader delivers on ctx.device: the legacy constructor raises TypeError for a GPU tensor; use "
                      f"torch.as_tensor({_short(plan, batch)}) (or {_short(plan, batch)}.cpu() where the CPU is meant)")
        moved: set[str] = set()
        named: set[str] = set()
        for node, host, dev, made, assigns in walker.meetings:
            name = root_name(host) if not isinstance(host, cst.Call) else ""
            label = name or plan.f.code(host)
            if name in moved or label in named:
                continue
            if name and _move_where_made(plan, key, name, assigns):
                moved.add(name)  # made on ctx.device where it is assigned: every later read is there
                continue
            if not name and _move_parts(plan, key, walker, host, moved):
                continue
            if _made_inline(plan, key, host):
                continue
            if isinstance(host, cst.Name) and _is_tensor_origin(made) and _in_ctx(plan, key, host) and not (
                    isinstance(node, cst.AugAssign) and node.target is host):  # `total += loss`: stored to, not read
                plan.move_at.add(id(host))  # a tensor made elsewhere: moved where it meets the device value
                continue
            named.add(label)
            line = plan.line_of(plan._stmt.get(id(node), node))
            if any(ln == line and f"`{label}`" in m for ln, m in told):
                continue
            made = made.iter if isinstance(made, cst.For) else made  # a batch of a kept torch DataLoader
            where = f" (made on the CPU by `{_short(plan, made)}`, line {plan.line_of(made)})" if isinstance(
                made, cst.CSTNode) and plan.line_of(made) else " (on the CPU)"
            plan.todo(node, " ".join(
                f"`{label}`{where} meets `{_short(plan, dev)}`, which is on ctx.device after the port, before any "
                f"move: on a GPU rank this line fails with a device mismatch; move `{label}` there first "
                f"(.to(ctx.device))".split()))


def _is_tensor_origin(made: cst.BaseExpression) -> bool:
    """What made a host value is a tensor for sure: a torch call, a function of the script returning torch tensors,
    or arithmetic on them (never a loop's iterable: a batch may be a dict or a list)."""
    return isinstance(made, (cst.Call, cst.BinaryOperation, cst.Subscript))


def _short(plan: Any, node: cst.CSTNode) -> str:
    text = " ".join(plan.f.code(node).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _module_hosts(plan: Any, key: str) -> set[str]:
    """Module-level names bound only to a tensor made on the CPU (`fixed_noise = torch.randn(64, nz)`) that the
    scope reads without binding them itself."""
    values: dict[str, list[cst.BaseExpression]] = {}
    for stmt in plan.f.module.body:
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Assign):
                for t in small.targets:
                    if isinstance(t.target, cst.Name):
                        values.setdefault(t.target.value, []).append(small.value)
    if not values:
        return set()
    local = {x.value for s in plan.f.scope_statements(key) for n in walk(s) if isinstance(n, cst.AssignTarget)
             for x in walk(n.target) if isinstance(x, cst.Name)}
    if key in plan.f.scopes:
        local |= set(plan.f.scopes[key].params)
    probe = Placement(plan, "", quiet=True)
    return {k for k, vs in values.items() if k not in local and all(probe.place(v) == HOST for v in vs)}


def _in_ctx(plan: Any, key: str, node: cst.CSTNode) -> bool:
    if key not in (ENTRY, plan.f.entry_key):
        return True
    region = plan.f.region_ids()
    stmt = plan._stmt.get(id(node), node)
    while stmt is not None:
        if id(stmt) in region:
            return True
        stmt = plan._parent.get(id(stmt))
    return False


def _move_where_made(plan: Any, key: str, name: str, assigns: tuple[cst.Assign, ...]) -> bool:
    """The host value of `name` that meets a device value was made by `assigns` (one per branch that reaches the
    meeting): when each is a new tensor made there inside ddpkit.init, and nothing hands `name` itself to a
    dataset, a loader or numpy, plan each on ctx.device. True when planned."""
    if not assigns or not all(_new_tensor(a.value) and _in_ctx(plan, key, a) for a in assigns):
        return False
    for call in (n for n in plan.nodes(key) if isinstance(n, cst.Call)):
        if _HANDED.search(dotted(call.func)) and any(  # the tensor itself, not `noise.size()[0]`
                isinstance(a.value, cst.Name) and a.value.value == name for a in call.args):
            return False
    for a in assigns:
        plan.to_device.add(id(a))
    return True


def _move_parts(plan: Any, key: str, walker: Placement, host: cst.BaseExpression, moved: set[str]) -> bool:
    """`gamma * (1.0 - done_t)` meeting a device value: arithmetic on host tensors (and numbers) moves where each of
    those tensors is made on ctx.device (`done_t = torch.from_numpy(done)`, made beside tensors the port moved from
    the same batch). True when every one of them is."""
    if not isinstance(host, (cst.BinaryOperation, cst.UnaryOperation)):
        return False
    names = {n.value for n in walk(host) if isinstance(n, cst.Name) and walker.state.get(n.value, (None,))[0] == HOST}
    if names and all(n in moved or _move_where_made(plan, key, n, walker.assigns.get(n, ())) for n in names):
        moved |= names
        return True
    return False


def _made_inline(plan: Any, key: str, call: cst.BaseExpression) -> bool:
    """`loss_fn(model(x), torch.ones(n, 1))`: a torch creator called right at the meeting gets device=ctx.device
    (also inside `Variable(...)`)."""
    while isinstance(call, cst.Call) and dotted(call.func) in _WRAPPERS and call.args:
        call = call.args[0].value
    if not isinstance(call, cst.Call) or not _in_ctx(plan, key, call) or any(
            a.keyword and a.keyword.value == "generator" for a in call.args):  # a CPU generator draws on the CPU
        return False
    name = dotted(call.func)
    if not (name.startswith("torch.") and name.count(".") == 1 and name.rsplit(".", 1)[-1] in CREATORS) or any(
            a.keyword and a.keyword.value == "device" for a in call.args) or id(call) in plan.add_kwarg:
        return False
    plan.add_kwarg[id(call)] = ("device", "ctx.device")
    return True


def _new_tensor(expr: cst.BaseExpression) -> bool:
    """`torch.randn(...)`, `torch.FloatTensor(n).normal_(0, s)`, `torch.zeros(n).long()`: a tensor made right here
    by torch (a method chain on it keeps it where it was made), also scaled by a number (`torch.randn(n) * sigma`)."""
    if isinstance(expr, cst.BinaryOperation):
        number = (cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.UnaryOperation)
        return _new_tensor(expr.left) and isinstance(expr.right, number) or \
            isinstance(expr.left, number) and _new_tensor(expr.right)
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
            expr.func.attr.value in _KEEPS and not dotted(expr.func).startswith("torch."):
        expr = expr.func.value
    if isinstance(expr, cst.Call) and dotted(expr.func) in _WRAPPERS and expr.args:
        return _new_tensor(expr.args[0].value)
    name = dotted(expr.func) if isinstance(expr, cst.Call) else ""
    return (name.startswith("torch.") and name.count(".") == 1 or name == "from_numpy") and \
        name.rsplit(".", 1)[-1] in _MADE
