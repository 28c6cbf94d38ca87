"""CUDA/NCCL paths checked on CPU with the GPU simulated: the DDP options passed, where loaded state lands,
the device a rank picks, batches on the device, pinning, the dtype chosen."""

from __future__ import annotations

import pytest
import torch

import ddpkit
from ddpkit.env import LaunchEnv
from ddpkit.runtime import Context


def _ctx(rank=0, world_size=1, device="cpu") -> Context:
    return Context(env=LaunchEnv(rank=rank, world_size=world_size, local_world_size=world_size, local_rank=rank),
                   device=torch.device(device), backend="gloo", seed=0)


class _SpyDDP(torch.nn.Module):
    """Stands in for DistributedDataParallel and keeps the keyword arguments it was built with."""

    built: list[dict] = []

    def __init__(self, module, **kwargs):
        super().__init__()
        self.module = module
        _SpyDDP.built.append(kwargs)


def test_ddp_options_reach_ddp_only_when_the_user_sets_them(monkeypatch):
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", _SpyDDP)
    _SpyDDP.built.clear()
    ddpkit.wrap(torch.nn.Linear(2, 2), _ctx(world_size=2), comm=None)
    ddpkit.wrap(torch.nn.Linear(2, 2), _ctx(world_size=2), comm=None, bucket_cap_mb=25)
    default, explicit = _SpyDDP.built
    # An explicit bucket_cap_mb (even torch's own 25) makes DDP drop its 1 MiB first bucket.
    assert "bucket_cap_mb" not in default
    assert "find_unused_parameters" not in default and "static_graph" not in default
    assert default["gradient_as_bucket_view"] is True and default["device_ids"] is None
    assert explicit["bucket_cap_mb"] == 25


