"""Orders that differ between processes: a set of strings turned into a sequence or an index.

A set iterates in the order of its members' hashes, and Python salts the hash of every `str` per process
(PYTHONHASHSEED). `chars = tuple(set(text))` then `char2int = dict(enumerate(chars))` numbers the characters in
another order on each rank: DDP averages gradients of one-hot inputs and output classes that mean different things
(a vocabulary, class indices), or a sampler shards a file list each rank holds in its own order (samples seen twice,
others never). Sets of numbers iterate alike everywhere (an int's hash is its value): only what reads as strings is
named, and `sorted(...)` around the set, or a `.sort()` of the list made from it, is the fix.
"""

from __future__ import annotations

import ast
import functools
import re

from ddpkit.port.diskwrites import Site, reached
from ddpkit.port.weights import Follow, ast_dotted

__all__ = ["order_of", "orders_reached", "script_orders"]

_SEQUENCES = frozenset({"tuple", "list", "enumerate", "zip", "np.array", "numpy.array", "torch.tensor"})
"""Calls that keep the order in which a set iterates."""
_STR_CALLS = frozenset({"str", "os.listdir", "listdir", "glob.glob", "glob", "word_tokenize", "nltk.word_tokenize"})
"""Functions that return a string or a list of strings."""
_STR_METHODS = frozenset({"split", "read", "readlines", "splitlines", "lower", "upper", "strip", "rstrip", "lstrip",
                          "replace", "decode", "rsplit", "casefold"})
"""Methods of a string (or a file) that return a string or a list of strings."""
_STR_NAMES = re.compile(r"text|word|char|token|vocab|corpus|sentence|name|class|categor|letter|string|tag|file|path",
                        re.IGNORECASE)
"""Names that read as a string or a collection of strings (`text`, `words`, `class_names`, `files`)."""
_ORDERLESS = frozenset({"sorted", "len", "set", "frozenset", "min", "max", "any", "all", "sum", "Counter"})
"""Calls whose result does not depend on the order of what they are handed."""

@functools.lru_cache(maxsize=256)
def _scope(defn: ast.AST) -> tuple[dict[str, list[ast.expr]], set[int], set[str]]:
    """The values bound to each name, the ids of nodes under an order-free call and the names sorted in place, of a
    definition: read once per definition, since `order_of` is asked about each of its nodes."""
    bound: dict[str, list[ast.expr]] = {}
    free: set[int] = set()
    sorted_names: set[str] = set()
    for node in ast.walk(defn):
        if isinstance(node, ast.Assign):
            for target in (t for t in node.targets if isinstance(t, ast.Name)):
                bound.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.Call) and ast_dotted(node.func) in _ORDERLESS:
            free |= {id(n) for a in node.args for n in ast.walk(a)}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sort":
            sorted_names.add(ast_dotted(node.func.value))
    return bound, free, sorted_names


def _strings(node: ast.AST, bound: dict[str, list[ast.expr]], depth: int = 0) -> bool:
    """`node` reads as a string or a collection of strings: iterating it gives strings."""
    if depth > 3:
        return False
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.Call):
        func = ast_dotted(node.func)
        return func in _STR_CALLS or isinstance(node.func, ast.Attribute) and node.func.attr in _STR_METHODS
    if isinstance(node, ast.Name):
        return bool(_STR_NAMES.search(node.id)) or any(_strings(v, bound, depth + 1) for v in bound.get(node.id, []))
    if isinstance(node, ast.Attribute):
        return bool(_STR_NAMES.search(node.attr))
    if isinstance(node, ast.Subscript):
        return _strings(node.value, bound, depth + 1)
    if isinstance(node, ast.BinOp):
        return _strings(node.left, bound, depth + 1) or _strings(node.right, bound, depth + 1)
    if isinstance(node, (ast.SetComp, ast.ListComp, ast.GeneratorExp)):
        names = {n.id: g.iter for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        elt = node.elt
        return _strings(names[elt.id], bound, depth + 1) if isinstance(elt, ast.Name) and elt.id in names else \
            _strings(elt, bound, depth + 1)
    return False


def _string_set(node: ast.AST, bound: dict[str, list[ast.expr]], depth: int = 0) -> bool:
    """`set(text)`, `{w for w in line.split()}`, `set(a) - set(b)`, or a name bound to one: a set of strings."""
    if depth > 3:
        return False
    if isinstance(node, ast.Call) and ast_dotted(node.func) in ("set", "frozenset") and node.args:
        return _strings(node.args[0], bound)
    if isinstance(node, ast.SetComp):
        return _strings(node, bound)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Sub, ast.BitOr, ast.BitAnd, ast.BitXor)):
        return _string_set(node.left, bound, depth + 1)
    if isinstance(node, ast.Name):
        values = bound.get(node.id, [])
        return bool(values) and all(_string_set(v, bound, depth + 1) for v in values)
    return False


def _sorted_after(node: ast.Call, defn: ast.AST, sorted_names: set[str]) -> bool:
    """`chars = list(set(text))` whose name is sorted in place afterwards (`chars.sort()`)."""
    return any(isinstance(a, ast.Assign) and a.value is node and any(ast_dotted(t) in sorted_names for t in a.targets)
               for a in ast.walk(defn))


def order_of(node: ast.AST, defn: ast.AST) -> str:
    """A call of `defn` that makes a sequence in the order a set of strings iterates (`tuple(set(text))`,
    `enumerate(set(words))`, `"".join(set(chars))`, `[c for c in set(text)]`): its code, else ""."""
    bound, free, sorted_names = _scope(defn)
    if id(node) in free:
        return ""
    if isinstance(node, ast.ListComp):
        sets = [g.iter for g in node.generators]
    elif isinstance(node, ast.Call) and (ast_dotted(node.func) in _SEQUENCES or isinstance(
            node.func, ast.Attribute) and node.func.attr == "join"):
        sets = node.args if ast_dotted(node.func) == "zip" else node.args[:1]
    else:
        return ""
    if not any(_string_set(s, bound) for s in sets) or isinstance(node, ast.Call) and _sorted_after(
            node, defn, sorted_names):
        return ""
    return f"`{ast.unparse(node)[:60]}`"


def orders_reached(path: str, defn: ast.AST, follow: Follow, owner: tuple | None = None,
                   call: ast.Call | None = None, handed: list[tuple[str, ast.ClassDef]] = ()) -> list[Site]:
    """Every order of a set of strings `defn` makes on every rank, followed as diskwrites.writes_reached follows."""
    return reached(path, defn, follow, owner, call, handed, lambda _, n, d, __: order_of(n, d))


ORDER_FIX = ("its order follows each process's hash seed (PYTHONHASHSEED), so every rank numbers the same strings "
             "differently (a vocabulary, class indices, a file list a sampler shards); sort it (`sorted(set(...))`) "
             "or build it on rank 0 and share it (ddpkit.collectives.broadcast_object(ctx, ...))")
"""Why an order of a set of strings is wrong under DDP, and the fix: the tail of every message about one."""


def script_orders(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, message) for each sequence the script itself makes from a set of strings (see `order_of`)."""
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = {(node.lineno, what) for scope in scopes for node in ast.walk(scope) if (what := order_of(node, scope))}
    return [(line, f"{what} orders a set of strings: {ORDER_FIX}") for line, what in sorted(found)]
