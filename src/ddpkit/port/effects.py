"""Side effects every rank would repeat after `ddpkit port`: downloads, files written, run trackers.

Planned before the rewrite: a download runs on rank 0 first (the others wait, then read its files),
a file write runs on rank 0 only, a file read after a rank-0 write waits at a barrier, a directory is
created race-free, and a tracker (TensorBoard, W&B, MLflow) lives on rank 0. What cannot be placed
safely gets a TODO naming the blocker.
"""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.diskwrites import PROCESSES
from ddpkit.port.facts import ENTRY, dotted, hands_to_unported, imported_names, statements_of, walk
from ddpkit.port.files import pyplot_names
from ddpkit.port.ranks import agreed, library_loader, saves_file

__all__ = ["plan_effects", "check_rank0_bindings", "DOWNLOADS", "FETCHES"]

DOWNLOADS = re.compile(r"(^|\.)(?<!Embedding\.)(?<!EmbeddingBag\.)(urlretrieve|from_pretrained|hf_hub_download|"
                       r"snapshot_download|load_dataset|download_url|download_and_extract_archive|download_file_from_google_drive|gdown\.download|"
                       r"wget\.download|hub\.load|load_state_dict_from_url|fetch_openml|fetch_\w+)$")
"""Calls that download by their name; `nn.Embedding.from_pretrained(vectors)` only copies a tensor it is given."""
_WRITES = re.compile(r"(^|\.)(to_csv|to_json|to_parquet|to_excel|to_hdf|to_feather|to_netcdf|savefig|save_image|"
                     r"imwrite|imsave|mimsave|mimwrite|savemat|save_pretrained|push_to_hub|write_text|write_bytes|savetxt|save|"
                     r"savez|savez_compressed|dump|to_pickle|onnx\.export)$|(^|\.)(sf|soundfile|wavfile|imageio|cv2)\.write$")
FETCHES = re.compile(r"^(torch_geometric\.datasets\.\w+|ogb\.\w+\.\w*Dataset|dgl\.data\.\w*Dataset|"
                      r"torchtext\.(experimental\.)?datasets\.(?!\w*Dataset\b)\w+(\.splits|\.iters)?|"
                      r"torchtext\.vocab\.(GloVe|FastText|CharNGram)|(tensorflow_datasets|tfds)\.(load|builder)|"
                      r"(tensorflow\.)?keras\.datasets\.\w+\.load_data|gensim\.downloader\.load|nltk\.download|"
                      r"spacy\.cli\.download|torch_geometric\.data\.download_url|wget\.download|"
                      r"(tensorflow\.)?keras\.utils\.get_file|torch\.hub\.download_url_to_file)$")
"""Calls of libraries that fetch files on the first call with no `download=` argument: a graph dataset's class
(`Planetoid(root, name)`, `PygNodePropPredDataset(name)`, `CoraGraphDataset()`), torchtext's datasets and its
pretrained word vectors (`GloVe(name="6B")` fetches ~800 MB into .vector_cache), Keras's
`load_data()`, `nltk.download(...)`, resolved through the script's imports."""
_SHELL_FETCH = re.compile(r"\b(wget|curl|gdown|kaggle|git\s+clone|unzip|tar\s+-?x|pip3?\s+install|conda\s+install|"
                          r"mkdir\s+-p)\b")
"""`os.system("wget ...")`, `subprocess.run(["unzip", ...])`: a shell command that downloads or unpacks files, installs
a package or makes a folder; each rank needs its result and may run it again once rank 0 has (it is idempotent)."""
_FILE_OBJECTS = {"File": "r", "ZipFile": "r", "HDFStore": "a", "open_file": "r", "ExcelWriter": "w"}
"""Library classes that open a file by path (h5py.File, zipfile.ZipFile, pandas' HDFStore and ExcelWriter, PyTables'
open_file) -> their default mode."""
_CONSOLE = re.compile(r"^(print|tqdm\.write)$|(^|\.)(info|debug|warning|warn|error|critical)$|^(log|logger|logging)\.log$")
_READS = re.compile(r"(^|\.)(torch\.load|read_csv|read_json|read_parquet|load|loadtxt|read_text|read_bytes|"
                    r"imread|from_pretrained)$")
_TRACKERS = {"SummaryWriter": "a TensorBoard SummaryWriter", "wandb.init": "a W&B run",
             "mlflow.start_run": "an MLflow run", "mlflow.set_experiment": "an MLflow experiment"}
_EXPERIMENT_TRACKERS = re.compile(r"^(hyperdash|comet_ml|neptune|clearml|aim|trains|sacred|tensorboardX|"
                                  r"dvclive|swanlab|polyaxon)(\.|$)")
"""Libraries whose run objects (`Experiment("name")`, `Run(...)`) each log a copy of the run when made on every rank."""
_MAKEDIRS = frozenset({"os.makedirs", "makedirs", "os.mkdir"})
_FILE_OPS = frozenset({"shutil.copy", "shutil.copyfile", "shutil.copy2", "shutil.copytree", "shutil.move",
                       "shutil.rmtree", "copyfile", "copy2", "copytree", "rmtree", "os.remove", "os.unlink",
                       "os.rename", "os.replace", "os.rmdir", "os.removedirs"})
"""Calls that change files on disk: every rank would copy, move or delete the same file at once."""
_OPENER_MODULES = frozenset({"io", "os", "gzip", "bz2", "lzma", "codecs", "tarfile", "zipfile", "h5py", "fsspec",
                             "smart_open", "tf", "tensorflow"})
"""Modules whose `open(path, mode)` takes the path first; any other `x.open("wb")` is a path object's (mode first)."""
_CAPTURES = frozenset({"subprocess.check_output", "subprocess.getoutput", "subprocess.getstatusoutput", "os.popen"})
"""Process calls that hand the command's output back: bound to a name, the script reads what it prints."""
_LOGGER_CLASS = re.compile(r"[A-Z]\w*(Logger|Writer|Recorder)$")
_LOG_MODULES = re.compile(r"(^|[._])(tensorboard\w*|\w*logger|visdom|wandb|mlflow|neptune|comet_ml|aim)($|\.)")


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    return [n for n in walk(node) if isinstance(n, cst.Call)]


_MODE = re.compile(r"[rwaxbtU+]{1,4}")


def _open_mode(call: cst.Call) -> str:
    args = [a for a in call.args if a.keyword is None]
    at = 1
    if isinstance(call.func, cst.Attribute) and dotted(call.func.value).split(".")[0] not in _OPENER_MODULES \
            and args and isinstance(args[0].value, cst.SimpleString) and isinstance(
            args[0].value.evaluated_value, str) and _MODE.fullmatch(args[0].value.evaluated_value):
        at = 0  # `path.open("wb")`: a path object's own open takes the mode first
    mode = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "mode"),
                args[at].value if len(args) > at else None)
    return mode.evaluated_value if isinstance(mode, cst.SimpleString) and isinstance(
        mode.evaluated_value, str) else "" if mode is None else "?"


def _file_object_mode(call: cst.Call) -> str | None:
    """`h5py.File(path, "w")` -> "w"; None for a call that opens no file object by path."""
    name = dotted(call.func)
    last = name.rsplit(".", 1)[-1]
    if last not in _FILE_OBJECTS or (last == "File" and name not in ("File", "h5py.File")):
        return None
    mode = _open_mode(call)
    return _FILE_OBJECTS[last] if mode == "" else mode


