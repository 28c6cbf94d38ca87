"""The format-preserving edits of `ddpkit port`, applied where ctx exists (the entry point and what it calls)."""

from __future__ import annotations

import re

import libcst as cst

from ddpkit.port.facts import ARGS_ROOTS, ENTRY, Facts, bound, dotted, imported_names as _imported_names, \
    is_device_expr, root_name, runtime_modules, walk
from ddpkit.port.forwards import returns_no_graph
from ddpkit.port.gathers import gather_statement
from ddpkit.port.inputs import CREATORS as _CREATORS
from ddpkit.port.models import is_optimizer, moves_to_cpu
from ddpkit.port.plan import Plan, loader_expr, move_receiver
from ddpkit.port.switches import option_dest
from ddpkit.port.sums import reduce_statement

__all__ = ["Rewriter", "parse_expr", "strip_moves"]

# Attributes that DistributedDataParallel forwards or shares with the module it wraps; any other
# attribute (state_dict, load_state_dict, custom layers and methods) is read from ddpkit.unwrap(model).
# The `named_*` methods are not among them: on the wrapper every name has `module.` in front, and a dict keyed by
# the model's own names (an EMA copy, a name matched with startswith) no longer finds them.
_DDP_SAFE = frozenset({"parameters", "train", "eval", "zero_grad", "modules", "children", "buffers", "requires_grad_",
                       "to", "cuda", "training", "forward", "apply", "no_sync", "register_forward_hook"})
_NOT_FORWARD = frozenset({"named_parameters", "named_buffers", "named_modules", "named_children",
                          "state_dict", "load_state_dict", "save_pretrained", "get_input_embeddings",
                          "resize_token_embeddings", "gradient_checkpointing_enable", "half", "float", "double",
                          "init_weights", "reset_parameters", "num_parameters", "get_num_params", "get_config",
                          "print_trainable_parameters", "configure_optimizers", "tie_weights", "bfloat16",
                          "requires_grad", "get_submodule", "get_parameter", "register_buffer", "init_hidden",
                          "init_state", "reset_state", "zero_state", "initial_state", "reset_hidden"})
"""Methods of a model that compute no training loss: read from ddpkit.unwrap(model) without a word."""
_HOST_LIBRARIES = frozenset({"skimage", "cv2", "PIL", "scipy", "sklearn", "imgaug", "albumentations"})
"""Libraries whose functions read a tensor's host memory (through numpy): a CUDA tensor fails there."""
_TRAIN_DROPPED = frozenset({"dataset", "batch_size", "shuffle", "pin_memory", "generator", "sampler", "batch_sampler"})
"""DataLoader options that ddpkit's loaders choose themselves (pin_memory, order) or that the port sets."""
_TQDM = frozenset({"tqdm", "tqdm.tqdm", "trange", "tqdm.trange", "tqdm.auto.tqdm", "auto.tqdm"})


