"""`ddpkit env`: what this machine offers for DDP (torch, GPUs, backends, network), for bug reports."""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
from typing import Any

from ddpkit.run.nodes import default_nproc_per_node, usable_cpus

__all__ = ["DEFAULT_PORT", "ENV_VARS", "ENV_PREFIXES", "collect", "format_text", "port_is_free", "main"]

DEFAULT_PORT = 29500
"""torchrun's default MASTER_PORT; a busy one is the usual "address already in use" failure."""

ENV_VARS = (
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "NODE_RANK", "CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "OMP_NUM_THREADS",
    "TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES",
    "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_PROCID", "SLURM_LOCALID",
    "SLURM_GPUS_ON_NODE", "SLURM_CPUS_PER_TASK", "SLURM_STEP_GPUS", "SLURM_STEP_ID", "SLURM_STEPID",
    "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS", "SLURM_JOB_NUM_NODES", "SLURM_NODELIST",
    "SKYPILOT_NUM_NODES", "SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_GPUS_PER_NODE", "SKYPILOT_TASK_ID",
)
"""Launcher and communication settings shown by name."""

ENV_PREFIXES = ("TORCHELASTIC_", "NCCL_", "TORCH_NCCL_", "PET_")
"""Every variable with one of these prefixes is shown too."""


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if a TCP socket can bind host:port now (what torchrun's store on rank 0 will need)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _torch_info() -> dict[str, Any]:
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # a broken install is exactly what a bug report must show
        return {"torch": None, "torch_error": f"{type(e).__name__}: {e}", "cuda_available": False,
                "cuda_version": None, "nccl_version": None, "gpus": [], "backends": {}}
    info: dict[str, Any] = {"torch": torch.__version__, "torch_error": None,
                            "cuda_version": torch.version.cuda}
    info["cuda_available"] = bool(torch.cuda.is_available())
    count = torch.cuda.device_count() if info["cuda_available"] else 0
    gpus = []
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        gpus.append({"index": index, "name": props.name,
                     "memory_gib": round(props.total_memory / 2**30, 1),
                     "capability": f"{props.major}.{props.minor}"})
    info["gpus"] = gpus
    available = dist.is_available()
    info["backends"] = {
        "distributed": available,
        "nccl": available and dist.is_nccl_available(),
        "gloo": available and dist.is_gloo_available(),
        "mpi": available and dist.is_mpi_available(),
    }
    info["nccl_version"] = None
    if info["backends"]["nccl"]:
        try:
            version = torch.cuda.nccl.version()
            info["nccl_version"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:  # NCCL present in the build but not loadable here
            info["nccl_version"] = None
    return info


def _interfaces() -> dict[str, list[str]]:
    """Network interface -> IPv4/IPv6 addresses (names only when psutil is not installed)."""
    try:
        import psutil
    except ImportError:
        try:
            return {name: [] for _, name in socket.if_nameindex()}
        except OSError:
            return {}
    families = (socket.AF_INET, socket.AF_INET6)
    return {name: [a.address for a in addrs if a.family in families]
            for name, addrs in sorted(psutil.net_if_addrs().items())}


def _launch(num_gpus: int, num_cpus: int, environ=None) -> dict[str, Any]:
    """What `ddpkit run SCRIPT` would launch here: the cluster's settings (SLURM, SkyPilot, Kubeflow) included."""
    backend = "nccl" if num_gpus > 0 else "gloo"
    try:
        from ddpkit.run.launcher import LaunchError, resolve_nproc_per_node
    except ImportError:  # torch missing: the report still runs
        nproc = default_nproc_per_node(num_gpus, num_cpus)
        return {"nproc_per_node": nproc, "backend": backend, "command": f"ddpkit run --nproc-per-node {nproc} SCRIPT"}
    from ddpkit.run.nodes import ClusterError, resolve_nodes

    environ = os.environ if environ is None else environ
    try:
        nodes = resolve_nodes(nnodes=None, node_rank=None, rdzv_endpoint=None, rdzv_id=None, nproc_per_node=None,
                              environ=environ)
        nproc = resolve_nproc_per_node(nodes.nproc_per_node, num_gpus=num_gpus, num_cpus=num_cpus, environ=environ)
    except (ClusterError, LaunchError) as e:
        return {"nproc_per_node": None, "backend": backend, "command": f"(ddpkit run would refuse: {e})"}
    flags = []
    if not nodes.single_node:
        flags += [f"--nnodes {nodes.nnodes}"]
        if nodes.node_rank is not None:
            flags += [f"--node-rank {nodes.node_rank}"]
        flags += [f"--rdzv-endpoint {nodes.rdzv_endpoint}", f"--rdzv-id {nodes.rdzv_id}"]
    flags += [f"--nproc-per-node {nproc}"]
    return {"nproc_per_node": nproc, "backend": backend, "nnodes": nodes.nnodes,
            "command": "ddpkit run " + " ".join(flags) + " SCRIPT"}


def collect() -> dict[str, Any]:
    """Everything `ddpkit env` reports, as plain JSON-able values. Never raises on a CPU-only machine."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
    }
    info.update(_torch_info())
    info["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    info["cpu_count"] = os.cpu_count() or 1
    info["cpu_affinity"] = usable_cpus()
    info["interfaces"] = _interfaces()
    info["env"] = {k: v for k, v in sorted(os.environ.items())
                   if k in ENV_VARS or k.startswith(ENV_PREFIXES)}
    info["default_port"] = DEFAULT_PORT
    info["default_port_free"] = port_is_free(DEFAULT_PORT)
    info["launch"] = _launch(len(info["gpus"]), info["cpu_affinity"])
    return info


def _yes(flag: bool | None) -> str:
    return "yes" if flag else "no"


def format_text(info: dict[str, Any]) -> str:
    """The report as aligned `key: value` lines, ready to paste into an issue."""
    backends = info["backends"]
    if info["torch"] is None:
        torch_line = f"not importable ({info['torch_error']})"
    else:
        torch_line = info["torch"] + (f" (CUDA {info['cuda_version']})" if info["cuda_version"] else " (CPU build)")
    rows = [
        ("python", f"{info['python']} ({info['python_executable']})"),
        ("platform", info["platform"]),
        ("hostname", info["hostname"]),
        ("torch", torch_line),
        ("cuda available", _yes(info["cuda_available"])),
        ("nccl", f"yes ({info['nccl_version']})" if backends.get("nccl") and info["nccl_version"]
         else _yes(backends.get("nccl"))),
        ("gloo", _yes(backends.get("gloo"))),
        ("mpi", _yes(backends.get("mpi"))),
        ("gpus", str(len(info["gpus"]))),
    ]
    rows += [(f"  gpu {g['index']}", f"{g['name']} ({g['memory_gib']} GiB, sm {g['capability']})")
             for g in info["gpus"]]
    rows += [
        ("CUDA_VISIBLE_DEVICES", info["cuda_visible_devices"] if info["cuda_visible_devices"] is not None
         else "(unset)"),
        ("cpus", f"{info['cpu_count']} (usable by this process: {info['cpu_affinity']})"),
        (f"port {info['default_port']}", "free on 127.0.0.1" if info["default_port_free"]
         else "in use on 127.0.0.1 (ddpkit run picks a free port; torchrun needs --master-port)"),
        ("interfaces", "" if info["interfaces"] else "(none found)"),
    ]
    rows += [(f"  {name}", ", ".join(addrs) or "(no address)") for name, addrs in info["interfaces"].items()]
    rows.append(("environment", "" if info["env"] else "(no launcher variables set)"))
    rows += [(f"  {k}", v) for k, v in info["env"].items()]
    launch = info["launch"]
    rows += [("launch", launch["command"]), ("backend", launch["backend"])]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k + ':':<{width + 1}} {v}".rstrip() for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `ddpkit env`; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="ddpkit env",
        description="Report torch, GPUs, distributed backends, network and launcher variables "
                    "(paste the output into bug reports).")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    info = collect()
    print(json.dumps(info, indent=2) if args.format == "json" else format_text(info))
    return 0
