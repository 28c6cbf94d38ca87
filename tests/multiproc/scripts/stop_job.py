"""Steps over ddpkit.loader slowly, writing its pid; on a preemption stop, writes the step it stopped at and
exits with 128 + the signal (as the examples do)."""

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
    (out / f"rank{ctx.rank}.pid").write_text(str(os.getpid()))
    step = 0
    for _ in data:
        step += 1
        time.sleep(0.05)
    (out / f"rank{ctx.rank}.json").write_text(json.dumps({"step": step, "signal": ctx.stop_signal}))
    stopped = ctx.stop_signal
sys.exit(128 + stopped if stopped else 0)