def parse_expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def strip_moves(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`Net().to(device).cuda()` -> `Net()`: ddpkit.wrap moves the model to ctx.device."""
    while (receiver := move_receiver(expr)) is not None:
        expr = receiver
    return expr


_TO_HOST = frozenset({"cpu", "numpy", "tolist", "item"})
"""Tensor methods whose result is on the host."""
_STR_METHODS = frozenset(n for n in dir(str) if not n.startswith("_"))
"""`device.lower()`: a device setting the script read as a str (a torch.device has none of these)."""
_CASE_METHODS = frozenset({"lower", "upper", "casefold", "strip", "lstrip", "rstrip", "title", "capitalize"})
_TENSOR_METHODS = _TO_HOST | {"to", "cuda", "float", "long", "size", "view", "squeeze", "unsqueeze", "detach", "argmax"}
"""Methods that show a name holds a tensor (a batch may be a list of strings)."""


def _arg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value=value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                         whitespace_after=cst.SimpleWhitespace("")))


def _comma_args(args: list[cst.Arg]) -> list[cst.Arg]:
    out = []
    closing = None  # the line break an argument that ended the call kept before `)`: the call's new last one keeps it
    for i, a in enumerate(args):
        last = i == len(args) - 1
        if not last and not isinstance(a.comma, cst.Comma) and isinstance(a.whitespace_after_arg,
                                                                            cst.ParenthesizedWhitespace):
            closing = a.whitespace_after_arg
            a = a.with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
        if last and closing is not None and not isinstance(a.whitespace_after_arg, cst.ParenthesizedWhitespace):
            a = a.with_changes(whitespace_after_arg=closing)
        out.append(a.with_changes(comma=cst.MaybeSentinel.DEFAULT if last else
                                  (a.comma if isinstance(a.comma, cst.Comma) else cst.Comma(
                                      whitespace_after=cst.SimpleWhitespace(" ")))))
    return out


def _is_identity(small: cst.BaseSmallStatement, original: cst.BaseSmallStatement) -> bool:
    """After the moves are stripped: `x, y = x, y`, `batch = {k: v for k, v in batch.items()}`, `model`."""
    if isinstance(small, cst.Expr) and isinstance(original, cst.Expr):
        return isinstance(small.value, (cst.Name, cst.Attribute)) and isinstance(original.value, cst.Call)
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return False
    target, value = small.targets[0].target, small.value
    code = cst.Module([]).code_for_node
    calls = any(isinstance(n, cst.Call) for n in walk(value))  # `model = model()` calls a builder: no identity
    if not calls and code(target).replace("(", "").replace(")", "").replace(" ", "") == \
            code(value).replace("(", "").replace(")", "").replace(" ", ""):
        return True
    if isinstance(value, cst.DictComp) and isinstance(value.for_in.target, cst.Tuple) and value.for_in.inner_for_in \
            is None and not value.for_in.ifs:
        names = [dotted(e.value) for e in value.for_in.target.elements]
        it = value.for_in.iter
        return (len(names) == 2 and [dotted(value.key), dotted(value.value)] == names and isinstance(it, cst.Call)
                and dotted(it.func) == f"{dotted(target)}.items")
    return False


class Rewriter(cst.CSTTransformer):
    """Applies a Plan; run it through the MetadataWrapper whose module the plan was made from."""

    def __init__(self, facts: Facts, plan: Plan) -> None:
        super().__init__()
        self.f, self.p = facts, plan
        self.keys: list[str] = [ENTRY] if facts.ctx_global else ["<module>"]
        self.region = facts.region_ids()
        self.region_depth = 0
        self.batches: list[tuple[set[str], str]] = []
        self.host_batches: list[bool] = []
        """Per entry of batches: the loader may be a torch DataLoader the port keeps (its batches on the CPU)."""
        self.changes = 0
        self.gpu_numbers = _gpu_numbers(facts.module, "device")
        self.config_roots = ARGS_ROOTS | runtime_modules(facts.module) | plan.config_names
        """Names whose `.device` is the script's device setting: parsed options, config modules imported at run time,
        the project's settings modules (`import settings as S`) and objects (`from config import cfg`)."""
        """The default of the script's `--device` option where it holds GPU numbers (`'0,1'`), else None."""
        self.gpu_numbers_named = False
        """A TODO already names the script's `--device` option of GPU numbers (one per script)."""
        self.orphan_notes: list[str] = []
        """Notes of a statement the rewrite removed: written before the next statement it leaves."""
        self.receivers: set[int] = set()
        """Expressions whose attribute is read (`loss` in `loss.item()`): a reduced value there stays a tensor."""
        self.no_grad = 0
        """Depth of `with torch.no_grad():` / inference_mode blocks around the node being visited."""
        self.rank0 = 0
        """Depth of statements that only rank 0 runs (a tracker call, a file write) around the node."""
        self._nodes_to_keys = {id(s.node): k for k, s in facts.scopes.items() if k != ENTRY}
        self.imports = _imported_names(facts.module)
        self.comp_bound: list[set[str]] = []
        """Per comprehension or lambda around the node: the names it binds (`{m.__name__: m for m in classes}`)."""
        self.rebinding_stack: list[set[str]] = []
        """Per Assign being visited: its targets that name an imported module, a function or a class (read in its
        value as that: `model = model()` calls the builder function `model`)."""
        self.optimizers = {dotted(t.target) for n in walk(facts.module, into_functions=True)
                           if isinstance(n, cst.Assign) and isinstance(n.value, cst.Call) and is_optimizer(n.value)
                           for t in n.targets}
        """Names bound to an optimizer somewhere in the script."""
        self.not_values = set(self.imports) | _defined_names(facts.module)
        """Names an import, a `def` or a `class` binds: read before their first assignment, never the model."""
        firsts = _first_rebindings(facts.module, self.not_values)
        self.first_rebinding = {(id(a), n) for _, n, a in firsts}
        """(id(assign), name): the first assignment of an imported name in its scope; its value reads the import."""
        self.module_until = {(id(scope), n): plan.line_of(a) for scope, n, a in firsts}
        """(id(scope), name) -> line of its first assignment there: above that line, the imported module."""
        self.scopes_in: list[cst.CSTNode] = [facts.module]
        """The module and the functions around the node being visited (innermost last)."""
        self.lines: list[int] = []
        """Lines of the statements around the node being visited (innermost last)."""
        self.globals_needed: dict[str, set[str]] = {}
        self._assigned_in: dict[int, set[str]] = {}
        """id(nested function) -> the names it assigns itself (see _nested_own)."""
        self.used_names: set[str] = set()
        """Names the rewrite introduced (values hoisted out of rank-0 reports)."""
        self.string_devices = _string_devices(facts, self._nodes_to_keys)
        self.device_bound = _device_bound(facts, self._nodes_to_keys)
        self.submodules: dict[tuple[str, str], str] = {}
        """(scope key, name) -> the submodule of the model the name is bound to (`main = model.main`)."""
        self.submodules_named: set[tuple[str, str]] = set()
        """(id(scope), name): device names some binding of which stays a string after the port (see leave_Comparison)."""
        """Function scope -> module-level names a wrap inserted there assigns (declared `global` in it)."""
        """Local name -> the dotted name it was imported as (`random_split` -> `torch.utils.data.random_split`)."""

    # ---- where we are -------------------------------------------------------------------------
    @property
    def key(self) -> str:
        return self.keys[-1]

    def in_ctx(self) -> bool:
        key = self.key
        if key not in self.f.ported:
            return False
        if key in (ENTRY, self.f.entry_key):
            return self.region_depth > 0
        return True

    def role(self, expr: cst.CSTNode) -> str | None:
        name = dotted(expr)
        if name and any(name.split(".")[0] in bound for bound in self.comp_bound):
            return None  # a comprehension's or a lambda's own variable, whatever the same name holds outside
        if name and name.split(".")[0] in self.rebinding:
            return None  # `model = getattr(model, kind)(...)`: on the right, `model` is still the imported module
        if name and self.lines and self._still_module(name.split(".")[0]):
            return None  # `hasattr(model, kind)` above that line: the module too
        if name and self._nested_own(name.split(".")[0]):
            return None  # `def create_model(): model = Net().cuda(); return model` inside main: its own module
        return self.p.role(self.key, name) if name and self.key in self.f.scopes else None

    def _nested_own(self, root: str) -> bool:
        """`root` is assigned by a function defined inside the scope being visited (a helper that builds a model,
        called for the wrapped model and for others, such as an EMA copy): there it names that function's own value,
        not the scope's model. Its parameters still follow the scope's roles (the wrapped model is handed in)."""
        inner = self.scopes_in[-1]
        scope = self.f.scopes.get(self.key)
        if not isinstance(inner, cst.FunctionDef) or scope is None or inner is scope.node:
            return False
        if id(inner) not in self._assigned_in:
            self._assigned_in[id(inner)] = _assigned_names(inner)
        return root in self._assigned_in[id(inner)]

    def _still_module(self, root: str) -> bool:
        """`root` is an imported module here: the statement being visited is above its first assignment in the
        innermost scope that assigns it."""
        at = self.module_until.get((id(self.scopes_in[-1]), root))
        return at is not None and 0 < self.lines[-1] < at

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.BaseStatement):
            self.lines.append(self.p.line_of(node))
        if isinstance(node, cst.FunctionDef):
            self.scopes_in.append(node)
        if _no_grad(node):
            self.no_grad += 1
        if id(node) in self.region:
            self.region_depth += 1
        if id(node) in self.p.guard:
            self.rank0 += 1
        if id(node) in self._nodes_to_keys:
            self.keys.append(self._nodes_to_keys[id(node)])
        if isinstance(node, cst.Assign):  # its value reads the names' earlier binding: an imported module
            self.rebinding_stack.append({n for n in {dotted(t.target) for t in node.targets} & self.not_values
                                         if (id(node), n) in self.first_rebinding})
        if isinstance(node, cst.For) and self.in_ctx():
            role = self.p.loop_role(self.key, node)
            if role:
                self.batches.append(({n.value for n in _names(node.target)}, role))
                self.host_batches.append(self.p.host_loop(self.key, node))
        elif isinstance(node, cst.CompFor) and self.batches and root_name(node.iter) in self._batch_names():
            self.batches[-1][0].update(n.value for n in _names(node.target))
        elif isinstance(node, cst.Assign) and self.batches and root_name(node.value) in self._batch_names():
            for target in node.targets:  # `inputs, labels = data`: parts of the batch
                self.batches[-1][0].update(n.value for n in _names(target.target))
        return super().on_visit(node)

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):
        result = super().on_leave(original, updated)
        if isinstance(original, cst.For) and self.batches and self.in_ctx() and self.p.loop_role(self.key, original):
            self.batches.pop()
            self.host_batches.pop()
        if isinstance(original, cst.BaseStatement) and not isinstance(result, cst.RemovalSentinel):
            result = self._finish_statement(original, result)
        elif isinstance(original, cst.BaseStatement):  # its notes go before the next statement written
            self.orphan_notes.extend(self.p.notes.get(id(original), []))
        if id(original) in self._nodes_to_keys:
            self.keys.pop()
        if isinstance(original, cst.Assign):
            self.rebinding_stack.pop()
        if _no_grad(original):
            self.no_grad -= 1
        if id(original) in self.region:
            self.region_depth -= 1
        if id(original) in self.p.guard:
            self.rank0 -= 1
        if isinstance(original, cst.BaseStatement):
            self.lines.pop()
        if isinstance(original, cst.FunctionDef):
            self.scopes_in.pop()
        return result

    @property
    def rebinding(self) -> set[str]:
        return set().union(*self.rebinding_stack) if self.rebinding_stack else set()

    def _batch_names(self) -> set[str]:
        return set().union(*(names for names, _ in self.batches)) if self.batches else set()

    def _kept_on_host(self, call: cst.Call) -> set[str]:
        """Batch names of a ddpkit loader (now on ctx.device) handed as they are to `xs.append(...)` /
        `xs.extend(...)` or to numpy, where the same scope of the script moved them to the device elsewhere
        (`labels.to(device)` for the loss): there the script kept them on the CPU, beside values it put there itself
        (`preds.append(out.cpu())`), so they stay on the CPU."""
        func = dotted(call.func)
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value in ("append", "extend")
                and len(call.args) == 1 or func.split(".")[0] in ("np", "numpy")):
            return set()
        names = {a.value.value for a in call.args if isinstance(a.value, cst.Name) and a.keyword is None} & \
            self._device_batch_names()
        if not names:
            return set()
        calls = [n for n in self.p.nodes(self.key) if isinstance(n, cst.Call)]
        moved = {root_name(r) for n in calls if (r := move_receiver(n)) is not None}
        # or the scope collects its other values on the host itself (`preds.append(out.argmax(1).cpu())`): the
        # original's lists all held CPU tensors, read together later (sklearn, numpy); a name counts where the scope
        # reads it as a tensor (`label.cpu()`), never a batch of strings
        collects = any(isinstance(n.func, cst.Attribute) and n.func.attr.value in ("append", "extend") and any(
            isinstance(c, cst.Call) and isinstance(c.func, cst.Attribute) and c.func.attr.value in _TO_HOST
            for a in n.args for c in walk(a.value)) for n in calls)
        tensors = {dotted(n.func.value) for n in calls if isinstance(n.func, cst.Attribute)
                   and isinstance(n.func.value, cst.Name) and n.func.attr.value in _TENSOR_METHODS} if collects else set()
        return names & (moved | tensors)

    def _device_batch_names(self) -> set[str]:
        """Batch names of loops whose loader is ddpkit's on every path: those batches arrive on ctx.device."""
        return set().union(*(names for (names, _), host in zip(self.batches, self.host_batches) if not host))

    # ---- expressions --------------------------------------------------------------------------
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not self.in_ctx():
            return updated
        updated = self._device_types(updated)
        part = self._submodule_call(original)
        if part:
            self.p.todo(original, f"`{original.func.value}(...)` calls `{part}`, a submodule of the wrapped model, not "
                        "the model: DDP averages gradients only for calls of the wrapped model itself, so this "
                        "submodule's parameters train on each rank's own gradients and drift apart; call the model "
                        "(move this computation into its forward, or a wrapper module's forward), or wrap the "
                        "submodule on its own (ddpkit.wrap)")
        if self._bypasses_ddp(original):
            method = f"{dotted(original.func.value)}.{original.func.attr.value}"
            self.p.todo(original, f"`{method}(...)` trains through a method of the model, not its forward: DDP "
                        "averages gradients only for calls of the wrapped model itself, so through "
                        "ddpkit.unwrap(model) every rank would train its own copy; move this computation into "
                        "forward() (or a wrapper module's forward) and call the model")
        kept = self._kept_on_host(original)
        if kept:
            self.changes += 1  # the script moved this batch value where it met the model and kept it here on the CPU
            updated = updated.with_changes(args=[a.with_changes(value=parse_expr(f"{o.value.value}.cpu()"))
                                                 if isinstance(o.value, cst.Name) and o.value.value in kept else a
                                                 for a, o in zip(updated.args, original.args)])
        host = self._host_batch_arg(original)
        if host:
            library = self.imports[root_name(original.func)]
            self.p.todo(original, f"`{host}` comes from a batch of a ddpkit loader, which delivers it on ctx.device, "
                        f"and is handed to `{dotted(original.func)}` ({library}), which reads host memory: give it "
                        f"`{host}.cpu()` (and move the result to ctx.device), or keep this loader's batches on the CPU")
        if self.rank0 and any(self.role(a.value) == "model" for a in original.args):
            self.changes += 1  # rank 0 alone (`writer.add_graph(model, x)`): a forward of the DDP wrapper there
            updated = updated.with_changes(args=[  # would be a collective the other ranks never join
                a.with_changes(value=parse_expr(f"ddpkit.unwrap({dotted(o.value)})")) if self.role(o.value) == "model"
                else a for a, o in zip(updated.args, original.args)])
        if id(original) in self.p.scale_backward:
            self.changes += 1  # a loss summed over the batch: each rank sums its share, and DDP averages
            receiver = cst.Module([]).code_for_node(updated.func.value)
            return updated.with_changes(func=updated.func.with_changes(
                value=parse_expr(f"({receiver} * ctx.world_size)")))
        if id(original) in self.p.drop_parallel:
            self.changes += 1  # one process per device: DDP (ddpkit.wrap) replaces DataParallel
            return updated.args[0].value
        name = dotted(updated.func)
        if moves_to_cpu(updated) and self.role(updated.func.value) == "model" and dotted(updated.func.value):
            # `model.to("cpu")` to sample on the CPU: DDP would move the inputs back to its GPU, so from here the
            # script uses the model itself (see leave_SimpleStatementLine: `model = ddpkit.unwrap(model).to("cpu")`)
            self.changes += 1
            return updated.with_changes(func=updated.func.with_changes(value=parse_expr(
                f"ddpkit.unwrap({dotted(updated.func.value)})")))
        receiver = move_receiver(updated)
        if receiver is not None:
            if id(original) in self.p.move_back and updated.func.attr.value == "to":
                return updated  # the model comes back from the CPU: `.to(device)` is `.to(ctx.device)` already
            if (self.role(receiver) == "model" and id(original) not in self.p.move_back) \
                    or root_name(receiver) in self._device_batch_names():
                self.changes += 1
                return receiver
            if updated.func.attr.value == "cuda":
                self.changes += 1
                return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")),
                                            args=[cst.Arg(parse_expr("ctx.device"))])
            return updated
        if isinstance(updated.func, cst.Attribute) and updated.func.attr.value == "numpy" and not updated.args \
                and not (isinstance(updated.func.value, cst.Call) and dotted(updated.func.value.func).endswith(".cpu")):
            self.changes += 1  # the model and its outputs live on ctx.device: numpy() reads host memory only
            return updated.with_changes(func=updated.func.with_changes(value=cst.Call(cst.Attribute(
                updated.func.value, cst.Name("cpu")))))
        if _external_helper(self, original, _LOADS):
            self.changes += 1  # `load_checkpoint(ckpt, model)` of another module: load_state_dict on the model itself
            return updated.with_changes(args=[a.with_changes(value=parse_expr(f"ddpkit.unwrap({dotted(o.value)})"))
                                              if self.role(o.value) == "model" and dotted(o.value) else a
                                              for a, o in zip(updated.args, original.args)])
        if name == "torch.cuda.device" and len(updated.args) == 1 and dotted(updated.args[0].value) != "ctx.device":
            self.changes += 1  # `with torch.cuda.device(args.gpu):` would put every rank on one GPU
            return updated.with_changes(args=[updated.args[0].with_changes(value=parse_expr("ctx.device"))])
        if name == "print":
            self.changes += 1
            return updated.with_changes(func=parse_expr("ddpkit.print0"),
                                        args=_comma_args([cst.Arg(cst.Name("ctx")), *updated.args]))
        if name in _TQDM and not any(a.keyword and a.keyword.value == "disable" for a in updated.args):
            self.changes += 1
            return updated.with_changes(args=_comma_args([*updated.args, _arg("disable", parse_expr(
                "not ctx.is_main"))]))
        if id(original) in self.p.loaders:
            self.changes += 1
            loader = self._loader(updated, self.p.loaders[id(original)], self.p.spread.get(id(original), {}))
            if id(original) in self.p.unpinned:  # its dataset puts samples on the device: nothing to pin
                loader = loader.with_changes(args=_comma_args([*loader.args, _arg("pin_memory", cst.Name("False"))]))
            return loader
        if self._torch_name(name) == "torch.load" and not any(
                a.keyword and a.keyword.value == "map_location" for a in updated.args) \
                and len([a for a in updated.args if a.keyword is None]) < 2:
            self.changes += 1
            return updated.with_changes(args=_comma_args([*updated.args, _arg("map_location", parse_expr(
                "ctx.device"))]))
        if self._torch_name(name) == "torch.load" and any(_is_location(i, a) and _gpu_location(a.value)
                                                          for i, a in enumerate(updated.args)):
            self.changes += 1  # `map_location="cuda:0"`: every rank would load onto GPU 0
            return updated.with_changes(args=[a.with_changes(value=_own_device(a.value)) if _is_location(i, a) else a
                                              for i, a in enumerate(updated.args)])
        if (name in ("copy.deepcopy", "deepcopy", "hasattr", "getattr", "isinstance")
                or self._imported_as(name) == "torch.optim.swa_utils.AveragedModel") and updated.args \
                and self.role(original.args[0].value) == "model":
            self.changes += 1  # an EMA copy or an attribute check reads the model, not its DDP wrapper
            first = updated.args[0].with_changes(value=parse_expr(f"ddpkit.unwrap({dotted(original.args[0].value)})"))
            return updated.with_changes(args=[first, *updated.args[1:]])
        if id(original) in self.p.as_tensor:
            self.changes += 1  # a legacy constructor makes CPU tensors only: the batch it reads is on ctx.device now
            return updated.with_changes(func=parse_expr("torch.as_tensor"), args=_comma_args([
                updated.args[0], _arg("dtype", parse_expr(self.p.as_tensor[id(original)]))]))
        if id(original) in self.p.add_kwarg and self._library_call(name, self.p.add_kwarg[id(original)][0]):
            self.changes += 1
            word, value = self.p.add_kwarg[id(original)]
            return updated.with_changes(args=_comma_args([*updated.args, _arg(word, parse_expr(value))]))
        if id(original) in self.p.exist_ok:
            self.changes += 1  # every rank creates it: the second would fail with FileExistsError
            func = parse_expr("os.makedirs") if name == "os.mkdir" else updated.func
            return updated.with_changes(func=func, args=_comma_args([*updated.args, _arg("exist_ok", cst.Name(
                "True"))]))
        if id(original) in self.p.unwrap_calls and self.role(updated.func) == "model":
            self.changes += 1  # its output never reaches backward(): through DDP the next step would fail
            return updated.with_changes(func=parse_expr(f"ddpkit.unwrap({name})"))
        if self.role(updated.func) == "model" and any(r == "eval" for _, r in self.batches):
            self.changes += 1  # evaluation shards differ in length: the unwrapped module never synchronises
            return updated.with_changes(func=parse_expr(f"ddpkit.unwrap({name})"))
        return updated

    def _imported_as(self, name: str) -> str:
        """`AveragedModel` after `from torch.optim.swa_utils import AveragedModel`: its full dotted name."""
        root, _, rest = name.partition(".")
        full = self.imports.get(root, root)
        return f"{full}.{rest}" if rest else full

    def _torch_name(self, name: str) -> str:
        """`t.load` after `import torch as t`: `torch.load`."""
        root, _, rest = name.partition(".")
        return f"torch.{rest}" if rest and root != "torch" and self.imports.get(root) == "torch" else name

    def _library_call(self, name: str, keyword: str) -> bool:
        """`random_split` gets generator= only where it is torch's, `train_test_split` random_state= only
        sklearn's: the script's own function of that name may take no such keyword."""
        root, _, rest = name.partition(".")
        if root not in self.imports:
            return False
        full = f"{self.imports[root]}.{rest}" if rest else self.imports[root]
        return full.startswith("sklearn." if keyword == "random_state" else "torch.")

    def _saves(self, call: cst.Call) -> bool:
        """torch.save, or a save helper of another module (`utils.save_checkpoint(model, ...)`) given the model:
        it gets the model itself (keys without `module.`), and rank 0 alone writes."""
        name = dotted(call.func)
        if self._torch_name(name) == "torch.save":
            return True
        return _external_helper(self, call, _SAVES, needs_model=False)

    def _bypasses_ddp(self, original: cst.Call) -> bool:
        """`model.encode(x)` in a training step: the model's own method, not forward, with gradients on."""
        func = original.func
        if not isinstance(func, cst.Attribute) or func.attr.value in _DDP_SAFE or func.attr.value in _NOT_FORWARD:
            return False
        if self.role(func.value) != "model":
            return False
        methods = [s.node for k, s in self.f.scopes.items() if s.cls and k == f"{s.cls}.{func.attr.value}"]
        if self._trains_itself(original, methods):
            return True  # `model.fit(loader, optimizer)`: the method runs its own loop, wherever it is called
        if methods and all(returns_no_graph(m) for m in methods):
            return False  # `action = model.act(state)` returning `.item()`: its output never reaches backward()
        if self.no_grad or any(r == "eval" for _, r in self.batches):
            return False
        if methods and all(_no_grad(m) for m in methods):
            return False  # `@torch.no_grad() def update_average(self)`: computes no gradient, trains nothing
        if any(r == "train" for _, r in self.batches):
            return True
        # a step function called from the loop (`def training_step(model, batch)`), not code after the loop
        return self.key in self.p.training_scopes and self.key not in self.p.loop_scopes

    def _host_batch_arg(self, call: cst.Call) -> str:
        """A batch of a ddpkit loader (on ctx.device) as the loop binds it, or a part of one picked without a
        call (`img, y = data[0], data[1]`), handed as it is to a function of a library that reads host memory
        (skimage's random_noise, cv2). A name bound again from a call (`image = images[i].cpu().numpy()`) is not."""
        root = root_name(call.func)
        if root not in self.imports or self.imports[root].split(".")[0] not in _HOST_LIBRARIES:
            return ""
        if not self._device_batch_names():
            return ""
        nodes = list(self.p.nodes(self.key))
        loops: set[str] = set()
        for node in nodes:
            if isinstance(node, cst.For) and self.p.loop_role(self.key, node) and not self.p.host_loop(self.key, node):
                target = node.target
                if isinstance(node.iter, cst.Call) and dotted(node.iter.func) == "enumerate" and \
                        isinstance(target, cst.Tuple) and target.elements:
                    target = cst.Tuple(target.elements[1:])  # the counter is no batch
                loops |= {n.value for n in walk(target) if isinstance(n, cst.Name)}
        bound: dict[str, list[cst.BaseExpression | None]] = {}
        for node in nodes:
            if not isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                continue
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for t in targets:
                if isinstance(t, cst.Tuple) and isinstance(node.value, cst.Tuple) and \
                        len(t.elements) == len(node.value.elements):
                    for te, ve in zip(t.elements, node.value.elements):
                        if isinstance(te.value, cst.Name):
                            bound.setdefault(te.value.value, []).append(ve.value)
                else:
                    for n in walk(t):
                        if isinstance(n, cst.Name):
                            bound.setdefault(n.value, []).append(None)  # bound some other way

        def picked(value: cst.BaseExpression | None) -> bool:
            return value is not None and not any(isinstance(n, cst.Call) for n in walk(value)) and \
                root_name(value) in loops

        for arg in call.args:
            name = arg.value.value if isinstance(arg.value, cst.Name) else ""
            if name and (name in loops and name not in bound or name in bound and all(map(picked, bound[name]))):
                return name
        return ""

    def _trains_itself(self, call: cst.Call, methods: list[cst.FunctionDef]) -> bool:
        """A method of the model that trains it: it is handed an optimizer (`model.fit(loader, opt)`), or its
        code in this file runs backward() or an optimizer step."""
        if any(dotted(a.value) in self.optimizers for a in call.args):
            return True
        return any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and (
            n.func.attr.value == "backward" or n.func.attr.value == "step" and not n.args)
            for m in methods for n in walk(m, into_functions=True))

    def _reduced_read(self, original: cst.CSTNode) -> cst.BaseExpression | None:
        """A per-rank running sum read in a report inside its loop: the value over every rank, read there."""
        kind = self.p.reduce_read.get(id(original))
        if kind is None or not self.in_ctx():
            return None
        self.changes += 1
        text = cst.Module([]).code_for_node(original)
        # `loss.item()`, `total.cpu()`: the script reads a tensor there, so the reduced value stays one
        tensor = id(original) in self.receivers
        total = f"ddpkit.all_reduce_sum(ctx, {text})" + ("" if tensor else ".item()")
        # a sum of per-step values (losses) averaged over ranks keeps the original's scale; counts add up
        return parse_expr(f"({total} / ctx.world_size)" if kind == "mean" else f"{total}")

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self.receivers.add(id(node.value))
        return True

    def visit_Import(self, node: cst.Import) -> bool:
        return False  # a module's name, never a value: `from model.AGCRN import AGCRN` beside a variable `model`

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def _enter_binder(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.Lambda):
            self.comp_bound.append({p.name.value for p in node.params.params})
            return
        bound, compfor = set(), node.for_in
        while compfor is not None:  # `for m in [NnLm, LstmLm]`: a list written out, none of it the model
            listed = compfor.iter
            if isinstance(listed, (cst.List, cst.Tuple, cst.Set)) and not any(
                    self.role(e.value) == "model" for e in listed.elements):
                bound.update(n.value for n in _names(compfor.target))
            compfor = compfor.inner_for_in
        self.comp_bound.append(bound)

    def _leave_binder(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
        self.comp_bound.pop()
        return updated

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_Lambda = _enter_binder
    leave_ListComp = leave_SetComp = leave_DictComp = leave_GeneratorExp = leave_Lambda = _leave_binder

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if id(original) in self.p.replace:
            self.changes += 1  # the batch a step draws itself, divided by world_size
            return parse_expr(self.p.replace[id(original)])
        reduced = self._reduced_read(original)
        if reduced is None and id(original) in self.p.move_at and self.in_ctx():
            self.changes += 1  # a CPU tensor meets a value on ctx.device here: moved where it is read
            return parse_expr(f"{original.value}.to(ctx.device)")
        return reduced or updated

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
        if id(original) in self.p.replace:
            self.changes += 1  # `cfg["batch_size"]` a step draws itself, divided by world_size
            return parse_expr(self.p.replace[id(original)])
        return self._reduced_read(original) or updated

    def leave_Integer(self, original: cst.Integer, updated: cst.Integer) -> cst.BaseExpression:
        if id(original) in self.p.replace:
            self.changes += 1  # a literal batch a step draws itself, divided by world_size
            return parse_expr(self.p.replace[id(original)])
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        if id(original) in self.p.replace:
            self.changes += 1  # `len(loader.sampler)` of a ported loader: the dataset's size, as with the DataLoader
            return parse_expr(self.p.replace[id(original)])
        reduced = self._reduced_read(original)
        if reduced is not None:
            return reduced
        if self.in_ctx() and updated.attr.value in _STR_METHODS and self._type_of(updated.value) and (
                isinstance(original.value, cst.Name) or _args_device(original.value)):
            self.changes += 1  # the script read its device as a str ("cuda"): `.lower()` of a torch.device raises
            return updated.with_changes(value=parse_expr(self._type_of(updated.value)))
        if self.in_ctx() and updated.attr.value == "device" and dotted(updated.value) in self.config_roots:
            if self.gpu_numbers is not None:  # `--device 0,1`: GPU numbers the script parses, not a device
                if not self.gpu_numbers_named:
                    self.gpu_numbers_named = True
                    self.p.todo(original, f"`{dotted(updated)}` holds GPU numbers (default {self.gpu_numbers}), not a "
                                "device: every rank would use the same GPU(s); give each rank its own GPU "
                                "(ctx.local_rank; ddpkit.init already made it current) or use ctx.device")
                return updated
            self.changes += 1  # the script's --device setting: each rank's own device now
            return parse_expr("ctx.device")
        if self.in_ctx() and updated.attr.value == "module" and dotted(updated.value) in self.p.parallel_names:
            self.changes += 1  # was DataParallel's .module: the model itself, unwrapped if ddpkit.wrap wrapped it
            if self.role(updated.value) == "model":
                return parse_expr(f"ddpkit.unwrap({dotted(updated.value)})")
            return updated.value
        if self.in_ctx() and updated.attr.value not in _DDP_SAFE and self.role(updated.value) == "model" and \
                dotted(updated.value) not in self.rebinding:  # `model = model.Net()`: the imported module `model`
            self.changes += 1
            if updated.attr.value == "_orig_mod":  # torch.compile's module: ddpkit.unwrap strips compile too
                return parse_expr(f"ddpkit.unwrap({dotted(updated.value)})")
            return updated.with_changes(value=parse_expr(f"ddpkit.unwrap({dotted(updated.value)})"))
        return updated

    def visit_Assign(self, node: cst.Assign) -> None:
        """`main = model.main.to(device)`: a name for a submodule of the model (see _submodule_call)."""
        part = strip_moves(node.value)
        if not self.in_ctx() or len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name) or \
                not isinstance(part, cst.Attribute) or part.attr.value in _DDP_SAFE | _NOT_FORWARD or \
                self.role(part.value) != "model" or any(k == f"{s.cls}.{part.attr.value}"
                                                        for k, s in self.f.scopes.items() if s.cls):
            return
        self.submodules[(self.key, node.targets[0].target.value)] = dotted(part)

    def _submodule_call(self, original: cst.Call) -> str:
        """`main(x)` in a training step, where `main = model.main`: the submodule's forward, never the wrapper's, so
        DDP never averages its gradients. The submodule's dotted name, once per name; "" otherwise."""
        if not isinstance(original.func, cst.Name) or self.no_grad or any(r == "eval" for _, r in self.batches):
            return ""
        key = (self.key, original.func.value)
        part = self.submodules.get(key, "")
        if not part or key in self.submodules_named or not (any(r == "train" for _, r in self.batches) or (
                self.key in self.p.training_scopes and self.key not in self.p.loop_scopes)):
            return ""
        self.submodules_named.add(key)
        return part

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        # `args.device = torch.device(...)`: the script's own device setting is bound to ctx.device (code the
        # port does not touch reads it), never turned into `ctx.device = ...`
        updated = updated.with_changes(targets=[o if _args_device(o.target) else u
                                                for o, u in zip(original.targets, updated.targets)])
        if id(original) in self.p.scale_world and self.in_ctx():
            self.changes += 1  # this rank's batch only: every rank processed as many samples in that time
            value = cst.Module([]).code_for_node(updated.value)
            return updated.with_changes(value=parse_expr(f"({value}) * ctx.world_size"))
        if id(original) in self.p.to_device and self.in_ctx():
            self.changes += 1  # given to the model, which ddpkit.wrap put on ctx.device
            return updated.with_changes(value=_on_device(updated.value))
        return updated

    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison) -> cst.BaseExpression:
        """`device == "cuda"`: a torch.device never equals a string with an index; compare its type."""
        if not self.in_ctx() or len(updated.comparisons) != 1:
            return updated
        left, right = updated.left, updated.comparisons[0].comparator
        if not isinstance(updated.comparisons[0].operator, (cst.Equal, cst.NotEqual)):
            return updated
        if isinstance(left, cst.SimpleString) and not isinstance(right, cst.SimpleString):
            left, right = right, left
        if isinstance(right, cst.SimpleString) and right.evaluated_value in ("cuda", "cpu", "mps") and \
                isinstance(left, (cst.Name, cst.Attribute)) and is_device_expr(left) and self._string_device(left) != "str":
            self.changes += 1
            text = f"torch.device({dotted(left)}).type" if self._string_device(left) else f"{dotted(left)}.type"
            return updated.with_changes(left=parse_expr(text), comparisons=[
                updated.comparisons[0].with_changes(comparator=right)])
        return updated

    def _device_types(self, call: cst.Call) -> cst.Call:
        """`torch.autocast(device_type=device)` where the port made `device` this rank's device (`str(ctx.device)`,
        "cuda:1"): autocast takes a device type ("cuda", "cpu"), so it reads `torch.device(device).type`."""
        autocast = dotted(call.func) in ("torch.autocast", "torch.amp.autocast", "autocast", "amp.autocast")
        args = list(call.args)
        for i, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value == "device_type" or (
                    autocast and i == 0 and arg.keyword is None):
                text = self._type_of(arg.value)
                if text:
                    self.changes += 1
                    args[i] = arg.with_changes(value=parse_expr(text))
        return call.with_changes(args=args)

    def _type_of(self, value: cst.BaseExpression) -> str:
        """The device type of a device the port rewrote (`ctx.device`, a name bound to it or to `str(ctx.device)`), as
        a str: "ctx.device.type", "torch.device(device).type" (it reads a str and a torch.device alike); "" else."""
        if dotted(value) == "ctx.device":
            return "ctx.device.type"
        if isinstance(value, cst.Name) and self.imports.get("torch") == "torch" and any(
                name == value.value for _, name in self.device_bound):
            return f"torch.device({value.value}).type"
        return ""

    def _string_device(self, left: cst.BaseExpression) -> str:
        """"str": `device` is bound to a string the port leaves a string (`device = 'cuda' if ... else 'cpu'` at module
        level, before ddpkit.init): `device.type` would raise AttributeError, and the string compares as it did.
        "either": a function's parameter of a name some scope binds to such a string (it may be handed either):
        compared through `torch.device(device).type`, which reads both. "" otherwise."""
        if not isinstance(left, cst.Name):
            return ""
        inner = self.scopes_in[-1]
        if isinstance(inner, cst.FunctionDef):
            if id(inner) not in self._assigned_in:
                self._assigned_in[id(inner)] = _assigned_names(inner)
            if left.value in self._assigned_in[id(inner)]:
                return self._string_or_either(id(inner), left.value)
            if left.value in _parameters(inner):
                return "either" if self.imports.get("torch") == "torch" and any(
                    name == left.value for _, name in self.string_devices) else ""
        return self._string_or_either(id(self.f.module), left.value)

    def _string_or_either(self, scope: int, name: str) -> str:
        if (scope, name) not in self.string_devices:
            return ""
        return "either" if (scope, name) in self.device_bound and self.imports.get("torch") == "torch" else "str"

    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated: cst.BinaryOperation):
        if self.in_ctx() and isinstance(updated.operator, cst.Divide):
            right = self._global_len(updated.left, updated.right, original)
            if right is not None:
                return updated.with_changes(right=right)
        return updated

    def leave_AugAssign(self, original: cst.AugAssign, updated: cst.AugAssign):
        if self.in_ctx() and isinstance(updated.operator, cst.DivideAssign):
            right = self._global_len(updated.target, updated.value, original)
            if right is not None:
                return updated.with_changes(value=right)
        return updated

    def _global_len(self, left: cst.CSTNode, right: cst.CSTNode, original: cst.CSTNode) -> cst.BaseExpression | None:
        """A reduced sum divided by a loader's number of batches: count the batches of every rank.

        One form for training and evaluation loaders alike (a helper may be called with either). A plain name
        bound once in this scope to `len(loader)` is followed; one bound to a per-rank count the port cannot
        follow (rebound, or from a loop's counter) is named in a TODO."""
        reduced = self.p.reduced.get(self.key, set())
        if not any(dotted(n) in reduced for n in _walk_expr(left)):
            return None
        if isinstance(right, cst.Name):
            return self._named_len(right.value, original)
        if not (isinstance(right, cst.Call) and dotted(right.func) == "len" and len(right.args) == 1):
            return None
        loader = dotted(right.args[0].value)
        if self.role(right.args[0].value) in ("train", "eval"):
            self.changes += 1
            return parse_expr(f"ddpkit.all_reduce_sum(ctx, len({loader})).item()")
        return None

    def _named_len(self, name: str, original: cst.CSTNode) -> cst.BaseExpression | None:
        """`steps = len(loader)` bound once in this scope (never rebound) and later divided into a reduced sum:
        divide by the batches of every rank. Bound more than once, or to a shard loop's counter: a TODO."""
        bound = [n for n in self.p.nodes(self.key)
                 if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.With, cst.NamedExpr))
                 and any(isinstance(x, cst.Name) and x.value == name for x in _targets_of(n))]
        if name in self.p.reduced.get(self.key, set()):
            return None  # a sum the port reduces already (`total += y.size(0)`)
        counters = {n.target.elements[0].value.value for n in self.p.nodes(self.key)  # `for i, b in enumerate(...)`
                    if isinstance(n, cst.For) and self.p.loop_role(self.key, n) and isinstance(n.iter, cst.Call)
                    and dotted(n.iter.func) == "enumerate" and isinstance(n.target, cst.Tuple)
                    and isinstance(n.target.elements[0].value, cst.Name)}
        values = [n.value for n in bound if isinstance(n, (cst.Assign, cst.AnnAssign, cst.AugAssign))
                  and n.value is not None]
        per_rank = any((isinstance(x, cst.Call) and dotted(x.func) == "len" and len(x.args) == 1
                        and self.role(x.args[0].value) in ("train", "eval"))
                       or (isinstance(x, cst.Name) and x.value in counters) for v in values for x in walk(v))
        if not per_rank:
            return None
        only = bound[0] if len(bound) == 1 and isinstance(bound[0], cst.Assign) and len(bound[0].targets) == 1 \
            and isinstance(bound[0].targets[0].target, cst.Name) else None
        if only is not None and isinstance(only.value, cst.Call) and dotted(only.value.func) == "len" \
                and len(only.value.args) == 1 and self.role(only.value.args[0].value) in ("train", "eval"):
            self.changes += 1
            return parse_expr(f"ddpkit.all_reduce_sum(ctx, {name}).item()")
        self.p.todo(original, f"not checked: `{self.p.f.code(original)}` divides a sum over every rank by `{name}`, "
                    "a count of this rank's own batches or steps the port cannot follow (rebound, or from a loop's "
                    f"counter): divide by the count over every rank (ddpkit.all_reduce_sum(ctx, {name}))")
        return None

    def _loader(self, call: cst.Call, kind: str, spread: dict[str, cst.BaseExpression]) -> cst.Call:
        positional = [a for a in call.args if a.keyword is None and not a.star]
        kwargs = {k: _arg(k, v) for k, v in spread.items()}
        kwargs.update({a.keyword.value: a for a in call.args if a.keyword is not None})
        size = kwargs["batch_size"].value if "batch_size" in kwargs else \
            positional[1].value if len(positional) > 1 else cst.Integer("1")
        if len(positional) > 2 and "shuffle" not in kwargs:
            kwargs["shuffle"] = cst.Arg(positional[2].value, keyword=cst.Name("shuffle"))
        dataset = positional[0].value if positional else kwargs["dataset"].value
        args = [cst.Arg(dataset), cst.Arg(cst.Name("ctx"))]
        if kind == "train":
            text = cst.Module([]).code_for_node(size)
            if not isinstance(size, (cst.Name, cst.Attribute, cst.Integer)):
                text = f"({text})"
            args.append(_arg("batch_size", parse_expr(f"{text} // ctx.world_size")))
            shuffle = kwargs["shuffle"].value if "shuffle" in kwargs else cst.Name("False")
            args.append(_arg("shuffle", shuffle))
            dropped = _TRAIN_DROPPED
        else:
            args.append(_arg("batch_size", size))
            dropped = _TRAIN_DROPPED | {"drop_last"}
        extra = [a for k, a in kwargs.items() if k not in dropped]
        workers = kwargs["num_workers"].value if "num_workers" in kwargs else None
        if kind == "train" and workers is not None and not (isinstance(workers, cst.Integer) and workers.value == "0") \
                and "persistent_workers" not in kwargs:
            # ddpkit.loader keeps its workers between epochs; the script's DataLoader starts new ones each epoch, and
            # they see what the script changed in the dataset since (`dataset.resample()` before each epoch)
            extra.append(_arg("persistent_workers", cst.Name("False")))
        func = "ddpkit.loader" if kind == "train" else "ddpkit.eval_loader"
        return call.with_changes(func=parse_expr(func), args=_comma_args([*args, *extra]))

    # ---- statements ---------------------------------------------------------------------------
    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        if not updated.body:  # `if use_cuda: model.cuda()` lost its only statement
            return updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated

    def leave_If(self, original: cst.If, updated: cst.If):
        """`if torch.cuda.is_available(): x = x.cuda()` with the move gone: the whole `if` goes."""
        emptied = _only_pass(updated.body) and not _only_pass(original.body)
        if emptied and updated.orelse is None and self.in_ctx():
            return cst.RemoveFromParent()
        return updated

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):
        if len(original.body) == 1 and _pins_devices(original.body[0]):
            self.changes += 1  # the launcher gives each rank its device: one visible GPU would leave the others none
            return cst.RemoveFromParent()
        if not self.in_ctx():
            return self._current_gpu(original, updated)
        if len(original.body) == 1 and isinstance(original.body[0], cst.Expr) and moves_to_cpu(
                original.body[0].value) and self.role(original.body[0].value.func.value) == "model" and isinstance(
                original.body[0].value.func.value, cst.Name) and id(original) not in self.p.round_trip:
            model = original.body[0].value.func.value.value  # `model.cpu()` -> `model = ddpkit.unwrap(model).cpu()`
            return updated.with_changes(body=[cst.Assign([cst.AssignTarget(cst.Name(model))], updated.body[0].value)])
        if len(original.body) == 1 and isinstance(original.body[0], cst.Expr) and isinstance(
                original.body[0].value, cst.Call) and dotted(original.body[0].value.func) == "torch.cuda.set_device":
            self.changes += 1  # ddpkit.init selected this rank's GPU: the script's own choice would pin every rank
            return cst.RemoveFromParent()
        kept = [s for s, o in zip(updated.body, original.body) if not _is_identity(s, o)]
        if not kept:
            self.changes += 1
            return cst.RemoveFromParent()
        if len(kept) < len(updated.body):  # a statement dropped: the line's last one ends it (no `;` left hanging)
            updated = updated.with_changes(body=[*kept[:-1], kept[-1].with_changes(
                semicolon=original.body[-1].semicolon)])
        first = updated.body[0]
        if isinstance(first, cst.Assign) and len(first.targets) == 1 and _chooses_device(first):
            # a str stays a str (`json.dump(config)` with the device in it): "cuda:1" names this rank's GPU
            value = "str(ctx.device)" if _stringy(first.value) else "ctx.device"
            updated = updated.with_changes(body=[first.with_changes(value=parse_expr(value)), *updated.body[1:]])
            self.changes += 1
        if id(original) in self.p.wrap_inline and isinstance(updated.body[0], cst.Assign):
            assign = updated.body[0]
            unused = [_arg("find_unused_parameters", cst.Name("True"))] if id(original) in self.p.unused_inline else []
            wrapped = cst.Call(parse_expr("ddpkit.wrap"), args=_comma_args(
                [cst.Arg(strip_moves(assign.value)), cst.Arg(cst.Name("ctx")), *unused]))
            updated = updated.with_changes(body=[assign.with_changes(value=wrapped), *updated.body[1:]])
            self.changes += 1
        if len(updated.body) == 1 and isinstance(updated.body[0], cst.Assign) and self._saved_dict(updated.body[0]):
            assign = updated.body[0]  # `state = {"model": model}` ... `torch.save(state, path)`: never the wrapper
            unwrapped = assign.value.visit(_Unwrap(self))
            if not unwrapped.deep_equals(assign.value):
                self.changes += 1
                updated = updated.with_changes(body=[assign.with_changes(value=unwrapped)])
        saves = [s for s in updated.body if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)
                 and self._saves(s.value)]
        if saves and len(updated.body) == 1:
            call = saves[0].value
            args = [a.with_changes(value=a.value.visit(_Unwrap(self))) for a in call.args]
            line = updated.with_changes(body=[saves[0].with_changes(value=call.with_changes(args=args))],
                                        leading_lines=[])
            self.changes += 1
            if id(original) in self.p.guard or self.rank0:  # the file-write rule puts it (or the statement
                return line.with_changes(leading_lines=updated.leading_lines)  # around it) under `if ctx.is_main:`
            return cst.If(test=parse_expr("ctx.is_main"), body=cst.IndentedBlock([line]),
                          leading_lines=updated.leading_lines)
        return updated

    def _current_gpu(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):
        """`device = torch.device("cuda:0" if ... else "cpu")` at module level, outside ddpkit.init's block: the code
        the port runs reads it on every rank, so "cuda:0" becomes "cuda", the current GPU, which ddpkit.init makes
        each rank's own (the value keeps its type: a str stays a str). An index computed at run time is a TODO."""
        if len(self.scopes_in) != 1 or not self.f.ported or len(original.body) != 1 or not isinstance(
                original.body[0], cst.Assign) or not isinstance(updated.body[0], cst.Assign):
            return updated
        assign = updated.body[0]
        computed = any(isinstance(n, cst.FormattedString) and n.parts and isinstance(
            n.parts[0], cst.FormattedStringText) and n.parts[0].value.startswith("cuda:") or isinstance(
            n, cst.BinaryOperation) and isinstance(n.left, cst.SimpleString) and (n.left.evaluated_value == "cuda:" or (
                isinstance(n.operator, cst.Modulo) and str(n.left.evaluated_value).startswith("cuda:%")))
            for n in _walk_expr(assign.value))
        if not (_chooses_device(assign) or _device_value(assign.value) or computed) or len(assign.targets) != 1 \
                or not isinstance(assign.targets[0].target, cst.Name):
            return updated
        if computed:
            self.p.todo(original, f"`{assign.targets[0].target.value}` names one GPU by an index computed here, "
                        "before ddpkit.init: every rank would use that GPU; use ctx.device inside the ddpkit.init "
                        "block (ddpkit.init gives each rank its own GPU)")
            return updated
        value = assign.value.visit(_CurrentGpu())
        if value.deep_equals(assign.value):
            return updated
        self.changes += 1
        return updated.with_changes(body=[assign.with_changes(value=value)])

    def _saved_dict(self, assign: cst.Assign) -> bool:
        """`state = {...}` (a dict literal bound to a plain name) whose name is later given, as it is, to a save
        call of this scope (`torch.save(state, path)`, `save_checkpoint(state, ...)`)."""
        if not isinstance(assign.value, cst.Dict) or len(assign.targets) != 1 \
                or not isinstance(assign.targets[0].target, cst.Name):
            return False
        name = assign.targets[0].target.value
        return any(isinstance(n, cst.Call) and self._saves(n) and any(
            isinstance(a.value, cst.Name) and a.value.value == name for a in n.args)
            for n in self.p.nodes(self.key))

    def _download_alone(self, original: cst.BaseStatement, updated):
        """Rank 0 runs a download first while the others wait at a barrier, so the statement between the barriers
        must issue no collective: rank 0 would enter it alone and wait forever. `model = ddpkit.wrap(
        Net.from_pretrained(...), ctx)` splits into the download between the barriers and the wrap after them;
        any other collective or forward of the wrapped model there leaves every rank downloading (a TODO says so).
        Returns (download first?, the statement between the barriers, the statements after them)."""
        syncs = [n for n in walk(updated) if isinstance(n, cst.Call) and (
            _is_collective(n) or dotted(n.func) == "ddpkit.wrap" or self.role(n.func) == "model")]
        if not syncs:
            return True, updated, []
        line = updated.body[0] if isinstance(updated, cst.SimpleStatementLine) and len(updated.body) == 1 else None
        wrap = line.value if isinstance(line, cst.Assign) and len(line.targets) == 1 else None
        if len(syncs) == 1 and syncs[0] is wrap and dotted(wrap.func) == "ddpkit.wrap" and wrap.args \
                and isinstance(line.targets[0].target, (cst.Name, cst.Attribute)):
            target = line.targets[0].target
            download = updated.with_changes(body=[line.with_changes(value=wrap.args[0].value)])
            wrapped = cst.SimpleStatementLine([line.with_changes(value=wrap.with_changes(
                args=[wrap.args[0].with_changes(value=target), *wrap.args[1:]]))])
            return True, download, [wrapped]
        self.p.todo(original, "this line downloads and also joins every rank (a collective or the wrapped model): "
                    "rank 0 cannot download first here while the others wait; download in a statement of its own "
                    "under `if ctx.is_main:` followed by `ddpkit.barrier(ctx)`")
        return False, updated, []

    def _hoist_collectives(self, original: cst.BaseStatement, guarded: cst.If):
        """`if ctx.is_main: writer.add_scalar(..., ddpkit.all_reduce_sum(ctx, x).item())`: a collective only rank 0
        joins would wait forever. Every rank computes it just before the guard; rank 0 then reports the result."""
        found: list[cst.BaseExpression] = []
        bound: set[str] = set()

        class Find(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> bool:
                if _is_collective(node):
                    found.append(node)
                    return False
                return True

            def visit_AsName(self, node: cst.AsName) -> None:
                bound.update(n.value for n in _names(node.name))

            def visit_CompFor(self, node: cst.CompFor) -> None:
                bound.update(n.value for n in _names(node.target))

            def visit_For(self, node: cst.For) -> None:
                bound.update(n.value for n in _names(node.target))

        guarded.body.visit(Find())
        if not found:
            return [], guarded
        reads = {n.value for call in found for n in walk(call) if isinstance(n, cst.Name)}
        if reads & bound:
            self.p.todo(original, "this report runs on rank 0 only but needs a value summed over every rank (a "
                        "collective every rank must join): compute that value on every rank before the report")
            return [], guarded
        code = cst.Module([]).code_for_node
        names: dict[str, str] = {}
        statements = []
        for call in found:
            text = code(call)
            if text in names:
                continue
            names[text] = self._fresh_name(call)
            statements.append(cst.parse_statement(f"{names[text]} = {text}  # every rank joins the sum; rank 0 "
                                                  "reports it\n"))

        class Replace(cst.CSTTransformer):
            def leave_Call(self, orig: cst.Call, upd: cst.Call) -> cst.BaseExpression:
                return cst.Name(names[code(orig)]) if _is_collective(orig) and code(orig) in names else upd

        self.changes += 1
        return statements, guarded.with_changes(body=guarded.body.visit(Replace()))

    def _fresh_name(self, call: cst.Call) -> str:
        while isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Call):
            call = call.func.value  # `ddpkit.all_reduce_sum(ctx, x).item()`: named after x
        arg = call.args[1].value if len(call.args) > 1 else None
        if isinstance(arg, cst.Name):
            base = f"{arg.value}_all_ranks"
        elif isinstance(arg, cst.Call) and dotted(arg.func) == "len" and arg.args and isinstance(
                arg.args[0].value, cst.Name):
            base = f"{arg.args[0].value.value}_batches_all_ranks"
        else:
            base = "summed_all_ranks"
        name, n = base, 1
        while name in self.used_names or re.search(rf"\b{name}\b", self.f.code(self.f.module)):
            n += 1
            name = f"{base}_{n}"
        self.used_names.add(name)
        return name

    def _declare_global(self, stmt: cst.BaseStatement) -> None:
        """`model = ddpkit.wrap(model, ctx)` in a function that only reads a module-level `model`: assigning it
        there would make it local (UnboundLocalError on its first read), so the function declares it global."""
        scope = self.f.scopes.get(self.key)
        if scope is None or not isinstance(scope.node, cst.FunctionDef) or not isinstance(
                stmt, cst.SimpleStatementLine):
            return
        targets = [t.target.value for s in stmt.body if isinstance(s, cst.Assign) for t in s.targets
                   if isinstance(t.target, cst.Name)]
        bound = _local_names(scope.node)
        self.globals_needed.setdefault(self.key, set()).update(t for t in targets if t not in bound)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        names = self.globals_needed.pop(self.key, set()) if self._nodes_to_keys.get(id(original)) == self.key else ()
        if not names or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        body = list(updated.body.body)
        first = body[0] if body else None
        doc = isinstance(first, cst.SimpleStatementLine) and isinstance(first.body[0], cst.Expr) and isinstance(
            first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
        line = cst.parse_statement(f"global {', '.join(sorted(names))}  # ddpkit port: wrapped here, built outside\n")
        at = 1 if doc else 0
        self.changes += 1
        return updated.with_changes(body=updated.body.with_changes(body=[*body[:at], line, *body[at:]]))

    def _finish_statement(self, original: cst.BaseStatement, updated):
        first_after: list[cst.BaseStatement] = []
        main_first = id(original) in self.p.main_first
        if main_first:
            main_first, updated, first_after = self._download_alone(original, updated)
        notes = [*self.orphan_notes, *self.p.notes.get(id(original), [])]
        self.orphan_notes = []
        before = []
        after = []
        if id(original) in self.p.guard and self.rank0 == 1 and not isinstance(updated, cst.FlattenSentinel):
            self.changes += 1  # one writer: the other ranks would write the same file at the same time
            bound = self.p.none_elsewhere.get(id(original))  # the other ranks hand None to the functions using it
            updated = cst.If(test=parse_expr("ctx.is_main"), body=cst.IndentedBlock([updated.with_changes(
                leading_lines=[])]), leading_lines=updated.leading_lines, orelse=cst.Else(cst.IndentedBlock(
                    [cst.parse_statement(f"{bound} = None\n")])) if bound else None)
        if _made_main_guard(original, updated):
            hoisted, updated = self._hoist_collectives(original, updated)
            before.extend(hoisted)
        if main_first:
            self.changes += 1
            what = self.p.first_note.get(id(original), "downloads")
            before.append(cst.parse_statement(f"if not ctx.is_main:  # rank 0 {what} first; the others then read "
                                              "its files\n    ddpkit.barrier(ctx)\n"))
            after.append(cst.parse_statement("if ctx.is_main:\n    ddpkit.barrier(ctx)\n"))
            after.extend(first_after)
        if id(original) in self.p.barrier_before:
            self.changes += 1
            before.append(cst.parse_statement("ddpkit.barrier(ctx)  # rank 0 may have just written what this reads\n"))
        if id(original) in self.p.barrier_after:
            self.changes += 1
            after.append(cst.parse_statement("ddpkit.barrier(ctx)  # rank 0 may have just written the file this "
                                             "branch makes when it is missing\n"))
        if id(original) in self.p.wait_after:
            self.changes += 1
            after.append(cst.parse_statement("ddpkit.barrier(ctx)  # rank 0 writes files here that the others may "
                                             "read next\n"))
        if id(original) in self.p.reseed:
            self.changes += 1
            before.append(cst.parse_statement(
                "ddpkit.rng.seed_everything(ddpkit.rng.rank_seed(ctx.seed, ctx.rank))  # per-rank draws from here: "
                "every rank drew alike until here\n"))
        for line in self.p.batch_moves.get(id(original), []):
            before.append(cst.parse_statement(f"{line}\n"))
            self.changes += 1
        for line in self.p.wrap_before.get(id(original), []):
            before.append(cst.parse_statement(f"{line}\n"))
            self.changes += 1
            self._declare_global(before[-1])
        for name, kind in self.p.reduce_after.get(id(original), []):
            after.append(cst.parse_statement(reduce_statement(name, kind)))
            self.changes += 1
        for name in self.p.gather_after.get(id(original), []):
            after.append(cst.parse_statement(gather_statement(name)))
            self.changes += 1
        if notes:
            lines = [cst.EmptyLine(comment=cst.Comment(n)) for n in notes]
            first = before[0] if before else updated
            first = first.with_changes(leading_lines=[*first.leading_lines, *lines])
            if before:
                before[0] = first
            else:
                updated = first
        if before and not notes and hasattr(updated, "leading_lines"):
            before[0] = before[0].with_changes(leading_lines=updated.leading_lines)
            updated = updated.with_changes(leading_lines=[])
        if before or after:
            return cst.FlattenSentinel([*before, updated, *after])
        return updated


class _Unwrap(cst.CSTTransformer):
    """The model where it is saved (`{"model": model}` too): ddpkit.unwrap(model), never the DDP wrapper."""

    def __init__(self, rewriter: Rewriter) -> None:
        super().__init__()
        self.r = rewriter

    def visit_Call(self, node: cst.Call) -> bool:
        return False  # `model.state_dict()` is already read from the unwrapped model

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False

    def on_visit(self, node: cst.CSTNode) -> bool:  # only containers: a comprehension binds its own names
        if isinstance(node, (cst.ListComp, cst.DictComp, cst.SetComp, cst.GeneratorExp, cst.Lambda)):
            return False
        return super().on_visit(node)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return parse_expr(f"ddpkit.unwrap({original.value})") if self.r.role(original) == "model" else updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        return parse_expr(f"ddpkit.unwrap({dotted(original)})") if self.r.role(original) == "model" else updated


def _targets_of(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The nodes a binding statement stores to."""
    if isinstance(node, cst.Assign):
        return [x for t in node.targets for x in walk(t.target)]
    if isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For)):
        return list(walk(node.target))
    if isinstance(node, cst.NamedExpr):
        return list(walk(node.target))
    if isinstance(node, cst.With):
        return [x for item in node.items if item.asname is not None for x in walk(item.asname.name)]
    return []


def _first_rebindings(module: cst.Module, imported: set[str]) -> list[tuple[cst.CSTNode, str, cst.Assign]]:
    """`import model` ... `model = getattr(model, name)(...)`, `def model(): ...` ... `model = model()`: the first
    assignment of an imported or defined name in each scope (the module, each function), where its right-hand
    side still reads the module or function; later ones read the value that assignment bound. A function's
    parameter of that name is a value from its first line on."""
    found: list[tuple[cst.CSTNode, str, cst.Assign]] = []
    scopes = [module] + [n for n in walk(module, into_functions=True) if isinstance(n, cst.FunctionDef)]
    for scope in scopes:
        seen: set[str] = _parameters(scope) if isinstance(scope, cst.FunctionDef) else set()
        for node in walk(scope.body if isinstance(scope, cst.FunctionDef) else scope):
            if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For)):
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                for name in sorted({dotted(t) for t in targets} & imported - seen):
                    if isinstance(node, cst.Assign):
                        found.append((scope, name, node))
                    seen.add(name)
    return found


def _device_value(value: cst.BaseExpression) -> bool:
    """`"cuda:0"`, `torch.device(...)`, `"cuda:0" if ... else "cpu"`: a value that is a device, whatever its name."""
    if isinstance(value, cst.IfExp):
        return _device_value(value.body) and _device_value(value.orelse)
    return isinstance(value, (cst.SimpleString, cst.Call)) and is_device_expr(value)


class _CurrentGpu(cst.CSTTransformer):
    """`"cuda:0"` -> `"cuda"`, `torch.device("cuda", 0)` -> `torch.device("cuda")`: the current GPU, each rank's."""

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.SimpleString:
        match = re.fullmatch(r"([rbuRBU]*)(['\"])cuda:\d+\2", updated.value)
        return updated.with_changes(value=f"{match[1]}{match[2]}cuda{match[2]}") if match else updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if dotted(updated.func) == "torch.device" and len(updated.args) == 2 and isinstance(
                updated.args[0].value, cst.SimpleString) and updated.args[0].value.evaluated_value == "cuda" \
                and isinstance(updated.args[1].value, cst.Integer):
            return updated.with_changes(args=[updated.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)])
        return updated


def _name_bindings(facts: Facts, keys: dict[int, str]) -> list[tuple[cst.CSTNode, cst.Assign, bool]]:
    """(scope, `name = value`, whether the port rewrites that line) for each plain name a scope (the module, a
    function) binds: a line is ported where its scope is and, in the entry's own code, inside ddpkit.init's block."""
    region = {id(n) for s in facts.region for n in walk(s)}
    out = []
    scopes = [facts.module] + [n for n in walk(facts.module, into_functions=True) if isinstance(n, cst.FunctionDef)]
    for scope in scopes:
        key = keys.get(id(scope), ENTRY if scope is facts.module else None)
        for node in walk(scope.body if isinstance(scope, cst.FunctionDef) else scope):
            if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
                ported = key in facts.ported and (id(node) in region if key in (ENTRY, facts.entry_key) else True)
                out.append((scope, node, ported))
    return out


def _string_devices(facts: Facts, keys: dict[int, str]) -> set[tuple[int, str]]:
    """(id(scope), name) for each name a scope (the module, a function) binds to a string, which the port keeps a
    string: a device choice outside ddpkit.init's block (module level above the entry point), a string the device
    rule does not rewrite, or one it rebinds to `str(ctx.device)`. Comparing such a name with "cuda" stays a string
    comparison, or reads `torch.device(name).type` where the name may hold "cuda:1" (see `_string_or_either`)."""
    return {(id(scope), node.targets[0].target.value) for scope, node, ported in _name_bindings(facts, keys)
            if _stringy(node.value)}


def _device_bound(facts: Facts, keys: dict[int, str]) -> set[tuple[int, str]]:
    """(id(scope), name) for each name a scope binds to ctx.device somewhere (a device choice the port rewrites)."""
    return {(id(scope), node.targets[0].target.value) for scope, node, ported in _name_bindings(facts, keys)
            if ported and _chooses_device(node)}


def _stringy(value: cst.BaseExpression) -> bool:
    """A value that is a str: a literal, an f-string, a conditional or a sum of them, `str(...)`."""
    if isinstance(value, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
        return True
    if isinstance(value, cst.IfExp):
        return _stringy(value.body) and _stringy(value.orelse)
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Modulo)):
        return _stringy(value.left)
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in _CASE_METHODS:
        return True  # `args.device.lower()`: only a str has these
    return isinstance(value, cst.Call) and dotted(value.func) == "str" or (
        isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "format"
        and _stringy(value.func.value))


