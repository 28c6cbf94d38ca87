"""A small DDP job for `ddpkit run --profile`: it never mentions profiling itself."""

import sys
import time

import torch

import ddpkit


class Slow(torch.utils.data.Dataset):
    """Rank 1's batches arrive 30 ms late (a sleep per batch)."""

    def __init__(self, rank: int) -> None:
        self.x, self.y = torch.randn(320, 16), torch.randn(320, 1)
        self.sleep_s = 0.03 if rank == 1 else 0.0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]

    def __getitems__(self, indices: list[int]):
        time.sleep(self.sleep_s)
        return [(self.x[i], self.y[i]) for i in indices]


with ddpkit.init(seed=0) as ctx:
    model = ddpkit.wrap(torch.nn.Linear(16, 1), ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prec = ddpkit.Precision(ctx, dtype="fp32")
    for x, y in ddpkit.loader(Slow(ctx.rank), ctx, batch_size=8):  # 20 steps
        prec.backward(torch.nn.functional.mse_loss(model(x), y))
        prec.step(opt, model)
print(f"rank {ctx.rank} done", file=sys.stderr)
