"""`ddpkit port` keeps the program whole: a statement it puts on rank 0 takes along what it needs and what needs it."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import runpy
import sys
from pathlib import Path

from ddpkit.port import port_source

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


def _run(path: Path, args: list[str], monkeypatch) -> dict:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "argv", [str(path), *args])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(path), run_name="__main__")
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_a_guarded_write_takes_its_with_and_a_guarded_tracker_takes_its_later_uses(tmp_path, monkeypatch):
    source = FIXTURES / "rank0_bindings.py"
    result = port_source(source.read_text(), str(source))
    assert result.exit_code == 0, result.todos
    code = result.code
    # the file is opened where it is written: on rank 0 (the others would truncate it)
    assert '    if ctx.is_main:\n        with (out_dir / "weights.pkl").open("wb") as fh:\n            pickle.dump(' in code
    assert code.count("if ctx.is_main:") == 4, code  # the writer, its add_scalar, the with, its close
    # the writer exists on rank 0 only: module-level code after the main block closes it there only
    assert code.endswith("if args.record:\n    if ctx.is_main:\n        events.close()\n")
    ported = tmp_path / "rank0_bindings_ddp.py"
    ported.write_text(code)
    monkeypatch.chdir(tmp_path)
    mse = _run(ported, ["--out", str(tmp_path), "--record"], monkeypatch)["mse"]
    assert mse < 1.0
    weights = pickle.loads((tmp_path / "weights.pkl").read_bytes())
    assert set(weights) == {"weight", "bias"}


def test_a_use_of_a_rank_0_name_the_port_cannot_guard_is_a_todo():
    source = '''import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter

if __name__ == "__main__":
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    tb = SummaryWriter()
    for xb, yb in DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=8):
        loss = ((net(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        tb.add_scalar("loss", loss.item())

where = tb.log_dir
'''
    result = port_source(source, "script.py")
    assert result.exit_code == 3
    assert any("`tb` is bound on rank 0 only" in t.message and t.line == 16 for t in result.todos), result.todos
    assert "\n        tb.add_scalar(" not in result.code  # the use inside the loop is guarded


def test_a_path_objects_open_takes_the_mode_first():
    source = '''import pickle
from pathlib import Path
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.Adam(net.parameters())
    for xb, yb in DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=8):
        loss = ((net(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    target = Path("run").joinpath("net.pkl")
    with target.open(mode="wb") as handle:
        pickle.dump(net, handle)
    with Path("run", "net.txt").open("w") as text:
        text.write(str(net))
    print("wrote the text and the handle: %f" % 1.0)  # names in a string are no reads of them


if __name__ == "__main__":
    main()
'''
    result = port_source(source, "script.py")
    assert result.exit_code == 0, result.todos
    code = result.code
    assert "        if ctx.is_main:\n            with target.open(mode=\"wb\") as handle:\n                pickle.dump(" in code
    assert "        if ctx.is_main:\n            with Path(\"run\", \"net.txt\").open(\"w\") as text:\n                text.write(" \
        in code
    assert code.count("if ctx.is_main:") == 2, code  # not again around the write inside


def test_an_imported_module_rebound_to_the_model_is_read_as_the_module_on_the_right():
    source = '''import argparse
import torch
from torch.utils.data import DataLoader, TensorDataset
import nets

parser = argparse.ArgumentParser()
parser.add_argument("--arch", default="Small")
args = parser.parse_args()
if hasattr(nets, args.arch):
    nets = getattr(nets, args.arch)(2)
opt = torch.optim.SGD(nets.parameters(), lr=0.1)
for xb, yb in DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=8):
    loss = ((nets(xb) - yb) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(getattr(nets, "weight").shape)
'''
    code = port_source(source, "script.py").code
    assert "    nets = ddpkit.wrap(getattr(nets, args.arch)(2), ctx)\n" in code or (
        "    nets = getattr(nets, args.arch)(2)\n" in code and "nets = ddpkit.wrap(nets, ctx)" in code), code
    assert "hasattr(nets, args.arch)" in code  # before the assignment: the module
    assert 'getattr(ddpkit.unwrap(nets), "weight")' in code  # after it: the model


_ALIAS = '''import argparse
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true")
parser.add_argument("--many", action="store_true")
args = parser.parse_args()
device = torch.device("cuda" if args.cuda else "cpu")
net = nn.Linear(2, 1)
net.apply(lambda m: None)
if args.many:
    net = net.to(device)
    runner = nn.DataParallel(net).to(device)
else:
    runner = net.to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.1)


def fit(loader):
    for xb, yb in loader:
        loss = ((runner(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


fit(DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=8))
'''


def test_a_name_for_the_model_bound_before_its_wrap_and_called_in_training_is_a_todo():
    result = port_source(_ALIAS, "script.py")
    assert result.exit_code == 3
    bypass = [t for t in result.todos if "`runner` is bound to `net` before" in t.message]
    assert [t.line for t in bypass] == [15, 17], result.todos
    # `if args.many: net = net.to(device)` moves it to a device the script chose by --cuda: --many is no GPU switch
    assert 'device="auto" if args.many' not in result.code


def test_the_name_a_moved_model_came_from_is_an_alias_of_the_wrapped_one():
    """`m = model.to(device)` returns `model` itself: with `m` wrapped (the optimizer reads it), a training forward
    through `model` bypasses DDP."""
    source = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Linear(2, 1)
m = model.to(device)
opt = torch.optim.SGD(m.parameters(), lr=0.1)


def fit(loader):
    for xb, yb in loader:
        loss = ((model(xb.to(device)) - yb.to(device)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


fit(DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=8))
"""
    result = port_source(source, "script.py")
    assert result.exit_code == 3
    assert [t.line for t in result.todos if "`m = model.to(...)` returns `model` itself" in t.message] == [7], result.todos