def _parameters(function: cst.FunctionDef) -> set[str]:
    params = function.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    every += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return {p.name.value for p in every}


def _defined_names(module: cst.Module) -> set[str]:
    """Names a `def` or a `class` statement binds in the module or in a function (not a class's methods)."""
    scopes = [module] + [n for n in walk(module, into_functions=True) if isinstance(n, cst.FunctionDef)]
    return {n.name.value for scope in scopes for n in walk(scope.body if isinstance(scope, cst.FunctionDef) else scope)
            if isinstance(n, (cst.FunctionDef, cst.ClassDef)) and n is not scope}


_SAVES = re.compile(r"save|checkpoint", re.IGNORECASE)
_LOADS = re.compile(r"load|restore|resume", re.IGNORECASE)


def _external_helper(rewriter: Rewriter, call: cst.Call, pattern: re.Pattern, needs_model: bool = True) -> bool:
    """A function of another module, named like `pattern`, given the model (`utils.save_model(model=model)`);
    a save helper called as a statement needs no model (`save_checkpoint({"state_dict": ...}, path)`)."""
    name = dotted(call.func)
    last = name.rsplit(".", 1)[-1]
    if not name or rewriter.f.callees(call, rewriter.key) or not pattern.search(last) or root_name(call.func) in (
            "ddpkit", "np", "numpy", "plt", "self", "torch") or (pattern is _SAVES and _LOADS.search(last)) or \
            last == "checkpoint":  # torch.utils.checkpoint.checkpoint: activation checkpointing, not a file
        return False
    if isinstance(call.func, cst.Attribute) and rewriter.role(call.func.value) == "model":
        return False  # the model's own method: read from ddpkit.unwrap(model) already
    return not needs_model or any(rewriter.role(a.value) == "model" for a in call.args)


