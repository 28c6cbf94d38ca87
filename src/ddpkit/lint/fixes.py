"""`ddpkit lint --fix`: format-preserving rewrites (libcst) of the mistakes that have one safe mechanical fix.

Where each edit goes is decided on Python's ast by the checks themselves (the hits they report),
then made on libcst's concrete tree, so comments, blank lines and formatting elsewhere stay as they
were. A rewrite that is not certain to keep the script working (shuffle=True inside a **kwargs
dict, an `import torch.distributed.launch`, weights_only=False, a DDP keyword with no single
DistributedDataParallel call to move it to) is not made: the finding stays.
"""

from __future__ import annotations

import ast
import difflib
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import MetadataWrapper, PositionProvider

from ddpkit.lint.analysis import Script, argument, keyword, terminal
from ddpkit.lint.linter import analyse
from ddpkit.lint.rules import Hit

__all__ = ["FIXABLE", "fix_source", "apply_fixes"]

FIXABLE = frozenset({"DDP001", "DDP002", "DDP003", "DDP005", "DDP007", "DDP009", "DDP011"})
"""Rules whose findings --fix can rewrite (some of their findings may still be left, see the module doc)."""

Pos = tuple[int, int]


class _Edits:
    """What to change in one file, keyed by the (line, column) where a node starts."""

    def __init__(self) -> None:
        self.drop_args: set[Pos] = set()
        """Keyword arguments to delete, by the position of their value."""
        self.add_args: dict[Pos, list[tuple[str, str]]] = defaultdict(list)
        """Calls that gain keyword arguments: [(name, source of the value)]."""
        self.replace: dict[Pos, str] = {}
        """Expressions replaced by new source."""
        self.first_in_loop: dict[Pos, str] = {}
        """For loops that gain a statement at the top of their body."""
        self.last_in: dict[Pos | None, str] = {}
        """Functions (None: the module) that gain a statement at the end of their body."""
        self.imports: list[tuple[str, str | None]] = []

    def __bool__(self) -> bool:
        return any((self.drop_args, self.add_args, self.replace, self.first_in_loop, self.last_in))


def _pos(node: ast.AST) -> Pos:
    return (node.lineno, node.col_offset)


def _plan(script: Script, hits: list[Hit]) -> _Edits:
    edits = _Edits()
    ddp_calls = [c for c in script.calls if script.qualname(c.func).endswith("DistributedDataParallel")]
    for hit in hits:
        node = hit.node
        if hit.rule == "DDP002" and not hit.message.count("**kwargs"):
            positional = any(node is a for c in script.calls for a in c.args)
            if positional:
                edits.replace[_pos(node)] = "False"  # DataLoader(data, 16, True, sampler): keep the positions
            else:
                edits.drop_args.add(_pos(node))
        elif hit.rule == "DDP003" and len(ddp_calls) == 1:
            name = next(k.arg for c in script.calls for k in c.keywords if k.value is node)
            edits.drop_args.add(_pos(node))
            if keyword(ddp_calls[0], name) is None:
                edits.add_args[_pos(ddp_calls[0])].append((name, ast.unparse(node)))
        elif hit.rule == "DDP005" and isinstance(node, ast.Call):
            if argument(node, "map_location", 1) is None:  # weights_only=False is the user's call to make
                edits.add_args[_pos(node)].append(("map_location", '"cpu"'))
        elif hit.rule == "DDP011":
            _plan_cuda_device(script, node, edits)
        elif hit.rule == "DDP007":
            _plan_launch(script, node, edits)
        elif hit.rule == "DDP001" and isinstance(node, ast.Call) and terminal(node.func) == "DistributedSampler":
            _plan_set_epoch(script, node, edits)
        elif hit.rule == "DDP001" and isinstance(node, ast.Call) and "the same epoch every time" in hit.message:
            # set_epoch(0) / set_epoch(start_epoch) inside `for epoch in ...`: the loop variable instead
            loop = next((n for n in script.nodes if isinstance(n, ast.For) and isinstance(n.target, ast.Name)
                         and any(m is node for m in ast.walk(n))), None)
            if loop is not None and loop.target.id != "_":
                edits.replace[_pos(node.args[0])] = loop.target.id
        elif hit.rule == "DDP009":
            _plan_destroy(script, node, edits)
    return edits


