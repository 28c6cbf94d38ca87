"""Every private torch name ddpkit uses (ddpkit.torchinternals), checked against the installed torch.

A failure here names the torch name and the release: read the name again in that release, mend the
function of torchinternals that uses it, then widen READ_AGAINST and the table in docs/releases.md.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest
import torch
import torch.distributed as dist
from packaging.version import Version
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

from ddpkit.run import rendezvous
from ddpkit import torchinternals
from ddpkit.torchinternals import READ_AGAINST, TorchInternalsWarning

DYNAMIC = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"


def _require(ok: bool, name: str, what: str) -> None:
    if not ok:
        pytest.fail(f"torch {torch.__version__}: {name} {what}; ddpkit.torchinternals relies on it (read against "
                    f"{READ_AGAINST}): read it again in this release and mend the function that uses it",
                    pytrace=False)


def _params(backend: str, **conf) -> RendezvousParameters:
    conf = {"join_timeout": "20", "last_call_timeout": "1", "read_timeout": "20", **conf}
    return RendezvousParameters(backend=backend, endpoint="127.0.0.1:0", run_id="internals", min_nodes=1,
                                max_nodes=2, local_addr="127.0.0.1", is_host="true", **conf)


@pytest.fixture
def handlers():
    made = []
    yield made
    for handler in made:
        handler.shutdown()


def test_installed_torch_is_a_release_the_internals_were_read_against():
    _require(torchinternals.torch_version() in READ_AGAINST, "every name in ddpkit.torchinternals",
             f"was read against {READ_AGAINST} only (this is {torchinternals.torch_version()})")


def test_node_desc_is_torchs_frozen_ordered_dataclass_of_addr_pid_local_id():
    node_desc = getattr(dr, "_NodeDesc", None)
    _require(node_desc is not None, f"{DYNAMIC}._NodeDesc", "is missing")
    _require(dataclasses.is_dataclass(node_desc), f"{DYNAMIC}._NodeDesc", "is no longer a dataclass")
    fields = tuple(f.name for f in dataclasses.fields(node_desc))
    _require(fields == ("addr", "pid", "local_id"), f"{DYNAMIC}._NodeDesc", f"has fields {fields}")
    params = node_desc.__dataclass_params__
    _require(params.frozen and params.eq, f"{DYNAMIC}._NodeDesc", "is no longer frozen with eq (a dict key)")
    assert torchinternals.node_desc_base() is node_desc
    assert issubclass(rendezvous._Node, node_desc)


def test_handler_constructor_and_state_holder_take_what_ddpkit_passes():
    init = list(inspect.signature(dr.DynamicRendezvousHandler.__init__).parameters)
    _require(init == ["self", "node", "settings", "backend_name", "store", "state_holder"],
             f"{DYNAMIC}.DynamicRendezvousHandler.__init__", f"takes {init[1:]}")
    holder = getattr(dr, "_BackendRendezvousStateHolder", None)
    _require(holder is not None, f"{DYNAMIC}._BackendRendezvousStateHolder", "is missing")
    init = list(inspect.signature(holder.__init__).parameters)
    _require(init[:3] == ["self", "backend", "settings"], f"{DYNAMIC}._BackendRendezvousStateHolder.__init__",
             f"takes {init[1:]}")


def test_next_rendezvous_joins_through_the_op_executor_and_caches_the_ranks_store():
    source = inspect.getsource(dr.DynamicRendezvousHandler.next_rendezvous)
    name = f"{DYNAMIC}.DynamicRendezvousHandler.next_rendezvous"
    _require(hasattr(dr, "_RendezvousJoinOp") and "_RendezvousJoinOp()" in source, name,
             "no longer runs a _RendezvousJoinOp")
    _require("self._op_executor.run(join_op" in source, name, "no longer runs its join op through _op_executor.run")
    for needle in ("self._bootstrap_store_info is None",
                   "self._shared_tcp_store_server = self._create_tcp_store_server("):
        _require(needle in source, name, f"no longer has `{needle}` (the store it keeps across rounds)")
    run = list(inspect.signature(dr._DistributedRendezvousOpExecutor.run).parameters)
    _require(run == ["self", "state_handler", "deadline", "update_deadline"],
             f"{DYNAMIC}._DistributedRendezvousOpExecutor.run", f"takes {run[1:]}")


def test_torchs_own_handler_has_the_attributes_ddpkit_sets(handlers):
    handler = rendezvous_handler_registry.create_handler(_params("c10d"))
    handlers.append(handler)
    for attr in ("_this_node", "_op_executor", "_bootstrap_store_info", "_shared_tcp_store_server",
                 "_create_tcp_store_server"):
        _require(hasattr(handler, attr), f"{DYNAMIC}.DynamicRendezvousHandler.{attr}", "is missing")
    _require(isinstance(handler._this_node, dr._NodeDesc), f"{DYNAMIC}.DynamicRendezvousHandler._this_node",
             f"is a {type(handler._this_node).__name__}")
    _require(callable(handler._op_executor.run), f"{DYNAMIC}.DynamicRendezvousHandler._op_executor.run",
             "is not callable")


def _two_rounds(handler) -> list[int]:
    return [handler.next_rendezvous().bootstrap_store_info.master_port for _ in range(2)]


def test_torch_alone_keeps_the_ranks_store_across_rounds(handlers, monkeypatch):
    """pytorch/pytorch#135712's cause: the bug ddpkit's fresh_store_per_round answers, still in this torch."""
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    handler = rendezvous_handler_registry.create_handler(_params("c10d"))
    handlers.append(handler)
    first, second = _two_rounds(handler)
    assert first == second, (f"torch {torch.__version__} gives the ranks a new store per round by itself: "
                             "ddpkit.torchinternals.fresh_store_per_round may be unneeded there; gate it out")