def _is_collective(node: cst.Call) -> bool:
    """`ddpkit.all_reduce_sum(ctx, x)` and what is read from it (`.item()`): a call every rank must make."""
    inner = node
    while isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and isinstance(inner.func.value,
                                                                                             cst.Call):
        inner = inner.func.value
    return isinstance(inner, cst.Call) and re.fullmatch(r"ddpkit\.(all_reduce\w*|all_gather\w*|broadcast\w*|barrier)",
                                                         dotted(inner.func)) is not None


def _made_main_guard(original: cst.CSTNode, updated: cst.CSTNode) -> bool:
    """The port put this statement under `if ctx.is_main:` (the script had no such guard)."""
    code = cst.Module([]).code_for_node
    return isinstance(updated, cst.If) and code(updated.test) == "ctx.is_main" and not (
        isinstance(original, cst.If) and code(original.test) == "ctx.is_main")


def _pins_devices(small: cst.BaseSmallStatement) -> bool:
    """`os.environ["CUDA_VISIBLE_DEVICES"] = "0"`, `os.environ.setdefault("CUDA_VISIBLE_DEVICES", ...)`."""
    code = cst.Module([]).code_for_node
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
        return isinstance(target, cst.Subscript) and dotted(target.value) == "os.environ" and \
            "CUDA_VISIBLE_DEVICES" in code(target)
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and \
            dotted(small.value.func) == "os.environ.setdefault" and small.value.args:
        return "CUDA_VISIBLE_DEVICES" in code(small.value.args[0].value)
    return False