def _writes(call: cst.Call) -> bool:
    name = dotted(call.func)
    mode = _file_object_mode(call)
    if mode is not None:
        return mode == "?" or any(c in mode for c in "wax+")
    if name in ("open", "io.open") or (isinstance(call.func, cst.Attribute) and call.func.attr.value == "open"
                                       and name != "Image.open"):
        mode = _open_mode(call)
        return mode == "?" or any(c in mode for c in "wax+")
    if name == "torch.save":
        return False  # handled by the rewriter's own torch.save guard
    if name in _FILE_OPS:
        return True
    return bool(_WRITES.search(name)) and not name.startswith("self.") and name not in ("json.dumps",)


def _reports(stmt: cst.CSTNode) -> bool:
    """`print(...)`, `logger.info(...)`: a line that only shows text on the console or in a log."""
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and _CONSOLE.search(dotted(s.value.func))
        for s in stmt.body)


def _reads(call: cst.Call) -> bool:
    name = dotted(call.func)
    mode = _file_object_mode(call)
    if mode is not None:
        return mode == "?" or "r" in mode or "a" in mode or "+" in mode
    if name in ("open", "io.open"):
        mode = _open_mode(call)
        return mode == "" or "r" in mode
    return bool(_READS.search(name)) and name not in ("json.loads", "pickle.loads")


def _fetches(imports: dict[str, str], call: cst.Call) -> bool:
    """A library call that downloads on its own (`Planetoid(root, name)`) or a shell command that fetches files."""
    name = dotted(call.func)
    first, _, rest = name.partition(".")
    if first in imports and FETCHES.match(f"{imports[first]}.{rest}" if rest else imports[first]):
        return True
    if name in ("os.system", "subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.check_output",
                "subprocess.Popen", "os.popen") and call.args:
        text = " ".join(str(n.evaluated_value) for n in walk(call.args[0].value)
                        if isinstance(n, cst.SimpleString) and isinstance(n.evaluated_value, str))
        return bool(_SHELL_FETCH.search(text))
    return False


