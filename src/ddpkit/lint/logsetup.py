"""The logging set-up analysis: whether the program's logging shows INFO lines on every rank (a level, handler or
basicConfig chosen by the rank, propagation through the root's console), and the project's own logger helpers,
classes and parameters."""

from __future__ import annotations

import ast
import re

from ddpkit.lint.analysis import Script, argument, keyword, terminal
from ddpkit.lint.doubt import library_logger
from ddpkit.lint.ranks import rank_side

__all__ = ["logger_helpers", "maker_method", "logger_classes", "logging_configured", "outside_log_setup",
           "loguru_default", "logging_per_rank", "THROUGH_THE_ROOT"]


def logger_helpers(project) -> set[str]:
    """Project functions and classes that make a logger and never look at the rank: a function that returns a
    `logging.getLogger()` logger, or the `logging` module itself after setting it up (`logging.basicConfig(...);
    return logging`), and a class that keeps a `logging.getLogger()` logger and whose `info` method hands its
    message to it (`self.logger.info(txt)`): what such a logger's `info` writes appears on every rank."""
    found = set()
    for x in project.scripts.values():
        if not any(terminal(c.func) in ("getLogger", "basicConfig") for c in x.calls):
            continue
        for d in x.defs:
            inner = list(ast.walk(d))
            if (any(isinstance(n, (ast.Name, ast.Attribute)) and x.kind(n) for n in inner)
                    or any(a.arg and x.kind(ast.Name(a.arg)) for a in d.args.args)) and not _rank_names_files(x, d):
                continue
            makes = any(isinstance(n, ast.Call) and x.qualname(n.func) in ("logging.getLogger", "getLogger")
                        for n in inner)
            returns = any(isinstance(n, ast.Return) and n.value is not None for n in inner)
            module = x.aliases.get("logging", "") == "logging"
            gives_module = module and any(isinstance(n, ast.Call) and x.qualname(n.func) == "logging.basicConfig"
                                          for n in inner) and any(
                isinstance(n, ast.Return) and isinstance(n.value, ast.Name) and n.value.id == "logging" for n in inner)
            if makes and returns or gives_module:
                found.add(d.name)
    return found


def _rank_names_files(x: Script, d: ast.AST) -> bool:
    """The rank read in a logger's set-up only names the file each rank logs to (`if rank > 0: filepath =
    f"{filepath}-{rank}"` before `logging.FileHandler(filepath)`): its console handler and level are every rank's."""
    statements = [n for n in ast.walk(d) if isinstance(n, ast.stmt) and n is not d]
    named: set[str] = set()
    for stmt in statements:
        own = [stmt.test] if isinstance(stmt, ast.If) else [] if isinstance(stmt, (ast.For, ast.While, ast.With, ast.Try)) \
            else [stmt]
        if not any(isinstance(n, (ast.Name, ast.Attribute)) and x.kind(n) for part in own for n in ast.walk(part)):
            continue
        if isinstance(stmt, ast.If):
            arms = [b for b in (*stmt.body, *stmt.orelse)]
            if not all(isinstance(b, ast.Assign) and all(isinstance(t, ast.Name) for t in b.targets) for b in arms):
                return False
            named |= {t.id for b in arms for t in b.targets}
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            named |= {t.id for t in stmt.targets}
        else:
            return False
    if not named:
        return False
    # every read of those names is in a file handler's arguments, in their own assignments, or in a test of whether
    # there is a file at all (`if filepath is not None:`: a path with the rank in it is never None)
    allowed = {id(m) for n in ast.walk(d) if isinstance(n, ast.Call) and terminal(n.func).endswith("FileHandler")
               for m in ast.walk(n)}
    allowed |= {id(n.left) for n in ast.walk(d) if isinstance(n, ast.Compare) and len(n.comparators) == 1
                and isinstance(n.ops[0], (ast.Is, ast.IsNot)) and isinstance(n.comparators[0], ast.Constant)
                and n.comparators[0].value is None}
    allowed |= {id(m) for n in statements if isinstance(n, ast.Assign) and all(
        isinstance(t, ast.Name) and t.id in named for t in n.targets) for m in ast.walk(n.value)}
    return all(id(n) in allowed for n in ast.walk(d)
               if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in named)