def _local_names(func: cst.FunctionDef) -> set[str]:
    """Names a function binds itself (parameters, assignments, loop and with targets) or declares global."""
    names = {p.name.value for p in (*func.params.params, *func.params.kwonly_params, *func.params.posonly_params)}
    names.update(p.name.value for p in (func.params.star_arg, func.params.star_kwarg) if isinstance(p, cst.Param))
    declared: set[str] = set()
    for node in walk(func.body):
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor)):
            names.update(n.value for n in _names(node.target))
        elif isinstance(node, cst.AsName):
            names.update(n.value for n in _names(node.name))
        elif isinstance(node, cst.Global):
            declared.update(n.name.value for n in node.names)
    return names | declared


def _assigned_names(func: cst.FunctionDef) -> set[str]:
    """Names a function assigns itself (not its parameters), less those it declares global or nonlocal."""
    names: set[str] = set()
    declared: set[str] = set()
    for node in walk(func.body):
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor)):
            names.update(n.value for n in _names(node.target))
        elif isinstance(node, cst.AsName):
            names.update(n.value for n in _names(node.name))
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            declared.update(n.name.value for n in node.names)
    return names - declared


def _args_device(target: cst.BaseExpression) -> bool:
    return isinstance(target, cst.Attribute) and target.attr.value == "device" and dotted(target.value) in ARGS_ROOTS


