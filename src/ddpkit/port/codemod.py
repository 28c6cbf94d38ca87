"""One script through `ddpkit port`: parse, refuse what is not a plain script, plan, rewrite, report."""

from __future__ import annotations

import ast
import os
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import libcst as cst

__all__ = ["PortError", "PortResult", "Todo", "port_source", "open_todos", "TODO_MARK"]

TODO_MARK = "TODO(ddpkit port)"
"""What marks a step left to the user in a ported script: `# TODO(ddpkit port): <the blocker>`."""


@dataclass(frozen=True)
class Todo:
    """A step the codemod left to the user: the original line and what to do there."""

    line: int
    message: str
    in_output: bool = False
    """True where `line` is a line of the ported output (the claim gate's TODOs), not of the input."""


class PortError(ValueError):
    """The input cannot be ported (not Python, a syntax error, already a DDP script)."""


class PortBug(PortError):
    """The rewrite itself went wrong (its output does not parse): a bug in ddpkit port, reported, never written."""


@dataclass(frozen=True)
class PortResult:
    """The ported text and what remains to do by hand."""

    code: str
    todos: list[Todo] = field(default_factory=list)
    changed: bool = True
    message: str = ""
    notes: list[str] = field(default_factory=list)
    """What a fully ported script still does differently (`no DataLoader: ... no speed-up`): in `message` too."""

    @property
    def exit_code(self) -> int:
        """0 fully ported (or nothing to do), 3 when TODOs remain."""
        return 3 if self.todos else 0


def open_todos(source: str) -> list[Todo]:
    """The `# TODO(ddpkit port): ...` comments still in a (ported) script, at the line each one names."""
    out = []
    lines = source.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith(f"# {TODO_MARK}:"):
            target = next((j for j in range(i + 1, len(lines)) if not lines[j].strip().startswith("#")), i)
            items = []  # the items of a list, a `#   - item` line each, belong to it
            for j in range(i + 1, target):
                if not lines[j].strip().startswith("#   - "):
                    break
                items.append(lines[j].strip()[len("#   "):])
            out.append(Todo(target + 1, "\n".join([stripped[len(f"# {TODO_MARK}:"):].strip(), *items])))
    return out