def _downloads(call: cst.Call) -> bool:
    """A download, or a cached preprocessing pass (`dataset.map(fn, num_proc=8)`) rank 0 should run first."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "map" and any(
            a.keyword is not None and a.keyword.value in ("num_proc", "batched", "load_from_cache_file")
            for a in call.args):
        return True
    return bool(DOWNLOADS.search(dotted(call.func))) or any(
        a.keyword is not None and a.keyword.value == "download" and dotted(a.value) not in ("False", "None")
        for a in call.args)  # `download=DOWNLOAD` decided at run time: maybe


def plan_effects(plan: Any) -> None:
    """Fill plan.main_first, plan.guard, plan.barrier_before, plan.exist_ok and plan.trackers (ids of nodes)."""
    f = plan.f
    statements: list[tuple[str, cst.BaseStatement]] = []
    for key in sorted(f.ported):
        for node in plan.nodes(key):
            if isinstance(node, cst.BaseStatement) and not isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                statements.append((key, node))
    writes: list[tuple[str, int]] = [(k, plan.line_of(s)) for k, s in statements if isinstance(
        s, cst.SimpleStatementLine) and any(isinstance(n, cst.Call) and dotted(n.func) == "torch.save" for n in walk(s))]
    tracker_names: dict[str, tuple[cst.BaseStatement, str]] = {}
    pyplot = pyplot_names(f.module)
    imports = imported_names(f.module)
    handles: dict[str, tuple[str, cst.SimpleStatementLine]] = {}
    _plan_file_types(plan)
    _plan_before_init(plan)
    for key, stmt in statements:
        own = [c for c in _own_calls(stmt) if not f.callees(c, key)]  # the script's own functions: ported too
        if isinstance(stmt, cst.If) and _logs_through_library(plan, key, stmt):
            plan.guard.add(id(stmt))  # `if args.tensorboard: configure(...)`: one log, from rank 0
            continue
        if not own:
            continue
        asked = next((c for c in own if dotted(c.func) == "input" and "input" not in f.scopes), None)
        if asked is not None:
            plan.todo(stmt, "`input(...)` asks on every rank: one answer from the terminal reaches rank 0 at most, and "
                      "a rank that answers alone goes its own way (into training the others never start: a hang); "
                      "ask on rank 0 and share the answer: `ddpkit.collectives.broadcast_object(ctx, input(...) if ctx.is_main "
                      "else None)`")
            continue
        calls_model = any(plan.role(key, dotted(c.func)) == "model" for c in own)
        fetched = next((plan.fetches[dotted(c.func)] for c in own if dotted(c.func) in plan.fetches), None)
        if fetched is not None and (fetched[2] or not isinstance(stmt, cst.SimpleStatementLine)):
            # the project's code downloads and also trains or joins a collective: rank 0 cannot run it first alone
            plan.todo(stmt, f"this call downloads on every rank at once ({fetched[0]}:{fetched[1]}), and "
                      "the project's code it runs also trains or joins a collective, so rank 0 cannot run it first: "
                      "download there on rank 0 (`if ctx.is_main:`), then ddpkit.barrier(ctx) where every rank passes")
            continue
        if fetched is not None and len(fetched) > 3:
            # rank 0 first would not do: the others, after the barrier, would fetch and write the same files again
            # while their peers read them
            plan.todo(stmt, f"this call downloads on every rank at once ({fetched[0]}:{fetched[1]} {fetched[3]}), "
                      "and fetches again wherever it runs (no check for the files first), so the other ranks cannot "
                      "run it after rank 0 either: download on rank 0 alone (`if ctx.is_main:`), "
                      "ddpkit.barrier(ctx) where every rank passes, and make the other ranks only read the files")
            continue
        if (fetched is not None or any(_downloads(c) or _fetches(imports, c) for c in own)) \
                and isinstance(stmt, cst.SimpleStatementLine):
            if all(agreed(plan, key, test) for test in _branch_tests(plan, stmt)):
                plan.main_first.add(id(stmt))
                if "mkdir" in plan.f.code(stmt) and not any(_downloads(c) for c in own):
                    plan.first_note[id(stmt)] = "creates"
            else:
                plan.todo(stmt, "a download inside a branch that ranks may decide differently (a file on disk, "
                          "a per-rank value): download on rank 0 before the branch (`if ctx.is_main:`), then "
                          "ddpkit.barrier(ctx) where every rank passes")
            continue
        for call in own:
            receiver = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else ""
            if receiver and receiver.split(".")[0] in f.imported - {"os", "pathlib", "shutil"} \
                    and call.func.attr.value in ("mkdir", "makedirs", "mkdirs"):
                # `utils.mkdir(path)`: a helper of the script's own module (no exist_ok), often check-then-create
                if isinstance(stmt, cst.SimpleStatementLine) and all(
                        agreed(plan, key, test) for test in _branch_tests(plan, stmt)):
                    plan.main_first.add(id(stmt))
                    plan.first_note[id(stmt)] = "creates"
                else:
                    plan.todo(stmt, f"`{dotted(call.func)}(...)` runs on every rank and may race (check, then "
                              "create): call it on rank 0 (`if ctx.is_main:`), then ddpkit.barrier(ctx) where every "
                              "rank passes")
            elif dotted(call.func) in _MAKEDIRS or (isinstance(call.func, cst.Attribute) and call.func.attr.value
                                                    == "mkdir" and not dotted(call.func).startswith("os.")):
                if not any(a.keyword is not None and a.keyword.value == "exist_ok" for a in call.args):
                    plan.exist_ok.add(id(call))
        tracker, kind = next(((c, k) for c in _header_calls(stmt) if (k := _tracker_kind(c, library_loader(plan.f, c)))),
                             (None, ""))
        if tracker is not None:
            if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign) \
                    and dotted(stmt.body[0].targets[0].target):
                tracker_names[dotted(stmt.body[0].targets[0].target)] = (stmt, kind)
            elif isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr):
                tracker_names.setdefault(dotted(tracker.func).split(".")[0], (stmt, kind))
            else:
                plan.todo(stmt, f"{kind} is started on every rank (each would log its own copy): start it under "
                          "`if ctx.is_main:` and guard every use of it the same way")
            continue
        handler = next((c for c in own if _log_file(c)), None)
        if handler is not None:
            plan.todo(stmt, f"not checked: `{dotted(handler.func)}(...)` makes every rank's log lines go to the same "
                      "file at once: add the file handler on rank 0 only (`if ctx.is_main:`), or name a file per "
                      "rank (ctx.rank)")
            continue
        if _logs_through_library(plan, key, stmt) and not calls_model:
            plan.guard.add(id(stmt))  # `log_value("loss", v)` of a logging library: one log, from rank 0
            continue
        if pyplot and isinstance(stmt, cst.SimpleStatementLine) and not calls_model and not any(
                _writes(c) for c in own) and all(
                isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and dotted(s.value.func).split(".")[0]
                in pyplot for s in stmt.body):
            plan.guard.add(id(stmt))  # `plt.show()`, `plt.imshow(...)`: one window, on rank 0
            continue
        project = _project_call(plan, key, stmt)
        if project == "writes":
            plan.guard.add(id(stmt))  # `plotter.flush()` of the project's own class: it only writes files
            writes.append((key, plan.line_of(stmt)))
            _wait_after_disk_branch(plan, key, stmt)
            if key == f.entry_key and not plan.under_branch(stmt, key) and plan.loop_around(stmt) is None:
                # `make_data()` then `Dataset("data/x.csv")`: the project's code may read what rank 0 wrote, by
                # paths the port does not see; one barrier where every rank passes once
                plan.wait_after.add(id(stmt))
            continue
        if project:
            continue  # `snapshots.dump()` whose method does more than write: judged by what it does (the claim gate)
        process = next((c for c in own if dotted(c.func) in PROCESSES), None)
        if process is not None and not calls_model and isinstance(stmt, cst.SimpleStatementLine):
            if all(isinstance(s, cst.Expr) for s in stmt.body) or not _captured(stmt, process):
                plan.guard.add(id(stmt))  # one process, not one per rank writing the same files at once
                writes.append((key, plan.line_of(stmt)))  # reads of what it wrote wait at a barrier
            continue  # `out = subprocess.check_output(["git", ...])`: the script reads its output; a query
        if any(_writes(c) for c in own):
            if calls_model:
                plan.todo(stmt, "this line writes a file on every rank and calls the model: compute the value on "
                          "every rank first, then write it under `if ctx.is_main:`")
            elif isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, cst.Expr) for s in stmt.body):
                plan.guard.add(id(stmt))
                writes.append((key, plan.line_of(stmt)))
            elif _write_handle(stmt) and not _rebound(plan, key, stmt):
                handles[dotted(stmt.body[0].targets[0].target)] = (key, stmt)  # `hf = h5py.File(path, "w")`
                writes.append((key, plan.line_of(stmt)))
            elif isinstance(stmt, cst.With) and not any(isinstance(n, cst.For) or plan.role(key, dotted(
                    getattr(n, "func", None))) == "model" for n in walk(stmt.body)):
                plan.guard.add(id(stmt))
                writes.append((key, plan.line_of(stmt)))
            else:
                plan.todo(stmt, "every rank writes this file (the same path, at once): write it on one rank "
                          "(`if ctx.is_main:`) and make the others wait (`ddpkit.barrier(ctx)`) before they read it")
    _plan_trackers(plan, tracker_names)
    _plan_handles(plan, handles)
    _plan_unported_writes(plan)
    _plan_after_close(plan)
    # a save helper of another module (`save_checkpoint(PATH, model, ...)`) is put on rank 0 by the rewriter
    writes += [(k, plan.line_of(s)) for k, s in statements if isinstance(s, cst.SimpleStatementLine) and any(
        saves_file(plan, k, c) and dotted(c.func) != "torch.save" for c in _calls(s))]
    if not writes:
        return
    first = _first_writes(plan, statements, writes)
    written = {(k, line) for k, line in writes}
    paths = {p for k, s in statements if (k, plan.line_of(s)) in written and isinstance(s, (
        cst.SimpleStatementLine, cst.With)) for c in _own_calls(s) for p in _path_args(plan, c)}
    handed, sites = _handed_paths(plan, statements, written)
    paths |= handed
    holders = {h for k, s in statements if (k, plan.line_of(s)) in written and isinstance(s, (
        cst.SimpleStatementLine, cst.With)) for c in _own_calls(s) for h in _path_holders(c)}
    entered = _entered_after_write(plan, statements, writes)
    for key, stmt in statements:
        if not isinstance(stmt, (cst.SimpleStatementLine, cst.With)) or id(stmt) in plan.guard \
                or id(stmt) in plan.main_first or (key, plan.line_of(stmt)) in written or plan.guarded_above(stmt) \
                or id(stmt) in sites:
            continue
        own = _own_calls(stmt)
        # `load_checkpoint(PATH, model)`: handed a path a rank-0 write was handed, it reads what rank 0 wrote; a
        # line that only prints or logs the path (`print("saved", path)`) reads nothing
        if not any(_reads(c) or _path_args(plan, c) & paths and not _reports(stmt) for c in own):
            # `evaluate.main(args)` after rank 0's `open(args.prediction_file, "w")`: handed the settings that name
            # the file, it may read it back; a barrier where every rank passes, nothing where it cannot be placed
            if not _reports(stmt) and not plan.under_branch(stmt, key) and any(
                    isinstance(a.value, cst.Name) and a.value.value in holders for c in own for a in c.args) \
                    and plan.line_of(stmt) > first.get(key, 1 << 30):
                plan.barrier_before.add(id(stmt))
            continue
        if plan.line_of(stmt) <= first.get(key, 1 << 30) and key not in entered:
            continue
        if plan.under_branch(stmt, key) or (plan.line_of(stmt) <= first.get(key, 1 << 30) and entered[key]):
            where = entered.get(key) if plan.line_of(stmt) <= first.get(key, 1 << 30) else None
            plan.todo(stmt, "rank 0 writes files and this line reads one back inside a branch"
                      f"{f' (its function is called at line {where})' if where else ''}: put "
                      "ddpkit.barrier(ctx) where every rank passes, between the write and this read")
        else:
            plan.barrier_before.add(id(stmt))
    for key, stmt in statements:  # a read right after a rank-0 write the others already wait for needs no second wait
        if id(stmt) in plan.wait_after:
            parent, end = plan._parent.get(id(stmt)), plan.end_of(stmt)
            after = [s for k, s in statements if k == key and plan._parent.get(id(s)) is parent
                     and plan.line_of(s) > end]
            if after:
                plan.barrier_before.discard(id(min(after, key=plan.line_of)))


def _plan_unported_writes(plan: Any) -> None:
    """A `not checked:` TODO at the entry's line that hands control to code of the script the port did not port
    (`Fire(Experiment)`), listing that code's writes: it runs on every rank, so each writes the same files at once."""
    handed = hands_to_unported(plan.f)
    if handed is None:
        return
    stmt, keys = handed
    writes = sorted({(plan.line_of(c), " ".join(plan.f.code(c).split())[:40]) for key in keys
                     for c in walk(plan.f.scopes[key].node) if isinstance(c, cst.Call)
                     and (_writes(c) or dotted(c.func) == "torch.save")})
    if not writes:
        return
    listed = "; ".join(f"line {line} `{code}...`" for line, code in writes[:6])  # lines of this script
    more = f" (+{len(writes) - 6} more)" if len(writes) > 6 else ""
    plan.todo(stmt, f"not checked: `{' '.join(plan.f.code(stmt).split())[:40]}` runs "
              f"`{'`, `'.join(sorted({k.split('.')[0] for k in keys}))}` of this script, which the port did not "
              f"port, on every rank; it writes files: {listed}{more}: write them on rank 0 only "
              "(`if ctx.is_main:` around each, ctx handed in), make directories with exist_ok=True")