def _on_device(value: cst.BaseExpression) -> cst.BaseExpression:
    """`torch.randn(8, 2)` -> `torch.randn(8, 2, device=ctx.device)`;
    `from_numpy(a)` -> `from_numpy(a).to(ctx.device)`."""
    if isinstance(value, cst.Call) and dotted(value.func).startswith("torch.") and dotted(value.func).rsplit(
            ".", 1)[-1] in _CREATORS and not any(a.keyword and a.keyword.value in ("device", "generator")
                                                 for a in value.args):  # a CPU generator draws on the CPU only
        return value.with_changes(args=_comma_args([*value.args, _arg("device", parse_expr("ctx.device"))]))
    atom = isinstance(value, (cst.Call, cst.Name, cst.Attribute, cst.Subscript)) and not value.lpar
    text = cst.Module([]).code_for_node(value)
    return parse_expr(f"{text}.to(ctx.device)" if atom else f"({text}).to(ctx.device)")


def _no_grad(node: cst.CSTNode) -> bool:
    """`with torch.no_grad():` or a function decorated with it: no gradients, so no DDP synchronisation needed."""
    if isinstance(node, cst.With):
        return any(re.search(r"no_grad|inference_mode", cst.Module([]).code_for_node(i.item)) for i in node.items)
    if isinstance(node, cst.FunctionDef):
        return any(re.search(r"no_grad|inference_mode", cst.Module([]).code_for_node(d.decorator))
                   for d in node.decorators)
    return False


