"""Test hygiene: environment restored, no process group left behind, no child process left running."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "multiproc"))

_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@pytest.fixture(autouse=True)
def _hygiene():
    saved = dict(os.environ)
    for name in _LAUNCHER_VARS:
        os.environ.pop(name, None)
    yield
    os.environ.clear()
    os.environ.update(saved)
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
            pytest.fail("the test left a process group initialised")
    try:
        import psutil
    except ImportError:
        return
    children = [c for c in psutil.Process().children(recursive=True) if _is_leftover(c)]
    if children:
        for c in children:
            c.kill()
        pytest.fail(f"the test left child processes running: {[c.pid for c in children]}")


def _is_leftover(proc) -> bool:
    """A running child that is not one of multiprocessing's own long-lived helpers (the resource
    tracker, and the fork server the harness starts ranks from: a direct child of this process;
    ranks forked from it share its command line, but not its parent)."""
    try:
        if not proc.is_running() or proc.status() == "zombie":
            return False
        cmd = " ".join(proc.cmdline())
        helper = "resource_tracker" in cmd or ("forkserver" in cmd and proc.ppid() == os.getpid())
    except Exception:  # it exited while we looked
        return False
    return not helper
