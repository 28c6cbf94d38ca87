"""`ddpkit port` on branches that check files on disk and lines that only name a written file."""

from __future__ import annotations

from ddpkit.port import port_source

_RESUME = '''
import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()
x = torch.randn(128, 4)
loader = DataLoader(TensorDataset(x, x), batch_size=16, shuffle=True)
net = nn.Linear(4, 4)
opt = torch.optim.Adam(net.parameters(), lr=args.lr)
ckpt = "runs/net.pt"
if args.resume:
    if os.path.isfile(ckpt):
        state = torch.load(ckpt, map_location="cpu")
        opt.load_state_dict(state["opt"])
        if not opt.param_groups[0]["lr"] == args.lr:
            opt.param_groups[0]["lr"] = args.lr
for epoch in range(3):
    for xb, yb in loader:
        loss = nn.functional.mse_loss(net(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.save({"opt": opt.state_dict()}, ckpt)
    if os.path.exists("runs/stop"):
        break
'''


def test_a_file_check_before_training_reads_an_earlier_runs_files_alike_on_every_rank():
    # the checkpoint check runs before anything of this run is written: every rank sees the same files, so setting
    # the learning rate under it is no per-rank decision; a check inside the loop, after rank 0's save, still is
    result = port_source(_RESUME, "train.py")
    lines = {t.line: t.message for t in result.todos if "may differ between ranks" in t.message}
    assert set(lines) == {31}, lines
    assert "`break`" in lines[31], lines


_SAVE_AND_SAY = '''
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import network


output_dir = "out"
x = torch.randn(128, 4)
loader = DataLoader(TensorDataset(x, x), batch_size=16, shuffle=True)
net = nn.Linear(4, 4)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
step = 0
for xb, yb in loader:
    loss = nn.functional.mse_loss(net(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if step % 4 == 0:
        save_name = os.path.join(output_dir, "net_{}.h5".format(step))
        network.save_net(save_name, net)
        print("save model: {}".format(save_name))
'''


def test_a_print_that_names_the_file_rank_0_wrote_reads_nothing_back():
    result = port_source(_SAVE_AND_SAY, "train.py")
    assert not any("reads one back" in t.message for t in result.todos), result.todos


_FIRST_BATCH = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

train_set = TensorDataset(torch.randn(256, 4), torch.randn(256, 4))
test_set = TensorDataset(torch.randn(40, 4), torch.randn(40, 4))
train_loader = DataLoader(train_set, batch_size=16, shuffle=True)
test_loader = DataLoader(test_set, batch_size=16, shuffle=False)
dataiter = iter(test_loader)
test_images, _ = next(dataiter)
shown = next(iter(test_loader))[0]
first_train = next(iter(train_loader))
net = nn.Linear(test_images.shape[1], 4)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for epoch in range(2):
    for xb, yb in train_loader:
        loss = nn.functional.mse_loss(net(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for xb, yb in test_loader:
        print(nn.functional.mse_loss(net(xb), yb).item())
'''


def test_the_first_batch_of_an_evaluation_shard_taken_with_next_is_named():
    # each rank's evaluation shard holds whole batches in order: rank 0's first batch is the original's, another
    # rank's is another batch, and a rank whose shard is empty (fewer batches than ranks) raises StopIteration
    result = port_source(_FIRST_BATCH, "train.py")
    assert "ddpkit.eval_loader(test_set" in result.code
    todos = {t.line: t.message for t in result.todos if "StopIteration" in t.message}
    assert set(todos) == {10, 12}, result.todos
    assert "`iter(test_loader)`" in todos[10] and "test_loader.dataset" in todos[10]
