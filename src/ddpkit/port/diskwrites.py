"""What the project's own code writes to disk on every rank: the file-system writes a call of the script reaches.

After the port every rank runs the script's calls into its own modules (a trainer's `fit`, a config parser, a logger
factory, a module whose import runs code). Where that code saves a checkpoint, dumps a pickle, draws a figure, opens
a log file or a TensorBoard writer, or makes a directory without `exist_ok=True`, every rank does it on the same
paths: writes race, `os.mkdir` after `os.path.exists` raises FileExistsError on the rank that comes second, and logs
mix. The writes are found with ast only, following `self.method()`, `super()`, base classes, classmethods and the
project's functions and classes (resolved by the caller's `follow`), a few levels deep, also a class or function
chosen from a module-level dict (`DATASETS[args.name](args)`), and a method of an object handed in (`dataset.prepare()`
in a function given `dataset`) where a class of that path has it: one the walk made, or one the script made and handed
to the call. A write under a rank test of the module itself, on a path named by the rank, or a mkdir that tolerates an
existing directory is not one. The walk itself (`reached`) takes what it looks for: ddpkit.port.asks uses it for
questions to the terminal, tracker runs and stops on a rank's own loss.
"""

from __future__ import annotations

import ast
import os
import re

from ddpkit.port.weights import Follow, ast_dotted

__all__ = ["PROCESSES", "Site", "callee", "made_classes", "method_of", "named_per_rank", "one_rank_nodes", "reached", "read_module",
           "table_entries", "tolerates_existing", "where", "write_of", "writer_class", "writes_reached"]

Site = tuple[str, int, str]
"""(file, line, what) of one write: ("src/solver.py", 173, "torch.save")."""

_ALWAYS = {"savefig", "save_image", "imwrite", "imsave", "mimsave", "mimwrite", "to_csv", "to_parquet", "to_pickle",
           "to_excel", "savetxt", "savez", "savez_compressed", "write_text", "write_bytes", "rmtree", "copyfile",
           "copytree", "SummaryWriter", "FileWriter", "create_file_writer", "FileHandler", "RotatingFileHandler",
           "TimedRotatingFileHandler", "urlretrieve", "export_scalars_to_json"}
"""Calls that write a file (or make a writer that does) whatever their receiver."""
_DUMPERS = {"pickle", "cPickle", "json", "yaml", "joblib", "dill", "torch", "np", "numpy", "pkl"}
_SHUTIL = {"copy", "copy2", "move"}
_OPENERS = {"open", "io.open", "codecs.open", "gzip.open", "bz2.open", "lzma.open"}
_RANKISH = re.compile(r"(^|[._])(rank|local_rank|global_rank|is_main\w*|is_master|master|master_process|main_process|"
                      r"is_rank_zero|rank_zero\w*|get_rank)$", re.IGNORECASE)
"""Names whose test in an `if` keeps its body to one rank (or names a file per rank)."""
_DEPTH = 4
_BUDGET = 80
PROCESSES = frozenset({"os.system", "os.popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
                       "subprocess.check_output", "subprocess.Popen", "subprocess.getoutput",
                       "subprocess.getstatusoutput", "os.spawnl", "os.spawnlp", "os.spawnv", "os.spawnvp"})
"""Calls that start a process: every rank would run the same command (a plot script, an evaluation) at once."""
_REDIRECT = re.compile(r">>?\s*(?!&|/dev/null\b)[\w./~$'\"{%-]")
"""A shell redirection into a file (`cat a b > /tmp/list.txt`, `2>> err.log`); not `2>&1` nor `> /dev/null`."""
_LIBRARY_METHODS = frozenset({"step", "zero_grad", "backward", "train", "eval", "to", "cuda", "cpu", "parameters",
                              "state_dict", "load_state_dict", "item", "forward", "__init__"})
"""Methods of torch's own objects (a module, an optimizer, a scheduler, a tensor): a parameter's call of one is not
matched to a project class of that path by its name alone."""


def _mode_writes(call: ast.Call, first: int) -> bool:
    """The open mode (positional `first`, or `mode=`) writes: w, a, x or +."""
    given = call.args[first] if len(call.args) > first else None
    mode = next((k.value for k in call.keywords if k.arg == "mode"), given)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and bool(set(mode.value) & set("wax+"))