def _plan_after_close(plan: Any) -> None:
    """Lines of the `__main__` block after the call of the entry function run once its ddpkit context has closed,
    on every rank, where no ctx keeps them to rank 0: a call there that writes files or shows a window (itself, or
    through a function of the script: `training_plots(losses)` saving a PNG) does it from every rank. A TODO at it."""
    f = plan.f
    if f.ctx_global or f.entry_key in (None, ENTRY):
        return
    for guard in (s for s in f.module.body if isinstance(s, cst.If) and "__name__" in f.code(s.test)):
        after = False
        for stmt in statements_of(guard):
            if not after:
                after = any(isinstance(c, cst.Call) and f.entry_key in f.callees(c, ENTRY) for c in walk(stmt))
                continue
            effects = _outputs(plan, stmt)
            if effects:
                plan.todo(stmt, f"`{' '.join(f.code(stmt).split())[:40]}` runs after `{f.entry_key}` returned (its "
                          f"ddpkit context closed), on every rank: {'; '.join(effects[:4])}: every rank does it at "
                          f"once; do it inside `{f.entry_key}` under `if ctx.is_main:` (hand it what it needs there)")


def _outputs(plan: Any, stmt: cst.CSTNode) -> list[str]:
    """The file writes and windows of `stmt`'s calls, itself or in the script's functions it calls: `line 10
    `plt.savefig(...)``."""
    f, plots = plan.f, pyplot_names(plan.f.module)
    nodes = list(walk(stmt)) + [n for c in walk(stmt) if isinstance(c, cst.Call) for k in f.callees(c, ENTRY)
                                for n in walk(f.scopes[k].node)]
    return [f"line {plan.line_of(c)} `{' '.join(f.code(c).split())[:30]}`" for c in nodes if isinstance(c, cst.Call)
            and (_writes(c) or dotted(c.func) == "torch.save" or dotted(c.func).split(".")[0] in plots
                 and dotted(c.func).endswith(".show"))]


def _plan_before_init(plan: Any) -> None:
    """Lines the port leaves before ddpkit.init (the entry's own lines above the argument parsing that stays there,
    and module code above an entry function) run on every rank, where no ctx exists yet to keep them to rank 0: a
    log file every rank opens (`logging.basicConfig(filename=..., filemode="w")`: each rank truncates it and writes
    its own lines into it), a file every rank writes, or a download (`nltk.download("punkt")` at import: every rank
    fetches into the same folder at once). A TODO at the line."""
    f = plan.f
    if not f.region:
        return
    owner = statements_of(f.entry_owner)
    start = next((i for i, s in enumerate(owner) if s is f.region[0]), 0)
    before = owner[:start]
    imports = imported_names(f.module)
    if not isinstance(f.entry_owner, cst.Module):  # module code above the entry function or its `__main__` block
        before = [s for s in f.module.body if not any(n is f.entry_owner for n in walk(s, into_functions=True))] + before
    for stmt in before:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        calls = _own_calls(stmt)
        handler = next((c for c in calls if _log_file(c)), None)
        written = next((c for c in calls if _writes(c) and not f.callees(c, ENTRY)), None)
        if handler is not None:
            plan.todo(stmt, f"`{dotted(handler.func)}(...)` runs on every rank before ddpkit.init, so every rank "
                      "opens the same log file and writes its lines into it: move it after `ctx = ddpkit.init(...)` "
                      "under `if ctx.is_main:` (or name a file per rank, ctx.rank)")
        elif written is not None:
            plan.todo(stmt, f"`{dotted(written.func)}(...)` runs on every rank before ddpkit.init, so every rank "
                      "writes the same file at once: move it after `ctx = ddpkit.init(...)` under `if ctx.is_main:`")
        elif (fetched := next((c for c in calls if _downloads(c) or _fetches(imports, c)), None)) is not None:
            # no process group yet, so rank 0 cannot go first here: every rank fetches into the same files at once
            plan.todo(stmt, f"`{dotted(fetched.func)}(...)` downloads on every rank at once, before ddpkit.init (no "
                      "ctx yet to let rank 0 go first): move it after `ctx = ddpkit.init(...)` between `if not "
                      "ctx.is_main: ddpkit.barrier(ctx)` and `if ctx.is_main: ddpkit.barrier(ctx)`, or fetch the "
                      "files once before launching")


def _wait_after_disk_branch(plan: Any, key: str, stmt: cst.BaseStatement) -> None:
    """`if not os.path.isfile(cache): make_cache(...)`: the file is made when it is missing and read later, maybe by
    the project's code (a dataset class reads it), where no read the port sees follows. Rank 0 makes it alone, so
    every rank waits after the outermost such `if` (where every rank passes) until it is whole; a TODO where that
    `if` is itself under a branch ranks may take differently."""
    node, outer = plan._parent.get(id(stmt)), None
    while node is not None:
        if isinstance(node, cst.If) and _reads_disk_test(node.test):
            outer = node
        node = plan._parent.get(id(node))
    if outer is None:
        return
    if all(agreed(plan, key, test) for test in _branch_tests(plan, outer)):
        plan.barrier_after.add(id(outer))
    else:
        plan.todo(stmt, "rank 0 makes this file when it is missing, inside a branch ranks may take differently: put "
                  "ddpkit.barrier(ctx) where every rank passes, after the write and before anything reads the file")


def _reads_disk_test(test: cst.BaseExpression) -> bool:
    return any(isinstance(c, cst.Call) and re.search(r"(^|\.)(exists|isfile|isdir|is_file|is_dir)$", dotted(c.func))
               for c in walk(test))


_PATH_CALLS = re.compile(r"^(os\.path\.join|path\.join|join|Path|pathlib\.Path|str|os\.path\.abspath|abspath)$")


def _handed_paths(plan: Any, statements: list[tuple[str, cst.BaseStatement]],
                  written: set[tuple[str, int]]) -> tuple[set[str], set[int]]:
    """`def write_subset(data, out_path): ... open(out_path, "w")` written on rank 0: the paths its callers hand it
    (`write_subset(d, fold_ann)`), so a later call handed `fold_ann` (`Dataset(root, fold_ann)`) reads that file;
    and id() of the statements that hand them (they write, they read nothing)."""
    params: dict[str, list[str]] = {}  # a scope that writes to a path it is given -> its parameters
    for key, stmt in statements:
        node = plan.f.scopes[key].node if key in plan.f.scopes else None
        if (key, plan.line_of(stmt)) not in written or not isinstance(node, cst.FunctionDef) or not isinstance(
                stmt, (cst.SimpleStatementLine, cst.With)):
            continue
        names = [p.name.value for p in (*node.params.posonly_params, *node.params.params, *node.params.kwonly_params)]
        if any(isinstance(a.value, cst.Name) and a.value.value in names for c in _own_calls(stmt) for a in c.args):
            params[key] = names
    out: set[str] = set()
    sites: set[int] = set()
    for key, stmt in statements if params else ():
        for call in _own_calls(stmt) if isinstance(stmt, (cst.SimpleStatementLine, cst.With)) else ():
            for callee in (c for c in plan.f.callees(call, key) if c in params):
                names = params[callee][1:] if plan.f.scopes[callee].cls else params[callee]
                for i, arg in enumerate(call.args):
                    name = arg.keyword.value if arg.keyword is not None else names[i] if i < len(names) else None
                    if name in params[callee] and isinstance(arg.value, cst.Name) and _names_path(
                            plan, arg.value.value):
                        out.add(arg.value.value)
                        sites.add(id(stmt))
    return out, sites


