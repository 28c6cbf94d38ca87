"""Steps over ddpkit.loader slowly, writing its pid; on a preemption stop, writes the step it stopped at and
exits with 128 + the signal (as the examples do). Rank 1 takes longer to leave, so torchrun's agent, which
SIGTERMs the ranks still running once one has exited, catches it on its way out."""

import json
import os
import sys
import time
from pathlib import Path

import torch

import ddpkit

out = Path(sys.argv[1])
with ddpkit.init(device="cpu") as ctx:
    data = ddpkit.loader(torch.utils.data.TensorDataset(torch.arange(10_000.0)), ctx, batch_size=1)
    step = 0
    for _ in data:
        step += 1
        if step == 2:  # the loader has checked for a stop once: a signal now is caught, not fatal
            (out / f"rank{ctx.rank}.tmp").write_text(str(os.getpid()))
            (out / f"rank{ctx.rank}.tmp").rename(out / f"rank{ctx.rank}.pid")  # whole, when the test sees it
        time.sleep(0.05)
    (out / f"rank{ctx.rank}.json").write_text(json.dumps({"step": step, "signal": ctx.stop_signal}))
    stopped = ctx.stop_signal
if stopped and ctx.rank == 1:
    time.sleep(2.0)  # e.g. an upload of the last checkpoint
sys.exit(128 + stopped if stopped else 0)