def _plan_cuda_device(script: Script, node: ast.AST, edits: _Edits) -> None:
    calls = [node] if isinstance(node, ast.Call) else []
    if isinstance(node, (ast.Name, ast.Attribute)):  # a holder: rewrite what was assigned to it
        keys, todo = set(), [node.id if isinstance(node, ast.Name) else "." + node.attr]
        while todo:  # `device = args.device`: follow the alias to the call assigned to `args.device`
            key = todo.pop()
            if key not in keys:
                keys.add(key)
                todo.extend(v.id if isinstance(v, ast.Name) else "." + v.attr for k, v in script.assignments
                            if k == key and isinstance(v, (ast.Name, ast.Attribute)))
        calls = [v for k, v in script.assignments if k in keys and isinstance(v, ast.Call)
                 and script.qualname(v.func) == "torch.cuda.device"]
    for call in calls:
        if len(call.args) == 1 and not call.keywords:
            torch = "torch" if "torch" in script.aliases else None
            if torch:
                edits.replace[_pos(call)] = f'torch.device("cuda", {ast.unparse(call.args[0])})'


def _plan_launch(script: Script, node: ast.AST, edits: _Edits) -> None:
    if isinstance(node, ast.Call) and terminal(node.func) == "add_argument":
        default = keyword(node, "default")
        fallback = ast.unparse(default) if default is not None else "-1"
        edits.drop_args.update({_pos(default)} if default is not None else set())
        edits.add_args[_pos(node)].append(("default", f'int(os.environ.get("LOCAL_RANK", {fallback}))'))
        edits.imports.append(("os", None))
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        original = next(n for n in script.nodes if isinstance(n, ast.Constant) and n.value == node.value
                        and n.lineno <= node.lineno)
        if "\n" not in original.value:  # a docstring is left as written
            edits.replace[_pos(original)] = _LAUNCH_STRING


_LAUNCH_STRING = "<torchrun>"
"""Marks a string literal whose `python -m torch.distributed.launch` becomes `torchrun`."""


def _torchrun(text: str) -> str:
    for old in ("python3 -m torch.distributed.launch", "python -m torch.distributed.launch"):
        text = text.replace(old, "torchrun")
    return text.replace("torch.distributed.launch", "torch.distributed.run")


def _plan_set_epoch(script: Script, sampler: ast.Call, edits: _Edits) -> None:
    """`loader.sampler.set_epoch(epoch)` first in the epoch loop around the loop over that sampler's loader."""
    names = {k.lstrip(".") for k, v in script.assignments if v is sampler}
    loaders = {k for k, v in script.assignments if isinstance(v, ast.Call) and terminal(v.func) == "DataLoader"
               and any(a is sampler or (isinstance(a, ast.Name) and a.id in names)
                       for a in (*v.args, *(kw.value for kw in v.keywords)))}
    for outer in script.nodes:
        if not (isinstance(outer, ast.For) and isinstance(outer.target, ast.Name)):
            continue
        inner = next((n for n in ast.walk(outer) if n is not outer and isinstance(n, ast.For)
                      and isinstance(n.iter, (ast.Name, ast.Call))
                      and _iterated(n.iter) in loaders), None)
        if inner is not None:
            edits.first_in_loop[_pos(outer)] = f"{_iterated(inner.iter)}.sampler.set_epoch({outer.target.id})"
            return


def _iterated(expr: ast.AST) -> str:
    """The loader a loop walks: `loader`, or `enumerate(loader)` / `tqdm(loader)`."""
    if isinstance(expr, ast.Call) and expr.args and terminal(expr.func) in ("enumerate", "tqdm", "iter"):
        expr = expr.args[0]
    return expr.id if isinstance(expr, ast.Name) else ""


def _plan_destroy(script: Script, init: ast.Call, edits: _Edits) -> None:
    """destroy_process_group() at the end of the code that called init_process_group, when that code is the run."""
    ctx = script.context(init)
    if isinstance(init.func, ast.Attribute):
        call = ast.unparse(init.func.value) + ".destroy_process_group()"
    else:
        call = "destroy_process_group()"
        edits.imports.append(("torch.distributed", "destroy_process_group"))
    body = script.tree if not ctx.functions else next((d for d in script.defs if id(d) == ctx.scope), None)
    if body is None or not any(isinstance(st, ast.Expr) and st.value is init for st in body.body):
        return  # init under a condition or inside a statement: where the run ends is not clear
    if body is script.tree:
        edits.last_in[None] = call
        return
    workers = script.per_rank_functions or set()
    if (body.name in workers or body.name == "main") and not any(isinstance(n, ast.Return) for n in ast.walk(body)):
        edits.last_in[_pos(body)] = call