def _path_holders(call: cst.Call) -> set[str]:
    """`open(args.prediction_file, "w")` -> {"args"}: the object whose attribute names the file a write opens."""
    if not _writes(call) or not call.args or call.args[0].keyword is not None:
        return set()
    value = call.args[0].value
    if isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and value.value.value != "self":
        return {value.value.value}
    return set()


def _path_args(plan: Any, call: cst.Call) -> set[str]:
    """The arguments of `call` that name a file: a string with a dot or a slash (`"ckpt/best.pt"`), a name bound only
    to such strings, joins or Paths (`best = os.path.join(out, "best.pt")`), or a constant imported from another
    module and never called (`from config import BEST_MODEL_PATH`)."""
    out = set()
    for arg in call.args:
        value = arg.value
        if _path_like(value) and not isinstance(value, (cst.Name, cst.Attribute)):
            out.add(plan.f.code(value))
        elif isinstance(value, cst.Name) and _names_path(plan, value.value):
            out.add(value.value)
    return out


def _path_like(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.SimpleString):
        return isinstance(value.evaluated_value, str) and bool(re.search(r"\w\.\w+$|/", value.evaluated_value))
    if isinstance(value, cst.FormattedString):  # its text only: `{total / n}` divides, it names no folder
        text = "".join(p.value for p in value.parts if isinstance(p, cst.FormattedStringText))
        return bool(re.search(r"\w\.\w+$|/", text)) and not text.endswith("\\n")
    if isinstance(value, cst.ConcatenatedString):
        return _path_like(value.left) or _path_like(value.right)
    if isinstance(value, cst.Call):
        return bool(_PATH_CALLS.match(dotted(value.func))) and any(_path_like(a.value) or isinstance(
            a.value, (cst.Name, cst.Attribute)) for a in value.args)
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Divide, cst.Add)):
        return _path_like(value.right) or _path_like(value.left)
    return False


def _names_path(plan: Any, name: str) -> bool:
    values = [n.value for n in walk(plan.f.module, into_functions=True) if isinstance(n, cst.Assign) and any(
        isinstance(t.target, cst.Name) and t.target.value == name for t in n.targets)]
    if values:
        return all(_path_like(v) for v in values)
    return name in imported_names(plan.f.module) and not any(
        isinstance(n, cst.Call) and dotted(n.func) == name for n in walk(plan.f.module, into_functions=True))


def _entered_after_write(plan: Any, statements: list[tuple[str, cst.BaseStatement]],
                         writes: list[tuple[str, int]]) -> dict[str, int | None]:
    """The script's functions that may run after rank 0 wrote a file: called after a write of their caller's (or
    from such a function) -> None where every rank calls them alike, else the line of a call some ranks may not make
    (under a rank-0 guard or a branch on a per-rank value), where a barrier inside them would hang."""
    sites: dict[str, list[tuple[str, cst.BaseStatement]]] = {}
    for key, stmt in statements:
        if isinstance(stmt, cst.SimpleStatementLine):
            for call in _calls(stmt):
                for callee in plan.f.callees(call, key):
                    sites.setdefault(callee, []).append((key, stmt))
    writers = {k for k, _ in writes}
    while more := {k for k in plan.f.ported - writers if plan.f.scopes[k].calls & writers}:
        writers |= more
    lines: dict[str, list[int]] = {}  # scope -> the lines that write on rank 0, themselves or through a call
    for key, line in writes:
        lines.setdefault(key, []).append(line)
    for key, stmt in statements:
        if isinstance(stmt, cst.SimpleStatementLine) and any(
                set(plan.f.callees(c, key)) & writers for c in _calls(stmt)):
            lines.setdefault(key, []).append(plan.line_of(stmt))

    def written_before(key: str, stmt: cst.BaseStatement, callee: str) -> bool:
        """A write of `key` comes before `stmt`, not inside the callee itself (the entry block holds its function)."""
        node = plan.f.scopes[callee].node if callee in plan.f.scopes else None
        start, end = (plan.line_of(node), plan.end_of(node)) if node is not None else (0, -1)
        return any(line < plan.line_of(stmt) and not start <= line <= end for line in lines.get(key, ()))

    entered: dict[str, int | None] = {}
    grew = True
    while grew:
        grew = False
        for callee, calls in sites.items():
            if callee in entered:
                continue
            after = [(k, s) for k, s in calls if k in entered or written_before(k, s, callee)]
            if not after:
                continue
            apart = next((plan.line_of(s) for k, s in calls if id(s) in plan.guard or plan.guarded_above(s) or not all(
                agreed(plan, k, t) for t in _branch_tests(plan, s)) or entered.get(k)), None)
            entered[callee] = apart
            grew = True
    return entered


def _project_call(plan: Any, key: str, stmt: cst.BaseStatement) -> str:
    """'writes' for `report(path, text)`, `plotter.flush()`: a statement that only calls the project's own code which
    writes files, saves figures or starts processes and does nothing else (ddpkit.port.project.project_writers),
    handed neither the model nor a loader. An instance's method counts where the instance's name is bound once, to
    the class (not given the model), and used only through method calls (then no other rank reads what the method
    changes in it). 'project' for any other statement calling the project's code that way, '' for the rest."""
    if not plan.reports or not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(
            stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.Call)):
        return ""
    call = stmt.body[0].value
    name = dotted(call.func)
    receiver, _, method = name.rpartition(".")
    made = [n.value for n in walk(plan.f.module, into_functions=True) if isinstance(n, cst.Assign)
            and any(dotted(t.target) == receiver for t in n.targets)] if receiver and "." not in receiver else []
    if name in plan.reports:
        verdict = plan.reports[name]
    elif len(made) == 1 and isinstance(made[0], cst.Call) and f"{dotted(made[0].func)}.{method}" in plan.reports:
        verdict = plan.reports[f"{dotted(made[0].func)}.{method}"]
    else:
        return ""
    given = [call] + ([] if name in plan.reports else made)
    if verdict is None or any(plan.role(k, dotted(n)) in ("model", "train", "eval") for k in plan.f.ported
                              for c in given for n in walk(c) if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n)):
        return "project"  # `Visualizer(model)`: its methods may run the model, a collective rank 0 cannot join alone
    if name in plan.reports:
        return "writes"
    attrs = {id(n.value) for n in walk(plan.f.module, into_functions=True) if isinstance(n, cst.Attribute)}
    calls = {id(n.func.value) for n in walk(plan.f.module, into_functions=True) if isinstance(n, cst.Call)
             and isinstance(n.func, cst.Attribute)}
    targets = {id(t.target) for n in walk(plan.f.module, into_functions=True) if isinstance(n, cst.Assign)
               for t in n.targets}
    return "writes" if all(id(n) in calls or id(n) in targets for n in walk(plan.f.module, into_functions=True)
                           if isinstance(n, cst.Name) and n.value == receiver and (id(n) in calls or id(n) not in attrs)) \
        else "project"