def test_ddpkit_handler_orders_checks_and_binds_through_the_internals(handlers, monkeypatch):
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    rendezvous.register()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchInternalsWarning)
        handler = rendezvous_handler_registry.create_handler(
            _params(rendezvous.BACKEND, bind_addr="127.0.0.1", node_rank="0"))
    handlers.append(handler)
    node = handler._this_node
    assert isinstance(node, rendezvous._Node) and (node.node_rank, node.nnodes) == (0, "1:2")
    assert handler._op_executor._node is node  # the constructor handed our node to the state machine
    checks = []  # ddpkit's peer check, called by torch's join through the wrapped op executor
    monkeypatch.setattr(rendezvous, "_check_peers", lambda me, state: checks.append(me in state.participants))
    first, second = _two_rounds(handler)
    assert first != second  # a new shared store per round
    assert checks and checks[-1] is True
    listening = handler._shared_tcp_store_server
    assert listening is not None and listening.host == "127.0.0.1" and listening.port == second


def test_default_store_is_the_default_groups_store(tmp_path):
    assert torchinternals.default_store() is None  # no group yet
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        store = torchinternals.default_store()
        _require(store is not None, "torch.distributed.distributed_c10d._get_default_store", "returned nothing")
        assert store.add("ddpkit-key", 1) == 1 and store.add("ddpkit-key", 1) == 2
    finally:
        dist.destroy_process_group()


def test_other_torch_releases_get_torchs_own_behaviour_and_one_line_each(handlers, monkeypatch):
    monkeypatch.setattr(torchinternals, "torch_version", lambda: Version("2.99.0"))
    torch_handler = rendezvous_handler_registry.create_handler(_params("c10d"))
    handlers.append(torch_handler)
    torch_next_rendezvous = torch_handler.next_rendezvous
    with pytest.warns(TorchInternalsWarning) as caught:
        assert torchinternals.handler_with_node(torch_handler, lambda n: n, backend=None, store=None) is None
        assert torchinternals.check_each_join(torch_handler, lambda state: None) is False
        assert torchinternals.fresh_store_per_round(torch_handler) is False
        assert torchinternals.bind_shared_store(torch_handler, lambda addr, port: None) is False
        assert torchinternals.default_store() is None
    assert torch_handler.next_rendezvous == torch_next_rendezvous  # untouched
    messages = [str(w.message) for w in caught]
    assert len(messages) == 5 and all("\n" not in m and "torch 2.99.0 is not one of the releases" in m
                                      for m in messages), messages
    assert any("not by --node-rank" in m for m in messages) and any("#135712" in m for m in messages)
    rendezvous.register()
    with pytest.warns(TorchInternalsWarning):
        handler = rendezvous_handler_registry.create_handler(_params(rendezvous.BACKEND, node_rank="0"))
    handlers.append(handler)
    assert type(handler._this_node) is dr._NodeDesc  # torch's handler as it is