def maker_method(s: Script, func: ast.AST, makers: set[str]) -> bool:
    """`config.get_logger("trainer")`: a method of a project object (not a module's function) that makes a logger
    without looking at the rank, the one function of that name in the program."""
    if not (isinstance(func, ast.Attribute) and func.attr in makers):
        return False
    owner = func.value
    while isinstance(owner, ast.Attribute):
        owner = owner.value
    if isinstance(owner, ast.Name) and owner.id in s.aliases:
        return False
    return sum(d.name == func.attr for x in s.project.scripts.values() for d in x.defs) == 1


def logger_classes(project) -> dict[str, set[int]]:
    """Project classes that wrap a logger for every rank (see _forwards_to_a_logger), with the forwarding calls in
    their `info`: the line is reported where the program calls `info`, not inside the class."""
    found: dict[str, set[int]] = {}
    for x in project.scripts.values():
        if any(terminal(c.func) == "getLogger" for c in x.calls):
            for c in x.nodes:
                if isinstance(c, ast.ClassDef):
                    forwards = _forwards_to_a_logger(x, c)
                    if forwards:
                        found.setdefault(c.name, set()).update(forwards)
    return found


def _forwards_to_a_logger(x: Script, cls: ast.ClassDef) -> set[int]:
    """The calls by which a class that stores `self.<a> = logging.getLogger(...)` and never looks at the rank passes
    the message of its `info(self, msg)` to `self.<a>.info(...)`; empty for any other class."""
    inner = list(ast.walk(cls))
    if any(isinstance(n, (ast.Name, ast.Attribute)) and x.kind(n) for n in inner) or any(
            a.arg != "self" and x.kind(ast.Name(a.arg)) for d in inner if isinstance(d, ast.FunctionDef)
            for a in d.args.args):
        return set()
    held = {t.attr for n in inner if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and x.qualname(n.value.func) in ("logging.getLogger", "getLogger")
            for t in n.targets
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    info = next((d for d in cls.body if isinstance(d, ast.FunctionDef) and d.name == "info"), None)
    if not held or info is None or len(info.args.args) < 2:
        return set()
    message = info.args.args[1].arg
    return {id(n) for n in ast.walk(info)
            if isinstance(n, ast.Call) and terminal(n.func) == "info" and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Attribute) and n.func.value.attr in held
            and isinstance(n.func.value.value, ast.Name) and n.func.value.value.id == "self"
            and any(isinstance(m, ast.Name) and m.id == message for a in n.args for m in ast.walk(a))}


def logging_configured(project) -> bool:
    """The program itself makes INFO lines visible (basicConfig, a handler, a config): without it logging.info
    prints nothing (the root level is WARNING), and a setup the program does not show cannot be judged, except a
    library's set-up named for it (see outside_log_setup)."""
    return any(terminal(c.func) in ("basicConfig", "addHandler", "dictConfig", "fileConfig")
               for x in project.scripts.values() for c in x.calls) or outside_log_setup(project) is not None


_SETS_LOGGING_UP = re.compile(r"(init|setup|set_up|configure|config)_?(logging|logger|log)", re.IGNORECASE)