def _walk_expr(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


def _only_pass(block: cst.BaseSuite) -> bool:
    body = block.body if isinstance(block, cst.IndentedBlock) else ()
    return len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Pass)


def _gpu_numbers(module: cst.Module, dest: str) -> str | None:
    """The default of an argparse option that holds GPU numbers (`default='0'`, `'0,1'`, `default=0`, `type=int`),
    as written; None for a device option (`'cuda'`, `'cuda:0'`) or one the port cannot read."""
    for n in walk(module, into_functions=True):
        if isinstance(n, cst.Call) and dotted(n.func).endswith("add_argument") and option_dest(n) == dest:
            given = {a.keyword.value: a.value for a in n.args if a.keyword}
            default, kind = given.get("default"), given.get("type")
            if isinstance(default, cst.Integer) or dotted(kind) == "int" or isinstance(
                    default, cst.SimpleString) and re.fullmatch(r"\d+(\s*,\s*\d+)*", str(default.evaluated_value)):
                return cst.Module([]).code_for_node(default) if default is not None else "none"
    return None


def _chooses_device(assign: cst.Assign) -> bool:
    """`device = torch.device("cuda" if ... else "cpu")`, `self.device = "cuda"`, and a GPU under any name
    (`dev = th.device('cuda:%d' % args.gpu)`): ctx.device now decides."""
    if "device" not in dotted(assign.targets[0].target).rsplit(".", 1)[-1].lower():
        return _names_gpu(assign.value)
    code = cst.Module([]).code_for_node(assign.value)
    return any(word in code for word in ("cuda", "torch.device", "mps", "accelerator"))