def test_slurm_task_with_its_own_gpu_uses_it():
    from ddpkit.device import plan_device
    from ddpkit.env import read_env

    # srun --ntasks-per-node 4 --gpus-per-task 1: the task of local rank 3 sees one GPU, its own, as device 0.
    env = read_env({"SLURM_PROCID": "3", "SLURM_LOCALID": "3", "SLURM_NTASKS": "4", "SLURM_NODEID": "0",
                    "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "gpu01",
                    "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "3"})
    assert (env.launcher, env.local_rank) == ("slurm", 3)
    assert plan_device(env, device="auto", num_gpus=1) == ("cuda:0", "nccl")
    assert plan_device(env, device="cuda", num_gpus=1) == ("cuda:0", "nccl")
    # torchrun's ranks all see the node's GPUs: local rank 3 with one visible is still a mistake.
    torchrun = LaunchEnv(rank=3, local_rank=3, world_size=4, local_world_size=4, launcher="torchrun")
    with pytest.raises(ValueError, match="local rank 3 needs GPU 3 but only 1 are visible"):
        plan_device(torchrun, device="auto", num_gpus=1)
    assert plan_device(torchrun, device="auto", num_gpus=4) == ("cuda:3", "nccl")


def test_resume_loads_to_the_cpu_and_leaves_adams_step_counters_there(tmp_path, monkeypatch):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    with ddpkit.init(seed=0) as ctx:
        ddpkit.save_checkpoint(ctx, tmp_path, step=1, model=model, optimizer=opt)
        # The meta device stands for the rank's GPU: parameters and a fresh optimizer live there.
        ctx.device = torch.device("meta")
        resumed = torch.nn.Linear(4, 2).to("meta")
        resumed_opt = torch.optim.Adam(resumed.parameters(), lr=0.1)
        locations = []
        load = torch.load
        monkeypatch.setattr(torch, "load", lambda *a, **kw: locations.append(kw.get("map_location")) or load(*a, **kw))
        ddpkit.load_checkpoint(ctx, tmp_path, model=resumed, optimizer=resumed_opt)
    assert locations == ["cpu"]
    for state in resumed_opt.state.values():
        assert state["step"].device.type == "cpu"  # read by the CPU every step: no device sync
        assert state["exp_avg"].device.type == "meta" and state["exp_avg_sq"].device.type == "meta"


class _Samples(torch.utils.data.Dataset):
    """x, y rows of two tensors wherever they live (the meta device stands for GPU memory)."""

    def __init__(self, device: str):
        self.x, self.y = torch.zeros(16, 3, device=device), torch.zeros(16, device=device)

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch sees an accelerator, pinning behaves as on CUDA (CPU tensors only), and to_device records
    what it would copy: [(batch, non_blocking)]."""
    import ddpkit.data

    pinned, moved = [], []

    def pin_memory(t, device=None):
        if t.device.type != "cpu":
            raise RuntimeError(f"cannot pin '{t.device.type}' memory: only dense CPU tensors can be pinned")
        pinned.append(tuple(t.shape))
        return t

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("cuda"))
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(ddpkit.data, "to_device", lambda b, d, non_blocking=False: moved.append((b, non_blocking)) or b)
    return pinned, moved


def test_loader_takes_a_dataset_already_on_the_gpu(fake_cuda):
    pinned, moved = fake_cuda
    batches = list(ddpkit.loader(_Samples("meta"), _ctx(device="cuda:0"), batch_size=4))
    assert len(batches) == 4 and batches[0]["x"].device.type == "meta"
    assert pinned == []  # device memory is never pinned (CUDA raises)
    assert list(ddpkit.eval_loader(_Samples("meta"), _ctx(device="cuda:0"), batch_size=8))[0]["y"].shape == (8,)


def test_loader_pins_host_batches_only_and_accepts_pin_memory_false(fake_cuda):
    pinned, moved = fake_cuda
    list(ddpkit.loader(_Samples("cpu"), _ctx(device="cuda:0"), batch_size=4, shuffle=False))
    assert pinned == [(4, 3), (4,)] * 4 and all(nb for _, nb in moved)  # pinned, then copied asynchronously
    pinned.clear(), moved.clear()
    data = ddpkit.loader(_Samples("cpu"), _ctx(device="cuda:0"), batch_size=4, pin_memory=False)
    list(data)
    assert data._loader.pin_memory is False and pinned == [] and not any(nb for _, nb in moved)
    assert list(ddpkit.eval_loader(_Samples("cpu"), _ctx(device="cuda:0"), batch_size=8, pin_memory=False))
    with pytest.raises(TypeError, match="pin_memory='yes' must be True or False"):
        ddpkit.loader(_Samples("cpu"), _ctx(), batch_size=4, pin_memory="yes")


def test_pin_host_tensors_leaves_device_tensors_alone(fake_cuda):
    from ddpkit.device import pin_host_tensors

    pinned, _ = fake_cuda
    batch = {"host": torch.zeros(2), "device": torch.zeros(3, device="meta"), "n": 7}
    out = pin_host_tensors([batch])
    assert pinned == [(2,)] and out[0]["device"].device.type == "meta" and out[0]["n"] == 7


def test_to_device_moves_custom_batch_objects():
    import collections
    import dataclasses

    from ddpkit.device import to_device

    @dataclasses.dataclass(frozen=True)
    class Pair:
        x: torch.Tensor
        meta: dict
        label: str = "a"

    class GraphBatch:  # in the manner of PyG's Batch: .to(device, non_blocking=...) returns the moved batch
        def __init__(self, x):
            self.x = x
            self.calls = []

        def to(self, device, *args, non_blocking=False):
            self.calls.append(non_blocking)
            return GraphBatch(self.x.to(device))

    class Encoding(collections.UserDict):  # in the manner of HF's BatchEncoding: .to(device), in place
        def to(self, device):
            self.data = {k: v.to(device) for k, v in self.data.items()}

    Row = collections.namedtuple("Row", "x y")
    graph, enc = GraphBatch(torch.zeros(2)), Encoding(input_ids=torch.zeros(2, 3))
    # The meta device stands for the GPU: a tensor left behind stays on the CPU.
    out = to_device({"pair": Pair(torch.zeros(2), {"m": torch.ones(1)}), "graph": graph, "enc": enc,
                     "row": Row(torch.zeros(1), 3)}, torch.device("meta"), non_blocking=True)
    assert out["pair"].x.device.type == "meta" and out["pair"].meta["m"].device.type == "meta"
    assert out["pair"].label == "a" and isinstance(out["pair"], Pair)
    assert out["graph"].x.device.type == "meta" and graph.calls == [True]
    assert out["enc"] is enc and enc["input_ids"].device.type == "meta"
    assert out["row"].x.device.type == "meta" and out["row"].y == 3


def _fake_bf16(monkeypatch, *, cuda_native: bool, cpu_native: bool):
    """A GPU that emulates bf16 unless `cuda_native` (V100/T4 vs A100) and a CPU with or without AVX512_BF16."""
    import ddpkit.precision

    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: cuda_native or including_emulation)
    flags = "fpu sse avx2 fma" + (" avx512f avx512_bf16" if cpu_native else "")
    text = f"processor\t: 0\nflags\t\t: {flags}\n"
    monkeypatch.setattr("builtins.open", _opener(text), raising=True)
    return ddpkit.precision


def _opener(text):
    import builtins
    import io

    real = builtins.open

    def fake(path, *args, **kwargs):
        return io.StringIO(text) if str(path) == "/proc/cpuinfo" else real(path, *args, **kwargs)
    return fake


def test_auto_picks_bf16_only_where_the_hardware_computes_it(monkeypatch):
    from ddpkit.precision import resolve_dtype

    _fake_bf16(monkeypatch, cuda_native=False, cpu_native=False)
    assert resolve_dtype("auto", torch.device("cuda:0")) == "fp16"  # V100: bf16 only through emulation
    assert resolve_dtype("auto", torch.device("cpu")) == "fp32"     # AVX2 only: bf16 matmul ~60x slower
    assert ddpkit.Precision(_ctx()).dtype == "fp32"                # the default is 'auto'
    _fake_bf16(monkeypatch, cuda_native=True, cpu_native=True)
    assert resolve_dtype("auto", torch.device("cuda:0")) == "bf16"
    assert resolve_dtype("auto", torch.device("cpu")) == "bf16"     # AVX512_BF16 / AMX
    assert ddpkit.Precision(_ctx()).dtype == "bf16"


def test_forcing_an_emulated_bf16_says_so_in_one_line(monkeypatch):
    import warnings

    _fake_bf16(monkeypatch, cuda_native=False, cpu_native=False)
    with pytest.warns(UserWarning, match=r"this CPU has no AVX512_BF16/AMX, so bfloat16 is emulated.*dtype='auto' "
                                         r"\(fp32 here\)") as caught:
        assert ddpkit.Precision(_ctx(), dtype="bf16").dtype == "bf16"  # the user's choice stands
    assert "\n" not in str(caught[0].message)
    _fake_bf16(monkeypatch, cuda_native=False, cpu_native=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ddpkit.Precision(_ctx(), dtype="bf16")


def test_cpuinfo_flags_name_native_bf16():
    from ddpkit.precision import cpuinfo_has_bf16

    assert cpuinfo_has_bf16("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpuinfo_has_bf16("flags\t\t: fpu avx2 amx_tile amx_bf16\n")
    assert cpuinfo_has_bf16("Features\t: fp asimd bf16 i8mm\n")  # aarch64
    assert not cpuinfo_has_bf16("flags\t\t: fpu sse avx2 fma avx512f\n")
    assert not cpuinfo_has_bf16("")


def test_cpu_ranks_on_a_gpu_machine_reach_the_ranks_as_a_bootstrap_argument(tmp_path, monkeypatch):
    import sys

    from ddpkit import bootstrap
    from ddpkit.run.launcher import build_torchrun_argv, config_from_args

    script = tmp_path / "train.py"
    out = tmp_path / "seen.txt"
    script.write_text(f"import os\nopen({str(out)!r}, 'w').write(os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>'))\n")
    cfg = config_from_args(["--nproc-per-node", "cpu", str(script), "--lr", "1"], environ={}, num_gpus=8, num_cpus=2)
    assert cfg.nproc_per_node == 2 and cfg.cpu_ranks
    argv = build_torchrun_argv(cfg)
    i = argv.index("ddpkit.bootstrap")
    assert argv[i - 1:] == ["-m", "ddpkit.bootstrap", "--device", "cpu", str(script), "--lr", "1"]
    assert not config_from_args(["--nproc-per-node", "2", str(script)], environ={}, num_gpus=8, num_cpus=2).cpu_ranks
    # The rank bootstrap hides the GPUs before the script runs: torch and ddpkit.init then see none.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert bootstrap.main(["--device", "cpu", str(script)]) == 0
    assert out.read_text() == ""


def test_cpu_mapping_maps_every_way_of_naming_a_cuda_device_and_tracks_host_tensors():
    import torch.distributed as dist

    from ddpkit.check.cpumap import CpuMapping

    notes, host = [], []
    mapping = CpuMapping(lambda what, site: notes.append(what), lambda op, site, shapes: host.append((op, shapes)))
    mapping.install()
    try:
        assert torch.device(1) == torch.device("cuda", 1) and isinstance(torch.device("cpu"), torch.device)
        model = torch.nn.Linear(2, 2).to(1)
        x = torch.randn(3, 2).to(0)
        y = torch.zeros(1, device=1)
        acc = torch.accelerator.current_accelerator()
        torch.accelerator.set_device_index(1)
        assert (acc.type, torch.accelerator.current_device_index(), torch.cuda.current_device()) == ("cuda", 1, 1)
        assert {model.weight.device.type, x.device.type, y.device.type} == {"cpu"}
        bn = torch.nn.SyncBatchNorm(2)
        assert bn(torch.randn(4, 2, 3)).shape == (4, 2, 3)  # per-rank statistics, any input of 2+ dimensions
        assert torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) is model
        mapping.nccl_only = True
        for t in (torch.tensor([model(x).sum().item()]), model(x).sum(), torch.zeros(1, device="cuda")):
            with pytest.raises(ValueError):  # no process group here; the check runs first
                dist.all_reduce(t)
    finally:
        mapping.uninstall()
    assert host == [("all_reduce", ["float32[1]"])]  # only the tensor that stays on the CPU on a GPU machine
    for what in ("torch.device(1) -> cuda:1 (then cpu)", "Module.to(1) -> cpu", "Tensor.to(0) -> cpu",
                 "device=1 -> cpu", "torch.accelerator.current_accelerator() -> cuda (then cpu)",
                 "torch.cuda.current_device() -> 1 (then cpu)", "nn.SyncBatchNorm -> BatchNorm (per-rank statistics: "
                 "cross-rank synchronisation not checked)"):
        assert what in notes
    assert torch.nn.SyncBatchNorm.__module__ == "torch.nn.modules.batchnorm"  # restored
    if torch.accelerator.current_accelerator() is None:  # a CPU build of torch
        with pytest.raises(RuntimeError):
            torch.device(0)  # torch's own again: no accelerator here
    else:  # a CUDA build without a GPU: torch's own device(0) names cuda:0 without looking for one
        assert torch.device(0) == torch.device("cuda", 0) and type(torch.device(0)) is torch.device


def test_host_tensor_findings_name_the_ranks_and_the_line():
    from ddpkit.check.analysis import analyse

    records = {r: [{"ev": "host_tensor", "op": "all_reduce", "site": "train.py:31", "shapes": ["float32[1]"]}]
               for r in (0, 1)}
    [finding] = analyse(records)
    assert (finding.kind, finding.site) == ("device", "train.py:31")
    assert "ranks 0,1 pass a CPU tensor (float32[1]) to all_reduce" in finding.message


def _slurm(local_rank: int, **extra: str):
    from ddpkit.env import read_env

    return read_env({"SLURM_PROCID": str(local_rank), "SLURM_LOCALID": str(local_rank), "SLURM_NTASKS": "4",
                     "SLURM_NODEID": "0", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "77",
                     "SLURM_STEP_NODELIST": "gpu01", "SLURM_STEP_TASKS_PER_NODE": "4", **extra})


def test_slurm_tasks_that_all_see_the_same_gpus_never_share_one():
    from ddpkit.device import plan_device

    # srun --ntasks-per-node 4 with --gres=gpu:2 and no per-task binding: every task sees GPUs 0,1.
    # Local ranks 2 and 3 used to map to cuda:0, sharing rank 0's GPU; now every task refuses alike.
    for rank in range(4):
        with pytest.raises(ValueError, match=r"4 tasks on this node and each sees the same 2 GPU.*--gpus-per-task=1"):
            plan_device(_slurm(rank, CUDA_VISIBLE_DEVICES="0,1"), device="auto", num_gpus=2)
    # all four GPUs visible to every task: local rank r takes GPU r
    assert [plan_device(_slurm(r), device="auto", num_gpus=4)[0] for r in range(4)] == [f"cuda:{r}" for r in range(4)]
    # bound per task (--gpus-per-task=2, or --gpu-bind=single:1): each task's own GPUs start at 0
    assert plan_device(_slurm(3, SLURM_GPUS_PER_TASK="2"), device="auto", num_gpus=2) == ("cuda:0", "nccl")
    assert plan_device(_slurm(1, SLURM_GPU_BIND="single:1"), device="auto", num_gpus=1) == ("cuda:0", "nccl")
    with pytest.raises(ValueError, match="each sees the same 1 GPU"):
        plan_device(_slurm(1, SLURM_GPU_BIND="none"), device="auto", num_gpus=1)