def _plan_file_types(plan: Any) -> None:
    """`parser.add_argument("--log", type=argparse.FileType("w"))`: argparse opens (and truncates) the file while
    it parses, on every rank and before ddpkit.init, so no statement of the script can be moved to rank 0: a TODO
    naming the argument. A FileType that reads (`"r"`, the default) is fine."""
    for stmt in walk(plan.f.module, into_functions=True):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for call in _calls(stmt):
            if not dotted(call.func).endswith("add_argument"):
                continue
            kind = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "type"), None)
            if not (isinstance(kind, cst.Call) and dotted(kind.func).rsplit(".", 1)[-1] == "FileType"):
                continue
            mode = next((a.value for a in kind.args if a.keyword is None or a.keyword.value == "mode"), None)
            text = mode.evaluated_value if isinstance(mode, cst.SimpleString) else "r" if mode is None else "?"
            if not isinstance(text, str) or text == "?" or set(text) & set("wax+"):
                flag = next((str(a.value.evaluated_value) for a in call.args if a.keyword is None and isinstance(
                    a.value, cst.SimpleString)), "this argument")
                plan.todo(stmt, f"`{flag}` is an `argparse.FileType({plan.f.code(mode) if mode is not None else ''})`:"
                          " argparse opens (and truncates) the file while it parses the arguments, on every rank, "
                          "before ddpkit.init; take a path (`type=str`) and open it under `if ctx.is_main:`")


def _captured(stmt: cst.SimpleStatementLine, process: cst.Call) -> bool:
    """`out = subprocess.check_output(...)`, `text = os.popen(cmd).read()`, `subprocess.run(..., capture_output=True)`
    bound to a name: the script reads the command's output (a query such as `git rev-parse HEAD`), on every rank."""
    name = dotted(process.func)
    return name in _CAPTURES or any(a.keyword is not None and (a.keyword.value == "capture_output" and dotted(
        a.value) == "True" or a.keyword.value == "stdout" and dotted(a.value).endswith("PIPE")) for a in process.args)


def _first_writes(plan: Any, statements: list[tuple[str, cst.BaseStatement]],
                  writes: list[tuple[str, int]]) -> dict[str, int]:
    """Per scope, the first line that writes a file on rank 0, itself or through a function it calls."""
    writers = {k for k, _ in writes}
    while True:
        more = {k for k in plan.f.ported - writers if plan.f.scopes[k].calls & writers}
        if not more:
            break
        writers |= more
    first: dict[str, int] = {}
    for key, line in writes:
        first[key] = min(first.get(key, line), line)
    for key, stmt in statements:
        if isinstance(stmt, cst.SimpleStatementLine) and any(
                set(plan.f.callees(c, key)) & writers for c in _calls(stmt)):
            first[key] = min(first.get(key, 1 << 30), plan.line_of(stmt))
    return first


def _branch_tests(plan: Any, stmt: cst.CSTNode) -> list[cst.BaseExpression]:
    tests = []
    node = plan._parent.get(id(stmt))
    while node is not None:
        if isinstance(node, (cst.If, cst.While)):
            tests.append(node.test)
        node = plan._parent.get(id(node))
    return tests


def _own_calls(stmt: cst.BaseStatement) -> list[cst.Call]:
    """The calls of a simple statement, or of a compound statement's header (`with open(...) as f:`)."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return _calls(stmt)
    if isinstance(stmt, cst.With):
        header = [c for item in stmt.items for c in _calls(item)]
        return header + (_calls(stmt.body) if any(_writes(c) for c in header) else [])
    return []


def _plan_trackers(plan: Any, trackers: dict[str, tuple[cst.BaseStatement, str]]) -> None:
    """A tracker used only as `writer.add_scalar(...)` statements lives on rank 0; so it does where it is handed to a
    function of the script that uses its parameter only so (`train(model, loader, exp)`: the other ranks hand it
    `None`, bound beside the guarded start). Any other use is a TODO."""
    for name, (start, kind) in trackers.items():
        uses: list[cst.CSTNode] = []
        fine, handed = True, False
        for key in sorted(plan.f.ported):
            for node in plan.nodes(key):
                if isinstance(node, cst.SimpleStatementLine) and node is not start:
                    text = plan.f.code(node)
                    if not re.search(rf"(?<![\w.]){re.escape(name)}\b", text):
                        continue
                    if _logs_through(plan, key, node, name):
                        uses.append(node)
                        continue
                    inner = _handed_tracker(plan, key, node, name)
                    if inner is None:
                        fine = False
                    else:
                        uses += inner
                        handed = True
        if not fine:
            plan.todo(start, f"{kind} would be started on every rank, and `{name}` is used in ways the port cannot "
                      f"guard: start it under `if ctx.is_main:` and log through it on rank 0 only")
            continue
        plan.guard.add(id(start))
        plan.guard.update(id(u) for u in uses)
        if handed and isinstance(start, cst.SimpleStatementLine) and isinstance(start.body[0], cst.Assign):
            plan.none_elsewhere[id(start)] = name  # `train(..., exp)` runs on every rank: there it hands None


def _logs_through(plan: Any, key: str, node: cst.SimpleStatementLine, name: str) -> bool:
    """`writer.add_scalar(...)`: a statement that only calls a method of the tracker (and no model)."""
    body = node.body[0]
    return len(node.body) == 1 and isinstance(body, cst.Expr) and isinstance(body.value, cst.Call) \
        and dotted(body.value.func).startswith(name + ".") and not any(
            plan.role(key, dotted(c.func)) == "model" for c in _calls(body.value))


def _handed_tracker(plan: Any, key: str, node: cst.SimpleStatementLine, name: str) -> list[cst.CSTNode] | None:
    """`train(model, loader, exp)`: a statement that hands the tracker, as a plain argument, to one function of the
    script whose parameter is used there only through method-call statements and never bound again: those
    statements (to run on rank 0); None for any other use."""
    body = node.body[0]
    if len(node.body) != 1 or not isinstance(body, cst.Expr) or not isinstance(body.value, cst.Call):
        return None
    call = body.value
    callees = plan.f.callees(call, key)
    if len(callees) != 1 or callees[0] not in plan.f.ported or dotted(call.func) == name:
        return None
    if any(name in {n.value for n in walk(a.value) if isinstance(n, cst.Name)} and dotted(a.value) != name
           for a in call.args) or any(dotted(a.value) == name and a.star for a in call.args):
        return None  # `f(exp.name)`, `f(*exp)`: a read of it
    scope = plan.f.scopes[callees[0]]
    given = [a for a in call.args if dotted(a.value) == name]
    params = []
    for arg in given:
        if arg.keyword is not None:
            params.append(arg.keyword.value)
        else:
            at = [a for a in call.args if a.keyword is None].index(arg)
            params.append(scope.params[at] if at < len(scope.params) else "")
    if not params or "" in params or _binds_again(scope.node, params):
        return None
    inner: list[cst.CSTNode] = []
    for stmt in plan.nodes(callees[0]):
        if isinstance(stmt, (cst.SimpleStatementLine, cst.If, cst.While, cst.For, cst.With)) and any(
                _mentions(stmt, p) for p in params):
            if not any(isinstance(stmt, cst.SimpleStatementLine) and _logs_through(plan, callees[0], stmt, p)
                       for p in params):
                return None
            inner.append(stmt)
    return inner


def _binds_again(scope: cst.CSTNode, names: list[str]) -> bool:
    return any(isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For)) and any(
        dotted(t) in names for t in ([t.target for t in n.targets] if isinstance(n, cst.Assign) else [n.target]))
        for n in walk(scope))


def _write_handle(stmt: cst.BaseStatement) -> bool:
    """`hf = h5py.File(path, "w")`, `f = open(path, "w")`: a plain name bound to a file opened for writing."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)
            and len(stmt.body[0].targets) == 1 and isinstance(stmt.body[0].targets[0].target, cst.Name)):
        return False
    value = stmt.body[0].value
    return isinstance(value, cst.Call) and _writes(value) and (dotted(value.func) in ("open", "io.open") or (
        _file_object_mode(value) is not None) or (isinstance(value.func, cst.Attribute)
                                                   and value.func.attr.value == "open"))