def outside_log_setup(project) -> tuple[Script, ast.Call] | None:
    """The first call every rank makes, with nothing of the rank in its arguments, of a library's logging set-up:
    `coloredlogs.install()` (a console handler on the root logger, INFO unless told a higher level), or a function
    from outside the program named for it and called for that alone (`init_logging()`): read by its name as showing
    INFO lines on the console; None when the program's own basicConfig/handler/config decides it, or there is no
    such call."""
    if any(terminal(c.func) in ("basicConfig", "addHandler", "dictConfig", "fileConfig")
           for x in project.scripts.values() for c in x.calls):
        return None
    for x in project.scripts.values():
        statements = {id(n.value) for n in x.nodes if isinstance(n, ast.Expr)}
        for c in x.calls:
            level = keyword(c, "level")
            known = x.qualname(c.func) == "coloredlogs.install" and (level is None or (
                isinstance(level, ast.Constant) and str(level.value).upper() in ("INFO", "DEBUG", "20", "10")
                or isinstance(level, ast.Attribute) and level.attr in ("INFO", "DEBUG")))
            # by its name: a set-up of the process's logging, called for that alone (its result unused: not a
            # logger it builds and hands back), with no file or directory to write to
            named = _SETS_LOGGING_UP.fullmatch(terminal(c.func)) and id(c) in statements and not any(
                k.arg is None or re.search(r"file|path|dir|save", k.arg) for k in c.keywords) \
                and terminal(c.func) not in project.defined_functions and project.resolve(x, c.func) is None
            if (known or named) and not x.context(c).level and not _chosen_by_rank(x, c) and project.runs(x, c):
                return x, c
    return None


def loguru_default(project) -> bool:
    """loguru's `logger` keeps its default handler (sys.stderr, every level): the program never configures it
    (`logger.remove()`, `logger.add(...)`, `logger.configure(...)`, `logger.disable(...)`); where it does, who sees
    which line depends on that set-up, and nothing is reported."""
    uses = [(x, c) for x in project.scripts.values() for c in x.calls
            if x.qualname(c.func).startswith("loguru.logger.")]
    return bool(uses) and not any(terminal(c.func) in ("remove", "add", "configure", "disable") for _, c in uses)


def logging_per_rank(project) -> bool:
    """Logging is set up per rank: a level, handler, filter or basicConfig chosen by the rank (in its arguments, or
    a value assigned under a rank check: `if rank != 0: level = logging.ERROR` before `basicConfig(level=level)`),
    or set under a rank check, or `propagate` switched by the rank, or a handler writing to a stream that ranks
    other than 0 silence (`if rank != 0: sys.stdout = open(os.devnull, "w")` before `basicConfig(stream=sys.stdout)`;
    basicConfig's default stream is sys.stderr). Propagation is followed: where the root logger shows INFO lines on
    the console of every rank, a named logger given its handlers (or its level) on rank 0 alone still prints on
    every rank through the root (the other ranks leave it unconfigured), so that set-up does not count."""
    if project.launcher_streams:
        return True  # a launcher sends the other ranks' console away: their log lines do not repeat on it
    root_console = _root_console_everywhere(project)
    setups = _LOG_SETUP | {d.name for d, _, _ in _logger_parameters(project)}
    for x in project.scripts.values():
        for call in x.calls:
            if project.silenced_streams and terminal(call.func) in ("basicConfig", "StreamHandler"):
                stream = keyword(call, "stream") or (call.args[0] if call.args and terminal(call.func)
                                                     == "StreamHandler" else None)
                named = terminal(stream) if stream is not None and x.qualname(stream).startswith("sys.") else \
                    "stderr" if stream is None else ""
                if named in project.silenced_streams:
                    return True
            if terminal(call.func) not in setups:
                continue
            if _basic_config_unheard(x, call):
                project.memo(THROUGH_THE_ROOT, set).add(id(call))  # (doubt.py leaves it alone too)
                continue
            chosen = _chosen_by_rank(x, call)
            guarded = bool(x.context(call).level) and x.qualname(call.func) != "logging.getLogger"
            if not (chosen or guarded):
                continue  # (getting a logger under a rank check configures nothing; one named by the rank is the
                # process's own: `getLogger(f"worker_{rank}")`)
            if library_logger(project, x, call):
                continue  # `getLogger("transformers.modeling_utils").setLevel(WARN)` on some ranks: that library's lines
            if root_console and (_adds_handlers_only(project, x, call) or _logger_target(project, x, call)
                                 == "named" and not chosen and _rank_zero_side(x, call)):
                # the other ranks' lines of this logger reach the root's console (doubt.py reads this fact)
                project.memo(THROUGH_THE_ROOT, set).add(id(call))
                continue
            return True
        for node in x.nodes:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "propagate"
                                                    for t in node.targets):
                if x.context(node).level or any(x.kind(n) for n in ast.walk(node.value)):
                    return True  # `logger.propagate = rank == 0`
    return False