def test_a_name_for_the_model_bound_after_its_wrap_is_the_wrapper():
    source = _ALIAS.replace("opt = torch.optim.SGD(net.parameters(), lr=0.1)\n", "").replace(
        "net.apply(lambda m: None)\n", "net.apply(lambda m: None)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n")
    result = port_source(source, "script.py")
    assert not [t for t in result.todos if "bypasses DDP" in t.message], result.todos


def test_an_entry_function_called_with_the_parsed_arguments_after_a_global_is_the_training_entry():
    source = '''import argparse
import torch
from torch.utils.data import DataLoader, TensorDataset


def fit(opts):
    global lowest
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=opts.lr)
    for xb, yb in DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=8):
        loss = ((net(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        lowest = min(lowest, loss.item())


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=0.1)
    lowest = 1e9
    fit(p.parse_args())
'''
    result = port_source(source, "script.py")
    assert result.exit_code == 0, result.todos
    assert "def fit(opts):\n    with ddpkit.init() as ctx:\n" in result.code  # not refused: fit is the entry
    assert "lowest = 1e9\n    fit(p.parse_args())\n" in result.code


def test_an_entry_function_that_trains_through_helpers_is_found_beside_the_parser_it_is_called_with():
    source = '''import argparse
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_optimizer(net, lr):
    return torch.optim.SGD(net.parameters(), lr=lr)


def one_epoch(net, batches, opt):
    for xb, yb in batches:
        loss = ((net(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def make_batches():
    return DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=8)


def run(args):
    batches = make_batches()
    net = torch.nn.Linear(2, 1)
    opt = make_optimizer(net, args.lr)
    for _ in range(args.epochs):
        one_epoch(net, batches, opt)


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=1)
    return p.parse_args()


if __name__ == "__main__":
    run(get_args())
'''
    # run's own body names no optimizer nor backward: the helpers it calls do; the parser is never the entry
    result = port_source(source, "script.py")
    assert result.exit_code == 0, result.todos
    assert "def run(args):\n    with ddpkit.init() as ctx:\n" in result.code
    assert "def get_args():\n    p = argparse.ArgumentParser()\n" in result.code


_FIRST_BATCH = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(2))
        self.ready = False

    def forward(self, x):
        if not self.ready:
            self.shift.data.copy_(-x.mean(0))
            self.ready = True
        return x + self.shift


def train(net, opt, loader):
    for step, (xb, yb) in enumerate(loader):
        if step == 0:
            with torch.no_grad():
                net(xb)
        out = net(xb).sum(1, keepdim=True)
        loss = ((out - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def main():
    net = nn.Sequential(Scale(), nn.Linear(2, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    train(net, opt, DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=8))


if __name__ == "__main__":
    main()
'''


def test_a_forward_for_its_effect_on_the_first_step_is_a_data_dependent_init_todo():
    result = port_source(_FIRST_BATCH, "script.py")
    assert result.exit_code == 3
    assert any("data-dependent initialisation" in t.message and t.line == 23 for t in result.todos), result.todos


def test_a_first_step_look_at_the_output_is_no_initialisation():
    source = _FIRST_BATCH.replace("                net(xb)\n", "                print(net(xb).mean().item())\n")
    result = port_source(source, "script.py")
    assert not [t for t in result.todos if "data-dependent" in t.message], result.todos


def test_a_training_function_nothing_in_the_file_calls_is_ported_with_a_todo_naming_it():
    source = '''import argparse
import torch
from torch.utils.data import DataLoader, TensorDataset


def helper(n):
    return torch.randn(n, 2), torch.randn(n, 1)


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    for xb, yb in DataLoader(TensorDataset(*helper(8)), batch_size=8):
        loss = ((net(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
'''
    result = port_source(source, "cli.py")  # started by a console script: no `if __name__ == "__main__":`
    assert result.exit_code == 3
    assert [t.line for t in result.todos if "nothing in this file calls `run()`" in t.message] == [14], result.todos
    assert "    args = parser.parse_args()\n    with ddpkit.init() as ctx:\n" in result.code


def test_a_loop_over_a_rank_0_figure_whose_every_line_draws_runs_on_rank_0():
    source = '''import matplotlib.pyplot as plt
import torch
from torch.utils.data import DataLoader, TensorDataset


def show(samples):
    grid, cells = plt.subplots(2, 2)
    for cell, image in zip(cells.flatten(), samples):
        cell.axis("off")
        cell.imshow(image.numpy())
    plt.savefig("grid.png")


if __name__ == "__main__":
    net = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for xb, yb in DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 4)), batch_size=8):
        loss = ((net(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    show(torch.randn(4, 2, 2))
'''
    result = port_source(source, "script.py")
    assert result.exit_code == 0, result.todos
    assert "    if ctx.is_main:\n        for cell, image in zip(cells.flatten(), samples):\n            cell.axis(" in \
        result.code