def _rebound(plan: Any, key: str, stmt: cst.SimpleStatementLine) -> bool:
    """The handle's name is assigned again in its scope (`f = open(a, "w")` ... `f = open(b, "w")`): one name, several
    files; the port does not follow which one a use means."""
    name = dotted(stmt.body[0].targets[0].target)
    return any(isinstance(n, cst.Assign) and n is not stmt.body[0] and any(
        dotted(t.target) == name for t in n.targets) for n in plan.nodes(key))


def _plan_handles(plan: Any, handles: dict[str, tuple[str, cst.SimpleStatementLine]]) -> None:
    """A file opened for writing and bound to a name (`hf = h5py.File(path, "w")`) is opened on rank 0 only, with
    every statement that only calls a method of it (`hf.create_dataset(...)`, `f.write(...)`, `hf.close()`), and a
    csv writer made over it (`w = csv.writer(f)`) with its calls; any other use keeps the open on every rank: a TODO."""
    for name, (home, start) in handles.items():
        names, guarded, other = {name}, [start], None
        for key in sorted(plan.f.ported):
            if key != home and (home != ENTRY or _binds(plan.f.scopes[key].node, name)):
                continue  # another function's own `f`: not this file
            for node in plan.nodes(key):
                if not isinstance(node, cst.SimpleStatementLine) or node is start:
                    continue
                attrs = {id(n.attr) for n in walk(node) if isinstance(n, cst.Attribute)}
                if not any(isinstance(n, cst.Name) and n.value in names and id(n) not in attrs for n in walk(node)):
                    continue  # the name itself, not an attribute of something else (`args.log`) or a string
                body = node.body[0]
                if len(node.body) == 1 and isinstance(body, cst.Expr) and isinstance(body.value, cst.Call) \
                        and dotted(body.value.func).split(".")[0] in names and "." in dotted(body.value.func) \
                        and not any(plan.role(key, dotted(c.func)) == "model" for c in _calls(body.value)):
                    guarded.append(node)
                elif len(node.body) == 1 and isinstance(body, cst.Expr) and isinstance(body.value, cst.Call) and (
                        _writes(body.value) or dotted(body.value.func) == "torch.save") and any(
                        dotted(a.value) in names for a in body.value.args) and not any(
                        plan.role(key, dotted(c.func)) == "model" for c in _calls(body.value)):
                    guarded.append(node)  # `pickle.dump(obj, f)`, `np.save(f, a)`: a write through the file
                elif len(node.body) == 1 and isinstance(body, cst.Assign) and len(body.targets) == 1 and isinstance(
                        body.targets[0].target, cst.Name) and isinstance(body.value, cst.Call) and dotted(
                        body.value.func).startswith("csv.") and body.value.args and dotted(
                        body.value.args[0].value) in names:
                    names.add(body.targets[0].target.value)  # `w = csv.writer(f)`: writes through the file
                    guarded.append(node)
                elif other is None:
                    other = plan.line_of(node)
        if other is not None:
            plan.todo(start, f"every rank opens this file for writing (the same path, at once), and `{name}` is used "
                      f"on line {other} in a way the port cannot guard: open and write it on rank 0 only "
                      "(`if ctx.is_main:`), and make the others wait (`ddpkit.barrier(ctx)`) before they read it")
            continue
        plan.guard.update(id(n) for n in guarded)


def _binds(scope: cst.CSTNode, name: str) -> bool:
    """`name` is a parameter of the function `scope` or assigned in it (not declared global): its own value."""
    if not isinstance(scope, cst.FunctionDef):
        return False
    params = scope.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    if any(p.name.value == name for p in every):
        return True
    assigned = {dotted(t.target) for n in walk(scope.body) if isinstance(n, cst.Assign) for t in n.targets}
    declared = {n.name.value for g in walk(scope.body) if isinstance(g, cst.Global) for n in g.names}
    return name in assigned - declared


def _tracker_kind(call: cst.Call, module: str | None = None) -> str:
    """What a call starts that would log on every rank: a tracker of a known library, a Visdom client, a run
    object of an experiment tracker (`Experiment(...)` imported from hyperdash, comet_ml, neptune, ...; `module`
    is where the call's name was imported from), or a logger object (`CSVLogger(...)`, `Logger(...)`); '' for
    anything else."""
    name = dotted(call.func)
    if name in _TRACKERS:
        return _TRACKERS[name]
    if module is not None and _EXPERIMENT_TRACKERS.match(module) and name.rsplit(".", 1)[-1][:1].isupper():
        return f"a `{name}` run of {module.split('.')[0]} (an experiment tracker)"
    if name.endswith(".SummaryWriter"):
        return "a TensorBoard SummaryWriter"
    last = name.rsplit(".", 1)[-1]
    if name.startswith("csv."):
        return ""  # a csv writer over a file: the file's open() is the side effect, placed with the other writes
    if last == "Visdom":
        return "a Visdom client"
    if _LOGGER_CLASS.match(last):
        return f"a `{last}` (a logger that writes on every rank)"
    return ""


def _logs_through_library(plan: Any, key: str, stmt: cst.BaseStatement) -> bool:
    """`configure(...)`, `log_value(...)` statements of a logging library (tensorboard_logger, visdom, ...), and
    `tqdm.write(...)`; also a one-line `if args.tensorboard: configure(...)` of them."""
    if isinstance(stmt, cst.If) and isinstance(stmt.body, cst.SimpleStatementSuite) and stmt.orelse is None \
            and not any(isinstance(n, cst.Call) for n in walk(stmt.test)):
        body = stmt.body.body
    elif isinstance(stmt, cst.SimpleStatementLine):
        body = stmt.body
    else:
        return False
    tops = [s.value for s in body if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)]
    if len(tops) != len(body):
        return False
    if any(plan.f.callees(t, key) or plan.role(key, dotted(t.func).split(".")[0]) == "model" for t in tops):
        return False  # the script's own function: its body is ported (and judged) where it is defined
    if all(dotted(t.func).endswith("tqdm.write") for t in tops):
        return True  # a progress line: printed once, like print0
    modules = [library_loader(plan.f, t) for t in tops]
    return all(m is not None and _LOG_MODULES.search(m) and m != "logging" for m in modules)


def _log_file(call: cst.Call) -> bool:
    """`logging.FileHandler(path)`, `RotatingFileHandler(...)`, `logging.basicConfig(filename=...)`."""
    name = dotted(call.func)
    if name.rsplit(".", 1)[-1] in ("FileHandler", "RotatingFileHandler", "TimedRotatingFileHandler"):
        return True
    return name == "logging.basicConfig" and any(a.keyword is not None and a.keyword.value == "filename"
                                                 for a in call.args)