def _basic_config_unheard(x: Script, call: ast.Call) -> bool:
    """`logging.basicConfig(...)` without `force=True` after a basicConfig the module body makes at import, above the
    statement (or the def) holding this one: the root logger already has its handler when this call runs, so it
    changes nothing (its rank-chosen level included)."""
    if x.qualname(call.func) != "logging.basicConfig" or keyword(call, "force") is not None:
        return False
    top = next((stmt for stmt in x.tree.body if any(n is call for n in ast.walk(stmt))), None)
    ran_first = [stmt for stmt in x.tree.body
                 if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and stmt.value is not call
                 and x.qualname(stmt.value.func) == "logging.basicConfig"
                 and top is not None and stmt.lineno < top.lineno]
    return bool(ran_first)


_LEVELS = {"logging.NOTSET": 0, "logging.DEBUG": 10, "logging.INFO": 20, "logging.WARN": 30, "logging.WARNING": 30,
           "logging.ERROR": 40, "logging.FATAL": 50, "logging.CRITICAL": 50}


def disabled_level(project) -> int:
    """The level up to which the program turns logging off for every logger, everywhere: one `logging.disable(L)`
    in module code (`logging.disable(logging.WARNING)` at the top of the entry script; no argument is CRITICAL),
    and no other `logging.disable` call anywhere (a later `disable(logging.NOTSET)` turns it back on). 0 where
    there is none, or the level is not a `logging` constant or number."""
    calls = [(x, c) for x in project.scripts.values() for c in x.calls if x.qualname(c.func) == "logging.disable"]
    if len(calls) != 1:
        return 0
    x, call = calls[0]
    if x.context(call).scope:
        return 0  # inside a function: whether and when it runs is another question
    level = argument(call, "level", 0)
    if level is None:
        return 50
    if isinstance(level, ast.Constant) and type(level.value) is int:
        return level.value
    return _LEVELS.get(x.qualname(level), 0)


def debug_shown(project) -> bool:
    """The program shows DEBUG lines of the root logger: it calls `logging.basicConfig(level=logging.DEBUG)`, every
    basicConfig of it passes that level and every `setLevel`/`disable` of it asks for DEBUG too."""
    calls = [(x, c) for x in project.scripts.values() for c in x.calls
             if x.qualname(c.func) in ("logging.basicConfig", "logging.disable") or terminal(c.func) == "setLevel"]
    basics = [(x, c) for x, c in calls if x.qualname(c.func) == "logging.basicConfig"]

    def debug(x: Script, value: ast.AST | None) -> bool:
        return value is not None and x.qualname(value) == "logging.DEBUG"
    return bool(basics) and all(debug(x, keyword(c, "level") if x.qualname(c.func) == "logging.basicConfig"
                                          else c.args[0] if c.args else None) for x, c in calls)


def _adds_handlers_only(project, x: Script, call: ast.Call) -> bool:
    """The set-up call only gives a logger one more handler: `addHandler(...)`, a set-up of a file handler
    (`fh.setLevel(...)` after `fh = logging.FileHandler(path)`: it does not write the console), or a project helper
    whose set-ups are only those (`log_to_file(path)`). More output on the ranks that run it, none hidden on the
    others."""
    if terminal(call.func) == "addHandler" or _on_a_file_handler(x, call):
        return True
    found = project.callee(x, call)
    helpers = [] if found is None else [d for d in found[0].defs if d.name == found[1]]
    if len(helpers) != 1:
        return False
    setups = [c for c in ast.walk(helpers[0])
              if isinstance(c, ast.Call) and terminal(c.func) in _LOG_SETUP - {"getLogger"}]
    return bool(setups) and all(terminal(c.func) == "addHandler" or _on_a_file_handler(found[0], c) for c in setups)