# --- process-group abort, NCCL flight recorder, GradScaler scale, fused on-device skip ---

def test_abort_process_group_exists_and_takes_a_group():
    import torch.distributed.distributed_c10d as c10d

    abort = getattr(c10d, "_abort_process_group", None)
    assert callable(abort), "torch removed distributed_c10d._abort_process_group: find its replacement"
    assert list(inspect.signature(abort).parameters) == ["group"]


def test_abort_process_group_aborts_a_real_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert torchinternals.abort_process_group() is True
    assert not dist.is_initialized()


def test_nccl_flight_record_is_reachable_where_nccl_is_built():
    import torch.distributed as dist

    dump = getattr(getattr(torch._C, "_distributed_c10d", None), "_dump_nccl_trace", None)
    if dist.is_nccl_available():
        assert callable(dump), "torch with NCCL lost torch._C._distributed_c10d._dump_nccl_trace"
    else:
        assert torchinternals.nccl_flight_record() is None


def test_nccl2_records_in_the_hooked_recorder_named_nccl2_from_2_15_on():
    # torch 2.15's default "nccl" is ProcessGroupNCCL2: it records nothing itself; c10d attaches a
    # FlightRecorderHook that files its collectives in the recorder named after the backend, read by
    # _dump_fr_trace(backend=...). Before 2.15 there is no nccl2 and _dump_fr_trace takes no backend.
    import torch.distributed.distributed_c10d as c10d

    dump = getattr(getattr(torch._C, "_distributed_c10d", None), "_dump_fr_trace", None)
    _require(callable(dump), "torch._C._distributed_c10d._dump_fr_trace", "is missing")
    takes_backend = "backend: str" in (dump.__doc__ or "")
    if torchinternals.torch_version() < torchinternals._NCCL2_FROM:
        assert not takes_backend and not hasattr(c10d, "ProcessGroupNCCL2")
        return
    _require(takes_backend, "_dump_fr_trace(backend=...)", "no longer takes the backend whose recorder to read")
    self_recording = getattr(c10d, "_FR_SELF_RECORDING_BACKENDS", {"nccl2"})
    _require(hasattr(c10d, "FlightRecorderHook") and "nccl2" not in self_recording,
             "distributed_c10d.FlightRecorderHook", "no longer records nccl2's collectives")
    if dist.is_nccl_available():
        _require(hasattr(c10d, "ProcessGroupNCCL2"), "distributed_c10d.ProcessGroupNCCL2", "is missing")
        assert isinstance(torchinternals.nccl_flight_record(), dict)  # the nccl2 recorder, empty here


@pytest.mark.parametrize(("release", "expected"), [("2.14.1", "nccl"), ("2.15.0", "nccl2")])
def test_nccl_flight_record_reads_the_recorder_nccl2_writes_from_2_15_on(monkeypatch, release, expected):
    import pickle

    c10d = torch._C._distributed_c10d
    entry = {"profiling_name": "nccl:all_reduce", "collective_seq_id": 1, "state": "scheduled",
             "time_created_ns": 1, "input_sizes": [[3]], "input_dtypes": ["Float"]}
    stock = {"entries": [dict(entry, source="nccl")]}
    hooked = {"nccl2": {"entries": [dict(entry, source="nccl2")]}, "gloo": {"entries": []}}
    monkeypatch.setattr(c10d, "_dump_nccl_trace", lambda **kw: pickle.dumps(stock), raising=False)
    monkeypatch.setattr(c10d, "_dump_fr_trace",
                        lambda backend="gloo", **kw: pickle.dumps(hooked.get(backend, {"entries": []})), raising=False)
    monkeypatch.setattr(torchinternals, "torch_version", lambda: Version(release))
    assert torchinternals.nccl_flight_record()["entries"][0]["source"] == expected
    sources = [e["source"] for r in torchinternals.flight_records() for e in r["entries"]]
    assert sorted(sources) == sorted({"nccl", expected})  # the watchdog sees nccl2's pending collective too
    hooked["nccl2"] = {"entries": []}  # TORCH_DIST_USE_NCCL2=0: the stock ProcessGroupNCCL records itself
    assert torchinternals.nccl_flight_record()["entries"][0]["source"] == "nccl"


