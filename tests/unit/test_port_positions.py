"""`ddpkit port`: an evaluation loop over a sharded loader that looks items up by the batch's running position."""

from __future__ import annotations

from ddpkit.port import port_source

SOURCE = '''\
import torch
from torch.utils.data import DataLoader, TensorDataset

names = [f"item{i}.wav" for i in range(64)]
train = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
test = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in train:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
total = 0.0
with torch.no_grad():
    for i, (x, y) in enumerate(test):
        out = model(x)
        total += torch.nn.functional.mse_loss(out, y).item()
        print(names[i], out[0].item())
print(total)
'''


def test_a_lookup_by_the_batchs_position_in_a_sharded_evaluation_loop_is_a_todo():
    result = port_source(SOURCE, "positions.py")
    assert "ddpkit.eval_loader(" in result.code  # the test set is sharded: position i counts this rank's part only
    todo = next(t.message for t in result.todos if "looks an item up by `i`" in t.message)
    assert todo.startswith("`names[i]` looks an item up by `i`, the batch's position in this rank's shard")
    # the batch's own items, indexed by anything, are this rank's and right
    assert not any("out[0]" in t.message for t in result.todos)
    whole = SOURCE.replace("print(names[i], out[0].item())", "print(out[0].item())")
    assert not any("looks an item up" in t.message for t in port_source(whole, "positions.py").todos)