def _on_a_file_handler(x: Script, call: ast.Call) -> bool:
    """A call on a file handler the code builds (`fh.setLevel(...)` after `fh = logging.FileHandler(path)`)."""
    if not isinstance(call.func, ast.Attribute):
        return False
    receiver = call.func.value
    made = [receiver] if isinstance(receiver, ast.Call) else x.local_values(receiver.id, call) \
        if isinstance(receiver, ast.Name) else []
    return bool(made) and all(isinstance(v, ast.Call) and terminal(v.func).endswith("FileHandler") for v in made)


THROUGH_THE_ROOT = "logging set-ups whose logger prints through the root on every rank"
"""Project fact: ids of the set-up calls the logging model resolved (doubt.py leaves them alone): the per-rank
set-up of a named logger that does not silence it (see logging_per_rank), and the call that gives the root its
console on every rank (see _root_console_everywhere)."""

_LOG_SETUP = frozenset({"basicConfig", "setLevel", "addHandler", "disable", "addFilter", "setup_logger",
                        "setup_logging", "get_logger", "create_logger", "getLogger"})


def _chosen_by_rank(x: Script, call: ast.Call) -> bool:
    """An argument of the call depends on the rank, directly (`level=INFO if rank == 0 else WARN`) or through a name
    this function assigns under a rank check or from the rank (`if not get_rank() == 0: level = ERROR`)."""
    for a in (*call.args, *(k.value for k in call.keywords)):
        for n in ast.walk(a):
            if x.kind(n):
                return True
            if isinstance(n, ast.Name) and any(
                    x.context(stmt).level or value is not None and any(x.kind(m) for m in ast.walk(value))
                    for stmt, value in x.local_assignments(n.id, call)):
                return True
    return False


def _rank_zero_side(x: Script, node: ast.AST) -> bool:
    """The node sits on rank 0's side of its innermost rank check (`if rank == 0:`, the `else:` of `rank != 0`)."""
    branches = x.context(node).branches
    if not branches:
        return False
    test = next((n.test for n in x.nodes if id(n) == branches[-1][0] and isinstance(n, (ast.If, ast.IfExp))), None)
    side = rank_side(test, branches[-1][1]) if test is not None else None
    return side is not None and side[1]


def _root_logger(x: Script, expr: ast.AST | None, within: ast.AST, depth: int = 0) -> str:
    """'root' for the root logger (`logging.root`, `logging.getLogger()`, `getLogger(None)`, a name holding one),
    'named' for a named logger (`getLogger(__name__)`, `getLogger("train")`), '' where unknown."""
    if isinstance(expr, ast.Attribute) and x.qualname(expr) == "logging.root":
        return "root"
    if isinstance(expr, ast.Call) and x.qualname(expr.func) in ("logging.getLogger", "getLogger"):
        name = expr.args[0] if expr.args else keyword(expr, "name")
        if name is None or isinstance(name, ast.Constant) and name.value in (None, ""):
            return "root"
        return "named" if isinstance(name, (ast.Constant, ast.JoinedStr)) or x.qualname(name) == "__name__" else ""
    if isinstance(expr, ast.Name) and depth < 3:
        kinds = {_root_logger(x, v, within, depth + 1) for v in x.local_values(expr.id, within)}
        return kinds.pop() if len(kinds) == 1 else ""
    return ""


def _logger_target(project, x: Script, call: ast.Call) -> str:
    """Which logger a set-up call configures: 'root', 'named' or '' (unknown). A project helper that configures
    `logging.getLogger(<its parameter>)` configures the logger its call names (`setup_logger(None, ...)`: the root)."""
    name = terminal(call.func)
    if name in ("basicConfig", "disable") and x.qualname(call.func).startswith("logging."):
        return "root"
    if isinstance(call.func, ast.Attribute) and name in ("setLevel", "addHandler", "addFilter"):
        return _root_logger(x, call.func.value, call)
    for d, param, default in _logger_parameters(project):
        if d.name == name:
            value = argument(call, param, [a.arg for a in d.args.args].index(param)) or default
            if value is None or isinstance(value, ast.Constant) and value.value in (None, ""):
                return "root"
            return "named" if isinstance(value, (ast.Constant, ast.JoinedStr)) or x.qualname(value) == "__name__" \
                else ""
    return ""