def test_grad_scaler_scale_is_the_live_scale_tensor():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.ones((), requires_grad=True))
    scale = torchinternals.grad_scaler_scale(scaler)
    assert isinstance(scale, torch.Tensor) and scale.item() == 8.0 == scaler.get_scale()


def test_fused_optimizers_still_skip_on_a_found_inf_tensor():
    p = torch.nn.Parameter(torch.ones(3))
    fused, plain = torch.optim.AdamW([p], lr=0.1, fused=True), torch.optim.AdamW([p], lr=0.1)
    assert getattr(fused, "_step_supports_amp_scaling", None) is True
    assert not getattr(plain, "_step_supports_amp_scaling", False)
    assert torchinternals.step_unless_on_device(plain, torch.tensor(False)) is False
    p.grad = torch.ones(3)
    assert torchinternals.step_unless_on_device(fused, torch.tensor(True)) is True
    assert torch.equal(p.detach(), torch.ones(3)) and not hasattr(fused, "found_inf")
    assert torchinternals.step_unless_on_device(fused, torch.tensor(False)) is True
    assert not torch.equal(p.detach(), torch.ones(3))


# --- torch.compile's wrapper (parallel.unwrap, find_ddp, fsdp.find_fsdp) ---


def test_compiled_module_keeps_the_original_in_orig_mod():
    net = torch.nn.Linear(2, 2)
    compiled = torch.compile(net, backend="eager")  # wraps at once; nothing compiles until called
    _require(type(compiled).__name__ == "OptimizedModule", "torch.compile's wrapper",
             f"is a {type(compiled).__name__}, not OptimizedModule")
    _require(getattr(compiled, "_orig_mod", None) is net, "OptimizedModule._orig_mod", "no longer holds the module")
    assert torchinternals.compiled_inner(compiled) is net
    assert torchinternals.compiled_inner(net) is None
    from ddpkit.parallel.strategy import unwrap

    assert unwrap(compiled) is net
    assert all(not k.startswith("_orig_mod.") for k in unwrap(compiled).state_dict())


def test_the_flight_recorder_keeps_what_the_watchdog_reads():
    # Its buffer size is read once per process, when the first group is made: a fresh process.
    import subprocess
    import sys

    code = ("import os, pickle, time, tempfile\n"
            "os.environ['TORCH_FR_BUFFER_SIZE'] = '10'\n"
            "import torch, torch.distributed as dist\n"
            "from ddpkit import torchinternals\n"
            "dist.init_process_group('gloo', store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)\n"
            "dist.group.WORLD.allreduce([torch.ones(3)]).wait()\n"
            "raw = torch._C._distributed_c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, "
            "onlyActive=False)\n"
            "[e] = [e for e in pickle.loads(raw)['entries'] if e['profiling_name'].endswith('all_reduce')]\n"
            "assert {'state', 'retired', 'time_created_ns', 'input_sizes', 'input_dtypes'} <= set(e), sorted(e)\n"
            "assert abs(time.time_ns() - e['time_created_ns']) < 60e9, 'time_created_ns is not CLOCK_REALTIME'\n"
            "assert e['input_sizes'] == [[3]] and e['input_dtypes'] == ['Float']\n"
            "assert isinstance(torchinternals.flight_records(), list)\n"
            "dist.destroy_process_group()\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