def port_source(source: str, path: str = "<string>") -> PortResult:
    """Rewrite a plain single-device PyTorch script's text into a ddpkit script (never runs it).

    Where `path` is a file, the modules of the script's own project that it imports are read (never rewritten) from
    its folder; the ported text is linted with them, and what neither the rewrite nor they let it check is a TODO.

    Raises PortError for a file that does not parse or already uses torch.distributed (lint it instead).
    A script that already calls ddpkit.init() comes back unchanged, with a message saying so.
    """
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    from ddpkit.lint.linter import lint_sources
    from ddpkit.port.claims import (gate, parameter_groups, project_config_names, project_fetches,
                                    project_loader_calls, project_reports)
    from ddpkit.port.entry import add_import, free_ctx, open_context, thread_ctx
    from ddpkit.port.facts import Facts
    from ddpkit.port.plan import Plan
    from ddpkit.port.rewrite import Rewriter

    bom = "\ufeff" if source.startswith("\ufeff") else ""  # the parser drops it: written back in front
    source = source[len(bom):]
    try:
        compile(source, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as e:
        python = "%d.%d" % sys.version_info[:2]
        raise PortError(f"{path}:{e.lineno}:{e.offset or 1}: cannot parse the file ({e.msg}) with Python {python}, which "
                        "runs ddpkit; fix the syntax error first, or, if the script is written for a newer Python, "
                        "run ddpkit under that Python") from None
    retabbed = False
    try:
        wrapper = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError as e:
        expanded = _indent_tabs_expanded(source)
        if expanded is None:
            raise _unparsable(path, e) from None
        try:  # Python reads indentation that mixes tabs and spaces; libcst's tokenizer does not
            wrapper = MetadataWrapper(cst.parse_module(expanded))
        except cst.ParserSyntaxError:
            raise _unparsable(path, e) from None
        source, retabbed = expanded, True
    facts = Facts(wrapper.module)
    if facts.ported_already:
        left = open_todos(source)
        if left:
            return PortResult(bom + source, left, False, f"{path} already calls ddpkit.init() but {len(left)} "
                              f"`{TODO_MARK}` comment(s) remain: fix them by hand, then delete each comment")
        return PortResult(bom + source, [], False, f"{path} already calls ddpkit.init(): nothing to change")
    if facts.distributed_hint:
        raise PortError(f"{path} already uses {facts.distributed_hint}: it is already a multi-process (distributed) "
                        f"script, not a single-device one; check it with `ddpkit lint {path}` instead")
    if not facts.region:
        raise PortError(f"{path} has no training entry point (no top-level code and no `if __name__ == "
                        "\"__main__\":` block); port the script that runs the training")
    module, renamed = free_ctx(wrapper.module)
    if renamed is not None:  # the script's own `ctx` (an autocast context, a parameter): the port's is `ctx`
        source = module.code
        wrapper = MetadataWrapper(module)
        facts = Facts(wrapper.module)
    positions = wrapper.resolve(PositionProvider)

    def line_of(node: cst.CSTNode) -> int:
        pos = positions.get(node)
        return pos.start.line if pos is not None else 0

    def end_of(node: cst.CSTNode) -> int:
        pos = positions.get(node)
        return pos.end.line if pos is not None else 0

    folder = os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else None
    plan = Plan(facts, line_of, end_of, project_reports(source, folder) if folder is not None else {},
                project_fetches(source, folder) if folder is not None else {},
                project_loader_calls(source, folder) if folder is not None else {},
                project_config_names(source, folder) if folder is not None else frozenset(),
                parameter_groups(source, folder))
    if renamed is not None:
        plan.summary.append(f"the script's own name `ctx` is renamed `{renamed}`: `ctx` is the port's ddpkit context")
    rewriter = Rewriter(facts, plan)
    module = wrapper.visit(rewriter)
    module = thread_ctx(module, facts)
    device = _cpu_device(plan, module, source, folder) or plan.init_device
    if retabbed:
        plan.summary.append("the file indents with tabs mixed with spaces, which the rewriter cannot read: its "
                            "indentation is written with spaces (8 columns a tab, as Python reads it)")
    module = open_context(module, facts, plan.seed, device)
    module = add_import(module, rng=facts.seeded_before_init(), device=any(
        "ddpkit.device." in line for lines in plan.batch_moves.values() for line in lines) or any(
        "ddpkit.device." in text for text in plan.replace.values()),
        collectives="ddpkit.collectives.all_reduce_number(" in module.code)
    todos = [Todo(line, message) for line, message in sorted(plan.todos)]
    # the claim gate: what the rewrite never looked at (its own output's lint findings, the script's own modules)
    # becomes a TODO, so "ported fully" is never said of code nobody checked
    code, gated = gate(_with_every_todo(module.code, todos), path, TODO_MARK, folder, lint_sources)
    todos += [Todo(line, message, True) for line, message in gated]
    try:  # what the port hands back always runs: a rewrite that broke the syntax is ddpkit's bug, never the user's file
        compile(code, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as e:
        raise PortBug(f"{path}: the rewrite came out as code Python cannot parse (line {e.lineno} of the port: "
                        f"{e.msg}); this is a bug in ddpkit port, nothing was written: please report it with the "
                        "script") from None
    state = f"{len(todos)} TODO(s) left for you" if todos else "ported fully"
    notes = "".join(f"; note: {n}" for n in plan.summary)
    return PortResult(bom + code, todos, True, f"{path}: {state}{notes}", list(plan.summary))


def _cpu_device(plan: Plan, module: cst.Module, source: str, folder: str | None) -> str | None:
    """'"cpu"' (ddpkit.init's device) where the port keeps every rank on the CPU, with a TODO that says so: no model
    is wrapped, nothing names a device, and the code the training loader is handed to needs CPU tensors, or the
    script trains itself (its unwrapped model makes its tensors on the CPU). None, the default device, where the
    loader goes to project code that runs on any device: the wrap TODO puts the model there."""
    from ddpkit.port.claims import project_cpu_calls, project_names_a_device

    if not plan.cpu_script or _wraps(module) or (folder is not None and project_names_a_device(source, folder)):
        return None
    calls = project_cpu_calls(source, folder) if folder is not None else []
    needs_cpu = [(line, sites) for line, sites in calls if sites]
    if calls and not needs_cpu:
        return None
    head = ('ddpkit.init(device="cpu") keeps every rank on the CPU (gloo: no GPU is used), since no model is wrapped '
            "and nothing names a device")
    if needs_cpu:
        line, sites = needs_cpu[0]
        plan.todos.append((line, f"{head}, and the project's code this call runs needs CPU tensors: {sites}; make "
                                 "those `.cpu().numpy()` (tensors made there `.to(ctx.device)`), wrap the model, then "
                                 "drop device= to train on the GPUs"))
    else:
        line = min((t[0] for t in plan.todos), default=1)
        plan.todos.append((line, f"{head}: the unwrapped model and the tensors its methods make stay on the CPU; wrap "
                                 "the model, make those tensors on ctx.device, then drop device= to train on the GPUs"))
    return '"cpu"'


def _with_every_todo(code: str, todos: list[Todo]) -> str:
    """`code` with each planned TODO written in it: one whose comment the rewrite did not write (its node was
    replaced, or is not a statement the rewriter comments) goes at the top, naming its original line, so the
    summary never reports a TODO the file does not carry."""
    written = {t.message for t in open_todos(code)}
    lost = [t for t in todos if t.message not in written]
    if not lost:
        return code
    lines = code.splitlines(keepends=True)
    at = 0
    while at < len(lines) and (lines[at].startswith("#!") or re.match(r"#.*coding[:=]", lines[at])):
        at += 1
    head = "".join(f"# {TODO_MARK}: at line {t.line} of the original: {t.message}\n" for t in lost)
    return "".join([*lines[:at], head, *lines[at:]])


def _unparsable(path: str, e: cst.ParserSyntaxError) -> PortError:
    """The error for a file Python reads but the rewriter's parser rejects."""
    return PortError(f"{path}:{e.raw_line}:{e.raw_column + 1}: Python reads this file but the rewriter's parser "
                     f"(libcst) cannot ({e.message}); rewrite that part in plainer syntax, then port again")


def _indent_tabs_expanded(source: str) -> str | None:
    """`source` with tabs in each line's indentation expanded (tab stops every 8 columns, Python's own rule for
    indentation), lines inside multi-line strings untouched; None where no indentation holds a tab or the
    tokenizer rejects the text."""
    import io
    import tokenize

    lines = source.splitlines(keepends=True)
    if not any(line[: len(line) - len(line.lstrip(" \t"))].count("\t") for line in lines):
        return None
    inside: set[int] = set()  # 1-based lines that continue a token begun on an earlier line (string text)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.end[0] > tok.start[0] and tok.type not in (tokenize.NEWLINE, tokenize.NL):
                inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return None
    out = []
    for number, line in enumerate(lines, start=1):
        body = line.lstrip(" \t")
        indent = line[: len(line) - len(body)]
        out.append(line if number in inside or "\t" not in indent else indent.expandtabs(8) + body)
    return "".join(out)


def _wraps(module: cst.Module) -> bool:
    """The rewritten module calls ddpkit.wrap (a model it moves to ctx.device)."""
    import libcst as cst

    from ddpkit.port.facts import dotted, walk

    return any(isinstance(n, cst.Call) and dotted(n.func) == "ddpkit.wrap" for n in walk(module, into_functions=True))