def _names_gpu(value: cst.BaseExpression) -> bool:
    """`torch.device('cuda:%d' % i)` (any alias of torch), `f"cuda:{i}"`, `"cuda:" + str(i)`,
    `"cuda:{}".format(i)`, `"cuda"`: a value that is a GPU device, not a test of one (`torch.cuda.is_available()`);
    a choice between such a value and the CPU (`th.device('cpu') if args.gpu < 0 else th.device('cuda:%d' % ...)`)."""
    if isinstance(value, cst.IfExp):
        return _names_gpu(value.body) or _names_gpu(value.orelse)
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "device" \
            and isinstance(value.func.value, cst.Name) and value.args:
        value = value.args[0].value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "format":
        value = value.func.value
    if isinstance(value, cst.BinaryOperation):
        value = value.left
    if isinstance(value, cst.SimpleString):
        return str(value.evaluated_value).startswith("cuda")
    if isinstance(value, cst.FormattedString):
        return bool(value.parts) and isinstance(value.parts[0], cst.FormattedStringText) and \
            value.parts[0].value.startswith("cuda")
    return False


def _gpu_location(value: cst.BaseExpression) -> bool:
    """A torch.load location that names a GPU (`"cuda:0"`, `torch.device("cuda", 0)`, a branch of a choice
    `"cuda:0" if args.gpu else "cpu"`): a dict or a function maps locations itself and is left alone."""
    if isinstance(value, cst.IfExp):
        return _gpu_location(value.body) or _gpu_location(value.orelse)
    return _names_gpu(value)


def _is_location(index: int, arg: cst.Arg) -> bool:
    """torch.load's `map_location`, by keyword or as its second positional argument."""
    return arg.keyword.value == "map_location" if arg.keyword else index == 1 and not arg.star


def _own_device(value: cst.BaseExpression) -> cst.BaseExpression:
    """Each GPU the location names becomes the rank's own device; the CPU branch of a choice stays."""
    if isinstance(value, cst.IfExp):
        return value.with_changes(body=_own_device(value.body), orelse=_own_device(value.orelse))
    return parse_expr("ctx.device") if _names_gpu(value) else value


def _names(target: cst.CSTNode) -> list[cst.Name]:
    return [n for n in bound(target) if isinstance(n, cst.Name)]