def _may_exist_fail(call: ast.Call, defn: ast.AST) -> bool:
    """A makedirs/mkdir that raises where the directory exists: no `exist_ok`, `exist_ok=False`, or a name the
    function binds to a test (`exist_ok = run_id == ''`: False for every real run id)."""
    value = next((k.value for k in call.keywords if k.arg == "exist_ok"), None)
    if value is None:
        return True
    if isinstance(value, ast.Constant):
        return not value.value
    bound = [n.value for n in ast.walk(defn) if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and isinstance(value, ast.Name) and t.id == value.id for t in n.targets)]
    return bool(bound) and all(isinstance(b, (ast.Compare, ast.BoolOp, ast.UnaryOp)) for b in bound)


def write_of(call: ast.Call, defn: ast.AST) -> str:
    """What `call` (in `defn`) writes to the file system, as a short name ("torch.save", "os.makedirs", "open(w)");
    "" where it writes nothing (or makes a directory that may already exist)."""
    func = ast_dotted(call.func)
    last = func.rsplit(".", 1)[-1] if func else (call.func.attr if isinstance(call.func, ast.Attribute) else "")
    head = func.split(".")[0] if "." in func else ""
    short = func if func.count(".") == 1 and head not in ("self", "cls") else last
    if func in _OPENERS:
        return "open(w)" if _mode_writes(call, 1) else ""
    if func in PROCESSES and _REDIRECT.search(_command_text(call, defn)):
        return f"{func} (a shell redirect)"
    if last == "open" and isinstance(call.func, ast.Attribute) and func not in _OPENERS:  # `path.open("w")`
        return "open(w)" if _mode_writes(call, 0) else ""
    if last in _ALWAYS or func.endswith("onnx.export"):
        return short
    if last == "save" and call.args and head not in ("self", "cls"):
        return short
    if last == "dump" and head in _DUMPERS and len(call.args) + len(call.keywords) >= 2:
        return short
    if last in _SHUTIL and head == "shutil":
        return short
    if last in ("makedirs", "mkdir"):
        return short if _may_exist_fail(call, defn) else ""
    if last == "add" and head == "logger" and call.args and not ast_dotted(call.args[0]).startswith("sys."):
        return "logger.add (a log file)"  # loguru's file sink
    if last == "basicConfig" and any(k.arg == "filename" for k in call.keywords):
        return "logging.basicConfig(filename=...)"
    return ""


def _command_text(call: ast.Call, defn: ast.AST) -> str:
    """The literal text of a process call's command (`"cat %s > /tmp/l.txt" % x`, `["sh", "-c", "..."]`), also
    through a name `defn` binds to it (`cmd = f"..."; os.system(cmd)`)."""
    command = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg in ("args", "cmd")), None)
    if command is None:
        return ""
    parts = [command] + [n.value for n in ast.walk(defn) if isinstance(command, ast.Name) and isinstance(
        n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == command.id for t in n.targets)]
    return " ".join(ast.unparse(p) for p in parts)  # `'cat %s > %s' % (...)`, `f"ls > {out}"`: the target kept


def tolerates_existing(node: ast.Try) -> bool:
    """A `try` whose handlers let an existing file or directory pass: one catches FileExistsError, or none raises
    nor exits except under a test of the error's errno (`if e.errno != errno.EEXIST: raise`)."""
    if any(h.type is not None and "FileExistsError" in ast.unparse(h.type) for h in node.handlers):
        return True
    checked = {id(n) for h in node.handlers for i in ast.walk(h) if isinstance(i, ast.If) and re.search(
        r"errno|EEXIST", ast.unparse(i.test)) for s in i.body for n in ast.walk(s)}
    return bool(node.handlers) and not any(
        (isinstance(n, ast.Raise) or isinstance(n, ast.Call) and ast_dotted(n.func) in (
            "exit", "quit", "sys.exit", "os._exit")) and id(n) not in checked
        for h in node.handlers for n in ast.walk(h))


