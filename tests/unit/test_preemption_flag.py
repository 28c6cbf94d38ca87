"""Preemption at world size 1: a caught SIGTERM/SIGUSR1 ends the loader's loop at a step boundary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

import ddpkit


def _data() -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.arange(40.0))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_mid_step_stops_after_that_step(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    with ddpkit.init(device="cpu") as ctx:
        loader = ddpkit.loader(_data(), ctx, batch_size=2, accumulation_steps=2, shuffle=False)
        seen = []
        for (x,) in loader:
            seen.append(x.tolist())
            if len(seen) == 5:  # first micro-batch of step 3: the stop waits for the step's end
                os.kill(os.getpid(), sig)
        assert len(seen) == 6 and loader.step_end
        assert ctx.should_stop() and ctx.stop_signal == int(sig)
        assert loader.state_dict() == {"epoch": 0, "samples_seen": 12, "seed": 0}
        assert list(loader) == []  # stays stopped: a later loop yields nothing
    # stopping: a repeated signal (torchrun's agent SIGTERMs the ranks left once one has exited) is ignored
    assert signal.getsignal(sig) not in (before, signal.SIG_IGN, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    for stop in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(stop, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_close_without_a_stop_puts_the_previous_handler_back(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    with ddpkit.init(device="cpu") as ctx:
        assert not ctx.should_stop()
    assert signal.getsignal(sig) == before


def test_after_an_agreed_stop_a_late_sigterm_cannot_kill_the_rank_on_its_way_out() -> None:
    # rank 0 of a stopped run exits first, and torchrun's agent then SIGTERMs the ranks still leaving
    code = ("import os, signal, sys, time, ddpkit\n"
            "with ddpkit.init(device='cpu') as ctx:\n"
            "    assert not ctx.should_stop()\n"
            "    os.kill(os.getpid(), signal.SIGUSR1)\n"
            "    assert ctx.should_stop()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(0.2)\n"
            "print('left', flush=True)\n"
            "sys.exit(128 + ctx.stop_signal)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGUSR1 and "left" in proc.stdout, proc.stderr[-2000:]


def test_without_a_signal_the_loader_runs_the_epoch() -> None:
    with ddpkit.init(device="cpu") as ctx:
        loader = ddpkit.loader(_data(), ctx, batch_size=4, shuffle=False)
        assert len(list(loader)) == 10 and not ctx.should_stop() and ctx.stop_signal is None


def test_a_process_that_never_checks_still_dies_on_sigterm() -> None:
    code = ("import os, signal, ddpkit\nctx = ddpkit.init(device='cpu')\nos.kill(os.getpid(), signal.SIGTERM)\n"
            "import time; time.sleep(30)\nprint('survived')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGTERM and "survived" not in proc.stdout


def test_the_stop_flag_on_cuda_never_makes_the_host_wait_for_the_current_step(monkeypatch, tmp_path):
    # ddpkit.loader calls agree() at every step end at world size > 1: building the flag with
    # torch.tensor([v], device="cuda") copies from pageable memory and waits for the GPU every step.
    import torch.distributed as dist
    from simcuda import FakeEvent, SimCuda

    from ddpkit.preemption import StopFlag

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.made.clear()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        flag = StopFlag()
        with SimCuda() as sim:
            results = [flag.agree(distributed=True, device=torch.device("cuda", 0)) for _ in range(4)]
            flag.received = int(signal.SIGUSR1)  # caught between two step ends
            results += [flag.agree(distributed=True, device=torch.device("cuda", 0)) for _ in range(2)]
    finally:
        dist.destroy_process_group()
    assert sim.syncs == []
    assert results == [None] * 5 + [int(signal.SIGUSR1)]  # agreed one step boundary later
    # the host only ever waits for an event recorded at an earlier step end, never the current one
    assert len(FakeEvent.made) == 5 and all(e.recorded == 1 for e in FakeEvent.made)
    assert [e.synchronized for e in FakeEvent.made] == [1] * 5
