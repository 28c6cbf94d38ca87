"""`ddpkit port`: a class-private method (`self.__train(...)`) the entry point calls is ported like any other."""

from __future__ import annotations

from ddpkit.port import port_source

PRIVATE_STEP = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from mynet import Net
from options import get_opts


class Runner:
    def __init__(self, opts):
        self.opts = opts

    @staticmethod
    def __train(model, loader, optimizer, opts):
        model.train()
        for x, y in loader:
            y = y.view(opts.batch_size, 2, -1)
            out = model(x)
            loss = model.score(y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    def main(self):
        opts = self.opts
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 4))
        loader = DataLoader(data, opts.batch_size, shuffle=True)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(opts.epochs):
            self.__train(model, loader, optimizer, opts)


if __name__ == "__main__":
    runner = Runner(get_opts())
    runner.main()
'''


def test_a_private_training_method_is_reached_and_its_model_method_and_global_batch_size_are_todos():
    result = port_source(PRIVATE_STEP)
    messages = [t.message for t in result.todos]
    assert result.exit_code == 3
    assert any(m.startswith("`model.score(...)` trains through a method of the model") for m in messages), messages
    assert any(m.startswith("`opts.batch_size` is the global batch") for m in messages), messages
    assert "loss = ddpkit.unwrap(model).score(y)" in result.code  # never the DDP wrapper's missing attribute