def _header_calls(stmt: cst.BaseStatement) -> list[cst.Call]:
    """The calls of a simple statement, or of a `with` header: where a tracker or logger is started."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return _calls(stmt)
    if isinstance(stmt, cst.With):
        return [c for item in stmt.items for c in _calls(item)]
    return []


def check_rank0_bindings(plan: Any) -> None:
    """A statement the port put under `if ctx.is_main:` may cut a program in two: a name it binds (`writer =
    SummaryWriter()`, `with open(p, "w") as f:`) exists on rank 0 only, and a file a `with` opens stays open on
    every rank while only the write inside it is guarded (the other ranks truncate the file). Each such use
    outside a guard is a TODO naming the guarded line; so is a `with` that opens a file a guarded write writes."""
    f = plan.f
    found: list[tuple[str, cst.BaseStatement]] = []  # (scope, outermost guarded statement)
    for key in sorted(f.ported):
        for node in plan.nodes(key):
            if isinstance(node, cst.BaseStatement) and id(node) in plan.guard and not plan.guarded_above(node):
                found.append((key, node))
    opened_told: set[int] = set()
    for key, stmt in found:
        for with_stmt in _enclosing_withs(plan, stmt):
            opened = {n.value for item in with_stmt.items if item.asname is not None
                      for n in walk(item.asname.name) if isinstance(n, cst.Name)}
            if any(isinstance(n, cst.Name) and n.value in opened for n in walk(stmt)) and any(
                    _writes(c) for item in with_stmt.items for c in _calls(item)) and id(with_stmt) not in opened_told:
                opened_told.add(id(with_stmt))
                plan.todo(with_stmt, f"only the write inside this `with` runs on rank 0 (line {plan.line_of(stmt)}), "
                          "but every rank opens the file it writes (the others truncate it): put the whole `with` "
                          "under `if ctx.is_main:`")
    told: set[tuple[int, str]] = set()
    for key, stmt in found:
        names = _bound_names(stmt)
        if not names:
            continue
        scopes = [key] + ([k for k in sorted(f.ported) if k != key] if f.scopes[key].node is f.module or key == ENTRY
                          else [])
        for name in sorted(names):
            if _bound_unguarded(plan, key, name) or plan.none_elsewhere.get(id(stmt)) == name:
                continue  # `writer = None` on every rank first (or the port's own on the others): tested, or handed on
            uses = [u for k in scopes for u in _reads_of(plan, k, name) if not plan.guarded_above(u)
                    and id(u) not in plan.guard]
            uses += [u for u in _module_tail(plan) if _mentions(u, name)] if key == ENTRY else []
            for use in uses:
                if (id(use), name) in told:
                    continue
                told.add((id(use), name))
                if _method_call_of(use, name) and not any(plan.role(key, dotted(c.func)) == "model"
                                                          for c in _calls(use)):
                    plan.guard.add(id(use))  # `writer.close()`: the object lives on rank 0, so does the call
                    continue
                if _rank0_loop(plan, key, use, name):
                    plan.guard.add(id(use))  # `for ax in axes.flat: ax.imshow(...)`: a loop over it is rank 0's
                    continue
                plan.todo(use, f"`{name}` is bound on rank 0 only (line {plan.line_of(stmt)} is under `if ctx.is_main:`)"
                          " and this line reads it on every rank: put it under `if ctx.is_main:` too, or bind "
                          f"`{name} = None` on the other ranks and test it here")


def _enclosing_withs(plan: Any, node: cst.CSTNode) -> list[cst.With]:
    withs = []
    parent = plan._parent.get(id(node))
    while parent is not None:
        if isinstance(parent, cst.With):
            withs.append(parent)
        parent = plan._parent.get(id(parent))
    return withs


def _bound_names(stmt: cst.BaseStatement) -> set[str]:
    """Names (and `self.x` attributes) a statement binds: assignment and `with ... as` targets, loop targets."""
    names: set[str] = set()
    for node in walk(stmt):
        targets = []
        if isinstance(node, cst.AssignTarget):
            targets = [node.target]
        elif isinstance(node, (cst.AnnAssign, cst.For)):
            targets = [node.target]
        elif isinstance(node, cst.AsName):
            targets = [node.name]
        for target in targets:
            for part in (target.elements if isinstance(target, (cst.Tuple, cst.List)) else [target]):
                value = getattr(part, "value", part) if isinstance(part, cst.Element) else part
                if dotted(value):
                    names.add(dotted(value))
    return names - {"_"}


def _header_parts(stmt: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(stmt, cst.SimpleStatementLine):
        return [stmt]
    if isinstance(stmt, (cst.If, cst.While)):
        return [stmt.test]
    if isinstance(stmt, cst.For):
        return [stmt.iter]
    if isinstance(stmt, cst.With):
        return list(stmt.items)
    return []


def _mentions(stmt: cst.CSTNode, name: str) -> bool:
    """The statement (a compound statement's header) reads `name` (`writer`, `self.writer`) as code, not inside
    a string or as another object's attribute."""
    for part in _header_parts(stmt):
        attrs = {id(n.attr) for n in walk(part) if isinstance(n, cst.Attribute)}
        keywords = {id(n.keyword) for n in walk(part) if isinstance(n, cst.Arg) and n.keyword is not None}
        for node in walk(part):
            if "." in name:
                if isinstance(node, cst.Attribute) and dotted(node) == name:
                    return True
            elif isinstance(node, cst.Name) and node.value == name and id(node) not in attrs | keywords:
                return True
    return False


def _reads_of(plan: Any, key: str, name: str) -> list[cst.BaseStatement]:
    return [n for n in plan.nodes(key) if isinstance(n, (cst.SimpleStatementLine, cst.If, cst.While, cst.For,
                                                         cst.With)) and _mentions(n, name)]


def _bound_unguarded(plan: Any, key: str, name: str) -> bool:
    for node in plan.nodes(key):
        if isinstance(node, cst.BaseStatement) and not isinstance(node, (cst.FunctionDef, cst.ClassDef)) \
                and id(node) not in plan.guard and not plan.guarded_above(node) and name in _own_bindings(node):
            return True
    return False


def _own_bindings(stmt: cst.BaseStatement) -> set[str]:
    """What this statement itself binds (a compound statement's header only, not its body)."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return _bound_names(stmt)
    if isinstance(stmt, cst.For):
        return _bound_names(cst.For(target=stmt.target, iter=stmt.iter, body=cst.IndentedBlock([])))
    if isinstance(stmt, cst.With):
        return {dotted(i.asname.name) for i in stmt.items if i.asname is not None and dotted(i.asname.name)}
    return set()


def _module_tail(plan: Any) -> list[cst.BaseStatement]:
    """Module-level statements outside the ported region (code after an inline `if __name__ == "__main__":`
    block): they run on every rank after it, as written."""
    f = plan.f
    if not f.region:
        return []
    end = max(plan.end_of(s) for s in f.region)
    out = []
    for stmt in f.module.body:
        if plan.line_of(stmt) <= end or isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        out.extend(n for n in walk(stmt) if isinstance(n, (cst.SimpleStatementLine, cst.If, cst.While, cst.For,
                                                           cst.With)))
    return out


def _method_call_of(stmt: cst.CSTNode, name: str) -> bool:
    """`writer.close()`, `f.write(...)`: a statement that only calls a method of `name`."""
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(
        stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.Call) and dotted(
        stmt.body[0].value.func).startswith(name + ".")


def _rank0_loop(plan: Any, key: str, loop: cst.CSTNode, name: str) -> bool:
    """`for ax, img in zip(axes.flatten(), images): ax.imshow(img)`: a loop over a rank-0 name whose body only
    calls (it binds nothing the code after it reads, calls no model, joins no collective) runs on rank 0 alone."""
    if not isinstance(loop, cst.For) or loop.orelse is not None or not _mentions(loop, name):
        return False
    body = list(walk(loop.body))
    if any(isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Return, cst.Yield, cst.Break, cst.Global,
                          cst.Nonlocal)) for n in body):
        return False
    calls = [n for n in body if isinstance(n, cst.Call)]
    return not any(plan.role(key, dotted(c.func)) == "model" or dotted(c.func).startswith("ddpkit.")
                   or any(plan.role(key, dotted(a.value)) == "model" for a in c.args) for c in calls)
