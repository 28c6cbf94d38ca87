"""init() leaves torch.distributed alone unless a hang timeout is asked for; a second hang timeout is honoured."""

from __future__ import annotations

import warnings

from harness import RankInfo, run_ranks


def _traced() -> bool:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    flags = {getattr(getattr(m, name), "_ddpkit_traced", False) for m in (dist, c10d) for name in ("all_reduce", "barrier")}
    assert len(flags) == 1, flags  # all wrapped or none
    return flags.pop()


def _watchdog_lifecycle(info: RankInfo):
    import itertools

    import ddpkit
    from ddpkit.hang.watchdog import running_watchdog, start_watchdog

    fresh = itertools.count()

    def init(**kwargs):  # a file:// rendezvous serves one process group: a new file for each
        return ddpkit.init(init_method=f"{info.init_method}-{next(fresh)}", **kwargs)

    out = {}
    with init(seed=0):
        out["plain init"] = (_traced(), running_watchdog() is None)
    with init(seed=0, hang_timeout_s=30) as ctx:
        out["with hang timeout"] = (_traced(), running_watchdog().timeout_s)
        ctx.close()
        out["after close"] = (_traced(), running_watchdog() is None)
    with init(seed=0, hang_timeout_s=45):  # a second init in the process: its own timeout
        out["second init"] = running_watchdog().timeout_s
    # a watchdog already running (as `ddpkit run --hang-timeout 20` starts it before the script)
    launcher_dog = start_watchdog(timeout_s=20, rank=info.rank, world_size=info.world_size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with init(seed=0, hang_timeout_s=7):
            out["adopted"] = (running_watchdog() is launcher_dog, launcher_dog.timeout_s)
        with init(seed=0, hang_timeout_s=7):  # the same value again: nothing to say
            pass
    out["warnings"] = [str(w.message) for w in caught]
    out["launcher's survives close"] = (running_watchdog() is launcher_dog, _traced())
    launcher_dog.stop()
    out["all stopped"] = _traced()
    return out


def test_init_wraps_torch_distributed_only_with_a_hang_timeout_and_honours_a_second_one():
    for out in run_ranks(_watchdog_lifecycle, 2, timeout=180):
        assert out["plain init"] == (False, True)
        assert out["with hang timeout"] == (True, 30.0)
        assert out["after close"] == (False, True)
        assert out["second init"] == 45.0
        assert out["adopted"] == (True, 7.0)
        (warning,) = out["warnings"]
        assert "hang_timeout_s=7" in warning and "after 7 s instead of 20 s" in warning
        assert out["launcher's survives close"] == (True, True)
        assert out["all stopped"] is False