def _logger_parameters(project) -> list[tuple[ast.FunctionDef, str, ast.AST | None]]:
    """(function, parameter, its default) for each project function that configures `logging.getLogger(<parameter>)`
    (`def setup_logger(name, ...): lg = logging.getLogger(name); lg.addHandler(...)`)."""
    def compute():
        found = []
        for x in project.scripts.values():
            for d in x.defs:
                params = [a.arg for a in d.args.args]
                defaults = dict(zip(params[len(params) - len(d.args.defaults):], d.args.defaults))
                for n in ast.walk(d):
                    if isinstance(n, ast.Call) and x.qualname(n.func) in ("logging.getLogger", "getLogger") \
                            and len(n.args) == 1 and isinstance(n.args[0], ast.Name) and n.args[0].id in params:
                        found.append((d, n.args[0].id, defaults.get(n.args[0].id)))
                        break
        return found
    return project.memo("logger parameters", compute)


def _root_console_everywhere(project) -> bool:
    """The root logger writes to the console on every rank: `basicConfig(level=...)` without a file, or a
    StreamHandler added to the root, outside any rank check, with arguments that do not depend on the rank; also
    a project helper that adds a StreamHandler to `logging.getLogger(<parameter>)`, called for the root
    (`setup_logger(None, ..., screen=True)`; a handler it adds under `if screen:` counts where the call passes a
    true constant for it)."""
    helpers = [d for d, _, _ in _logger_parameters(project)]
    for x in project.scripts.values():
        for call in x.calls:
            if x.context(call).level or _chosen_by_rank(x, call):
                continue
            name = terminal(call.func)
            if name == "basicConfig" and keyword(call, "level") is not None and keyword(call, "filename") is None:
                handlers = keyword(call, "handlers")
                if handlers is None or any(isinstance(n, ast.Call) and terminal(n.func) == "StreamHandler"
                                           for n in ast.walk(handlers)):
                    return True
            if name == "addHandler" and call.args and _root_logger(x, call.func.value, call) == "root" \
                    and _stream_handler(x, call.args[0], call):
                return True
            for d in helpers:
                shown = _helper_shows_on_console(project, d, call) if d.name == name \
                    and _logger_target(project, x, call) == "root" else None
                if shown is not None:
                    project.memo(THROUGH_THE_ROOT, set).add(id(shown))
                    return True
    return False


def _stream_handler(x: Script, expr: ast.AST, within: ast.AST) -> bool:
    if isinstance(expr, ast.Name):
        return any(_stream_handler(x, v, within) for v in x.local_values(expr.id, within)
                   if not isinstance(v, ast.Name))
    return isinstance(expr, ast.Call) and terminal(expr.func) == "StreamHandler"


def _helper_shows_on_console(project, d: ast.FunctionDef, call: ast.Call) -> ast.Call | None:
    """The helper's addHandler of a StreamHandler that runs for this call: unconditional, or under `if <parameter>:`
    that the call passes true; None where there is none."""
    x = next((s for s in project.scripts.values() if any(f is d for f in s.defs)), None)
    if x is None:
        return None
    params = [a.arg for a in d.args.args]
    defaults = dict(zip(params[len(params) - len(d.args.defaults):], d.args.defaults))
    for n in ast.walk(d):
        if not (isinstance(n, ast.Call) and terminal(n.func) == "addHandler" and n.args
                and _stream_handler(x, n.args[0], n)):
            continue
        node, shown = n, True
        while (node := x.parents.get(id(node))) is not None and node is not d:
            if isinstance(node, ast.If):
                test = node.test
                if not (isinstance(test, ast.Name) and test.id in params):
                    shown = False
                    break
                value = argument(call, test.id, params.index(test.id)) or defaults.get(test.id)
                if not (isinstance(value, ast.Constant) and value.value):
                    shown = False
                    break
        if shown:
            return n
    return None