def _unset(defn: ast.AST, call: ast.Call | None) -> set[str]:
    """Parameters of `defn` that are false for `call` (None, False, "", 0), passed so or left at such a default: code
    under `if param:` does not run for it (`Logger.get()` opens no file where `file_path=None`; `train(loader,
    save_gif=False)` draws no GIF). Empty where the call unpacks arguments."""
    if call is None or not isinstance(defn, (ast.FunctionDef, ast.AsyncFunctionDef)) or any(
            isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return set()
    positional = [a.arg for a in defn.args.posonlyargs + defn.args.args]
    values = dict(zip(positional[len(positional) - len(defn.args.defaults):], defn.args.defaults))
    values.update({a.arg: d for a, d in zip(defn.args.kwonlyargs, defn.args.kw_defaults) if d is not None})
    first = 1 if positional[:1] in (["self"], ["cls"]) else 0
    values.update(zip(positional[first:], call.args))
    values.update({k.arg: k.value for k in call.keywords})
    return {n for n, v in values.items() if isinstance(v, ast.Constant) and not v.value}


def _tests(test: ast.AST, names: set[str]) -> bool:
    """`if name:` or `if name is not None:` for one of `names`."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.IsNot):
        test = test.left
    return isinstance(test, ast.Name) and test.id in names


def one_rank_nodes(defn: ast.AST, unset: set[str] = frozenset()) -> set[int]:
    """id() of the nodes `defn` runs on one rank only (the body of an `if` that tests a rank), not at all (under a
    test of a parameter the call leaves unset), or where an existing directory is fine (the body of a `try` whose
    handlers let it pass)."""
    out: set[int] = set()
    for node in ast.walk(defn):
        if isinstance(node, ast.If) and (_tests(node.test, unset) or any(
                _RANKISH.search(ast_dotted(n) or "") for n in ast.walk(node.test)
                if isinstance(n, (ast.Name, ast.Attribute)))):
            out.update(id(n) for s in node.body for n in ast.walk(s))
        elif isinstance(node, ast.Try) and tolerates_existing(node):
            out.update(id(n) for s in node.body for n in ast.walk(s) if isinstance(n, ast.Call) and (
                ast_dotted(n.func) or getattr(n.func, "attr", "")).rsplit(".", 1)[-1] in ("makedirs", "mkdir"))
    return out


def writer_class(path: str, cls: ast.ClassDef, follow: Follow, depth: int = 0) -> str:
    """The library writer a project class is made from (`class TensorboardWriter(SummaryWriter)`: "SummaryWriter"),
    through the project's own bases; "" for none."""
    for base in cls.bases:
        name = ast_dotted(base)
        if name.rsplit(".", 1)[-1] in _ALWAYS:
            return name.rsplit(".", 1)[-1]
        found = follow(name, path) if name and depth < 3 else None
        got = writer_class(*found, follow, depth + 1) if found and isinstance(found[1], ast.ClassDef) else ""
        if got:
            return got
    return ""


def _writer_made(path: str, call: ast.Call, follow: Follow) -> str:
    """`TensorboardWriter(...)` of a project class made from a library writer: "TensorboardWriter (a SummaryWriter)"."""
    func = ast_dotted(call.func)
    found = follow(func, path) if func and func.count(".") <= 1 else None
    base = writer_class(*found, follow) if found is not None and isinstance(found[1], ast.ClassDef) else ""
    return f"{func} (a {base})" if base else ""


def named_per_rank(call: ast.Call) -> bool:
    """The write names its file by the rank (`f"log_{rank}.txt"`): each rank writes its own."""
    return any(_RANKISH.search(ast_dotted(n) or "") for a in [*call.args, *(k.value for k in call.keywords)]
               for n in ast.walk(a) if isinstance(n, (ast.Name, ast.Attribute)))


def method_of(path: str, cls: ast.ClassDef, name: str, follow: Follow,
              depth: int = 0) -> tuple[str, ast.AST, tuple] | None:
    """(file, method, its class) of `name` on instances of `cls`: defined there or in a base of the project."""
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return path, node, (path, cls)
    return _in_bases(path, cls, name, follow, depth) if depth < 3 else None


def _in_bases(path: str, cls: ast.ClassDef, name: str, follow: Follow,
              depth: int = 0) -> tuple[str, ast.AST, tuple] | None:
    """`name` in the first base of `cls` (of the project) that has it: what `super().name` runs in `cls`."""
    for base in cls.bases:
        found = follow(ast_dotted(base), path) if ast_dotted(base) else None
        if found is not None and isinstance(found[1], ast.ClassDef):
            hit = method_of(found[0], found[1], name, follow, depth + 1)
            if hit is not None:
                return hit
    return None


def callee(path: str, call: ast.Call, owner: tuple | None,
           follow: Follow) -> tuple[str, ast.AST, tuple | None] | None:
    """(file, definition that runs, its class) for a call in module `path` of the project's own code: a function,
    a class (its `__init__`), `self.method`/`cls.method`, `super().method`, `Class.method`; None for anything else."""
    func = ast_dotted(call.func)
    if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Call) and \
            ast_dotted(call.func.value.func) == "super":
        return _in_bases(*owner, call.func.attr, follow) if owner is not None else None
    head, _, rest = func.partition(".")
    if owner is not None and head in ("self", "cls") and rest and "." not in rest:
        return method_of(*owner, rest, follow)
    if owner is not None and func == "cls":
        return method_of(*owner, "__init__", follow)
    if not func or func.count(".") > 1:
        return None
    found = follow(func, path)
    if found is None and rest:  # `Config.from_args(...)`: a method of a class of the project
        cls = follow(head, path)
        return method_of(cls[0], cls[1], rest, follow) if cls is not None and isinstance(cls[1], ast.ClassDef) else None
    if found is None:
        return None
    if isinstance(found[1], ast.ClassDef):
        return method_of(found[0], found[1], "__init__", follow)
    return (found[0], found[1], None) if isinstance(found[1], (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def read_module(path: str) -> ast.Module | None:
    """The parsed module at `path`, or None where it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None


def _lookup(func: ast.AST, defn: ast.AST | None) -> ast.Subscript | None:
    """`_factory[name]` where a call calls it, directly or through `chosen = _factory[name]` bound in `defn`."""
    if isinstance(func, ast.Name) and defn is not None:
        bound = [n.value for n in ast.walk(defn) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Subscript)
                 and any(isinstance(t, ast.Name) and t.id == func.id for t in n.targets)]
        func = bound[0] if len(bound) == 1 else func  # `loader = LOADERS[code]; loader = loader(args)`: the lookup
    return func if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) else None


def table_entries(module: ast.Module | None, func: ast.AST, defn: ast.AST | None = None) -> list[str]:
    """`_factory[name](...)` called, or `chosen(...)` with `chosen = _factory[name]` bound in `defn`: the names a
    module-level dict literal `_factory = {"a": f, "b": g}` holds (every one may be the one called), else none."""
    func = _lookup(func, defn)
    if module is None or func is None:
        return []
    tables = [n.value for n in module.body if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == func.value.id for t in n.targets)]
    if len(tables) != 1 or not isinstance(tables[0], ast.Dict):
        return []
    return [v.id for v in tables[0].values if isinstance(v, ast.Name)]


def _chosen(path: str, call: ast.Call, defn: ast.AST, follow: Follow) -> list[tuple[str, ast.AST]]:
    """(file, definition) of each function or class a call may run: the one it names, else each entry of the dict it
    chose from (`DATASETS[args.name](args)`)."""
    func = ast_dotted(call.func)
    found = follow(func, path) if func and func.count(".") <= 1 else None
    if found is not None:
        return [found]
    if _lookup(call.func, defn) is None:
        return []  # (the module is read only for a call that chose from a dict)
    return [hit for name in table_entries(read_module(path), call.func, defn) if (hit := follow(name, path))]


def made_classes(path: str, defn: ast.AST, follow: Follow) -> list[tuple[str, ast.ClassDef]]:
    """(file, class) of what calling `defn` makes: the class itself, or each project class a factory function
    returns an instance of (`return Trainer(args)`, `return TRAINERS[name](args)`, `net = Net(); return net`)."""
    if isinstance(defn, ast.ClassDef):
        return [(path, defn)]
    made = {t.id: n.value for n in ast.walk(defn) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            for t in n.targets if isinstance(t, ast.Name)}
    returned = [r.value if isinstance(r.value, ast.Call) else made.get(ast_dotted(r.value)) for r in ast.walk(defn)
                if isinstance(r, ast.Return) and r.value is not None]
    return [hit for call in returned if call is not None for hit in _chosen(path, call, defn, follow)
            if isinstance(hit[1], ast.ClassDef)]


def _handed_in(defn: ast.AST, call: ast.Call) -> str:
    """`x.method(...)` on a parameter `x` of `defn` (not self/cls), of no method torch's own objects have: "method"."""
    params = {a.arg for a in defn.args.posonlyargs + defn.args.args + defn.args.kwonlyargs} - {"self", "cls"} \
        if isinstance(defn, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in params and \
            func.attr not in _LIBRARY_METHODS:
        return func.attr
    return ""


def _callees(where: str, call: ast.Call, node: ast.AST, cls: tuple | None, follow: Follow,
             made: list[tuple[str, ast.ClassDef]]) -> list[tuple[str, ast.AST, tuple | None]]:
    """What a call in `node` runs (see `callee`), also each entry of a dict it chose from; classes it makes are added
    to `made`."""
    found = callee(where, call, cls, follow)
    if found is not None:
        picked = follow(ast_dotted(call.func), where) if ast_dotted(call.func).count(".") == 0 else None
        made += [picked] if picked is not None and isinstance(picked[1], ast.ClassDef) else []
        return [found]
    out = []
    for path, defn in _chosen(where, call, node, follow):
        made += [(path, defn)] if isinstance(defn, ast.ClassDef) else []
        hit = method_of(path, defn, "__init__", follow) if isinstance(defn, ast.ClassDef) else (path, defn, None) \
            if isinstance(defn, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        out += [hit] if hit is not None else []
    return out


def _write_or_writer(path: str, node: ast.AST, defn: ast.AST, follow: Follow) -> str:
    return write_of(node, defn) or _writer_made(path, node, follow) if isinstance(node, ast.Call) else ""


def writes_reached(path: str, defn: ast.AST, follow: Follow, owner: tuple | None = None,
                   call: ast.Call | None = None, handed: list[tuple[str, ast.ClassDef]] = ()) -> list[Site]:
    """Every write `defn` (of module `path`; a method of class `owner` = (file, class); run by `call`, which hands it
    objects of the project classes `handed`) makes on every rank, itself or through the project's code it calls, a
    level at a time; by file as met, then by line. A method called on a parameter is looked up in `handed` and in the
    classes the walk made once nothing else is left."""
    return reached(path, defn, follow, owner, call, handed, _write_or_writer)


def reached(path: str, defn: ast.AST, follow: Follow, owner: tuple | None, call: ast.Call | None,
            handed: list[tuple[str, ast.ClassDef]], find) -> list[Site]:  # noqa: ANN001
    """The sites `find(file, node, definition, follow)` names (a short text, "" for none) in `defn` and the project
    code its calls run on every rank (see `writes_reached`)."""
    sites: list[Site] = []
    seen: set[int] = set()
    made: list[tuple[str, ast.ClassDef]] = list(handed)
    todo = [(path, defn, owner, 0, call)]
    deferred: list[tuple[str, ast.Call, int]] = []
    while (todo or deferred) and len(seen) < _BUDGET:
        if not todo:
            todo = [(*hit, depth + 1, c) for _, c, depth in deferred for p, k in dict.fromkeys(made)
                    if (hit := method_of(p, k, c.func.attr, follow)) and id(hit[1]) not in seen]
            deferred = []
            continue
        where, node, cls, depth, by = todo.pop(0)
        if id(node) in seen:
            continue
        seen.add(id(node))
        skipped = one_rank_nodes(node, _unset(node, by))
        for inner in (n for n in ast.walk(node) if id(n) not in skipped):
            what = find(where, inner, node, follow)
            if what:
                sites += [] if isinstance(inner, ast.Call) and named_per_rank(inner) else [(where, inner.lineno, what)]
            elif not isinstance(inner, ast.Call):
                continue
            elif depth < _DEPTH and (found := _callees(where, inner, node, cls, follow, made)):
                todo += [(*f, depth + 1, inner) for f in found]
            elif depth < _DEPTH and _handed_in(node, inner):
                deferred.append((where, inner, depth))
    files = {f: i for i, f in enumerate(dict.fromkeys(s[0] for s in sites))}
    return sorted(dict.fromkeys(sites), key=lambda s: (files[s[0]], s[1]))


def where(site: Site, folder: str) -> str:
    """`file:line what` of a site, the file relative to the script's folder."""
    return f"{os.path.relpath(site[0], folder)}:{site[1]} {site[2]}"