class _Rewrite(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, edits: _Edits) -> None:
        super().__init__()
        self.edits = edits

    def _at(self, node: cst.CSTNode) -> Pos:
        start = self.get_metadata(PositionProvider, node).start
        return (start.line, start.column)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        args = [a for a, o in zip(updated.args, original.args)
                if not (a.keyword is not None and self._at(o.value) in self.edits.drop_args)]
        added = self.edits.add_args.get(self._at(original), [])
        if added or len(args) != len(updated.args):
            if args:
                args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            args += [cst.Arg(keyword=cst.Name(name), value=cst.parse_expression(value),
                             equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
                     for name, value in added]
            updated = updated.with_changes(args=args)
        new = self.edits.replace.get(self._at(original))
        return cst.parse_expression(new) if new else updated

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.BaseExpression:
        if self.edits.replace.get(self._at(original)) == _LAUNCH_STRING:
            return updated.with_changes(value=_torchrun(updated.value))  # same quotes and prefix
        return updated

    def leave_Integer(self, original: cst.Integer, updated: cst.Integer) -> cst.BaseExpression:
        new = self.edits.replace.get(self._at(original))
        return cst.parse_expression(new) if new and new != _LAUNCH_STRING else updated

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        new = self.edits.replace.get(self._at(original))
        return cst.parse_expression(new) if new and new != _LAUNCH_STRING else updated

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        new = self.edits.first_in_loop.get(self._at(original))
        if new and isinstance(updated.body, cst.IndentedBlock):
            body = [cst.parse_statement(new + "\n"), *updated.body.body]
            return updated.with_changes(body=updated.body.with_changes(body=body))
        return updated

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        new = self.edits.last_in.get(self._at(original))
        if new and isinstance(updated.body, cst.IndentedBlock):
            body = [*updated.body.body, cst.parse_statement(new + "\n")]
            return updated.with_changes(body=updated.body.with_changes(body=body))
        return updated

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        new = self.edits.last_in.get(None)
        if new:
            return updated.with_changes(body=[*updated.body, cst.parse_statement(new + "\n")])
        return updated


def _rewrite(source: str, edits: _Edits) -> str:
    module = MetadataWrapper(cst.parse_module(source)).visit(_Rewrite(edits))
    if edits.imports:
        context = CodemodContext()
        for module_name, obj in edits.imports:
            AddImportsVisitor.add_needed_import(context, module_name, obj)
        module = AddImportsVisitor(context).transform_module(module)
    return module.code


def fix_source(sources: dict[str, str]) -> dict[str, str]:
    """The files of `sources` with every safe fix applied, repeated until nothing changes (at most 3 rounds)."""
    current = dict(sources)
    for _ in range(3):
        changed = False
        planned: set[str] = set()
        for path, script, hits in analyse(current):
            if path in planned:
                continue  # a helper two programs share: rewritten once, seen again next round
            planned.add(path)
            edits = _plan(script, [h for h in hits if h.rule in FIXABLE])
            if edits:
                new = _rewrite(current[path], edits)
                if new != current[path]:
                    current[path], changed = new, True
        if not changed:
            break
    return current


def apply_fixes(sources: dict[str, str], write: bool, show_diff: bool) -> dict[str, str]:
    """Fix `sources`; print a unified diff and/or write the changed files (each replaced whole, atomically)."""
    fixed = fix_source(sources)
    for path, text in fixed.items():
        if text == sources[path]:
            continue
        if show_diff:
            sys.stdout.writelines(difflib.unified_diff(sources[path].splitlines(keepends=True),
                                                       text.splitlines(keepends=True), path, path))
        if write:
            target = Path(path)
            handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(temp, target)
            finally:
                if os.path.exists(temp):
                    os.unlink(temp)
    return fixed if write else sources
