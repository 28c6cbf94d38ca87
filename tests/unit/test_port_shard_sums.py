"""Sums a port reduces after a loop over a sharded loader: per-step values keep the original's scale, counts add up."""

from __future__ import annotations

from pathlib import Path

from ddpkit.port import port_source

FIXTURES = Path(__file__).parents[1] / "fixtures" / "port"


def test_an_undivided_sum_of_step_losses_is_averaged_over_ranks_and_a_count_made_under_an_if_is_summed():
    code = port_source((FIXTURES / "loss_sum_report.py").read_text(), "loss_sum_report.py").code
    loss = code.index("epoch_loss = (ddpkit.all_reduce_sum(ctx, epoch_loss) / ctx.world_size).item()")
    right = code.index("right = int(ddpkit.all_reduce_sum(ctx, right).item())")
    assert loss < code.index("ddpkit.print0(ctx, json.dumps(") and right < code.index("ddpkit.print0(ctx, json.dumps(")


_IN_LOOP = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
loader = DataLoader(data, batch_size=8, shuffle=True)
model = torch.nn.Linear(4, 2)
opt = torch.optim.Adam(model.parameters())
for epoch in range(2):
    hits = 0
    share = 0.0
    for xb, yb in loader:
        out = model(xb)
        loss = torch.nn.functional.cross_entropy(out, yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        for guess, truth in zip(out.argmax(1), yb):
            if guess == truth:
                hits += 1
        share = hits / len(data)
    print(f"epoch {epoch} accuracy {share:.3f}")
'''


def test_a_figure_computed_inside_the_loop_from_a_running_count_is_a_todo_not_a_claim():
    result = port_source(_IN_LOOP, "in_loop.py")
    assert result.exit_code == 3
    assert any("`share` used here is computed inside the loop" in t.message for t in result.todos)


def test_a_sum_divided_by_its_count_after_the_loop_is_still_summed():
    """The count is reduced too (`/ all_reduce_sum(len(loader))`): a mean over ranks here would divide twice."""
    code = port_source((FIXTURES / "epoch_loss_mean.py").read_text(), "epoch_loss_mean.py").code
    assert "epoch_loss = ddpkit.all_reduce_sum(ctx, epoch_loss).item()  # sum over every rank's shard" in code
    assert "/ ctx.world_size).item()" not in code


_HELPERS = '''
import torch
from torch.utils.data import DataLoader, TensorDataset


def step(model, opt, xb, yb):
    out = model(xb)
    loss = torch.nn.functional.cross_entropy(out, yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss, out


def count_right(out, yb):
    return int((out.argmax(1) == yb).sum())


data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
loader = DataLoader(data, batch_size=8, shuffle=True)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    total = 0.0
    hits = 0
    for xb, yb in loader:
        loss, out = step(model, opt, xb, yb)
        total += loss.item()
        hits += count_right(out, yb)
    print(epoch, total, hits)
'''


def test_a_loss_a_helper_backpropagates_and_returns_is_a_step_value_and_a_helpers_count_is_a_sum():
    code = port_source(_HELPERS, "helpers.py").code
    assert "total = (ddpkit.all_reduce_sum(ctx, total) / ctx.world_size).item()" in code
    assert "hits = ddpkit.all_reduce_sum(ctx, hits)" in code
    assert "ddpkit.all_reduce_sum(ctx, hits) / ctx.world_size" not in code


def test_the_last_batch_loss_reported_after_the_training_loop_is_averaged_over_ranks_or_named():
    # after the loop `loss` holds this rank's last batch only: printed where every rank passes it is the mean over
    # the ranks (computed on every rank, before rank 0 prints); on a branch ranks may take differently, a TODO
    source = (FIXTURES / "last_batch_loss.py").read_text()
    result = port_source(source, "last_batch_loss.py")
    assert 'ddpkit.print0(ctx, f"loss: {(ddpkit.all_reduce_sum(ctx, loss) / ctx.world_size).item()}")' in result.code
    line = next(i for i, s in enumerate(source.splitlines(), 1) if "last batch loss once it fits" in s)
    [todo] = [t for t in result.todos if "last training batch" in t.message]
    assert todo.line == line and "`loss`" in todo.message and "ported fully" not in result.message


def test_sums_a_model_keeps_on_itself_and_hands_back_through_a_method_are_named():
    # forward() adds this rank's batches into self.totals; epoch_totals() hands them back as the epoch's figure
    source = (FIXTURES / "model_held_sums.py").read_text()
    result = port_source(source, "model_held_sums.py")
    line = next(i for i, s in enumerate(source.splitlines(), 1) if "model.epoch_totals(" in s)
    summed = next(i for i, s in enumerate(source.splitlines(), 1) if 'self.totals["mse"] +=' in s)
    [todo] = [t for t in result.todos if "summed on itself" in t.message]
    assert todo.line == line and f"`self.totals`, line {summed}" in todo.message, todo.message
    assert "ported fully" not in result.message and result.exit_code == 3


_BATCH_WEIGHTED = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
for epoch in range(2):
    running_loss = 0
    for xb, yb in DataLoader(data, batch_size=8):
        loss = ((model(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        running_loss += loss.item() * xb.size(0)
    print(running_loss / len(data))
'''


def test_a_mean_loss_times_the_batch_size_is_summed_as_a_number_not_truncated_to_an_int():
    """`running_loss = 0` then `+= loss.item() * xb.size(0)`: the product is a float; `int(...)` of the reduced sum
    would print 0.0 for a loss below 1 per sample. A keyword named like a function of the script (`train=False`)
    hands no function to the call."""
    result = port_source(_BATCH_WEIGHTED, "train.py")
    assert "running_loss = ddpkit.collectives.all_reduce_number(ctx, running_loss)" in result.code
    assert "int(ddpkit.all_reduce_sum(ctx, running_loss)" not in result.code
    assert result.exit_code == 0, result.todos
    # `def train(model, opt)` steps the optimizer it is handed (a call on a parameter, as a search library's trial
    # object is asked for settings); `MNIST(..., train=False)` still hands it nothing
    named = _BATCH_WEIGHTED.replace("model = nn.Linear(2, 1)\n", "def train(model, opt):\n    loss = model(torch.ones(1, 2)).sum()\n"
                                    "    loss.backward()\n    opt.step()\n\n\nmodel = nn.Linear(2, 1)\n").replace(
        "DataLoader(data, batch_size=8)", "DataLoader(torchvision.datasets.MNIST('.', train=True), batch_size=8)").replace(
        "import torch\n", "import torch\nimport torchvision\n", 1)
    assert not [t for t in port_source(named, "train.py").todos if "is handed `train`" in t.message]


def test_a_loss_summed_over_the_batch_times_the_batch_size_is_a_todo():
    """Per rank that adds (sum over batch_size // world_size samples) x (batch_size // world_size): over the ranks,
    1/world_size of the original's figure."""
    source = _BATCH_WEIGHTED.replace("loss = ((model(xb) - yb) ** 2).mean()",
                                     "loss = ((model(xb) - yb) ** 2).sum()")
    result = port_source(source, "train.py")
    assert result.exit_code == 3
    assert [t.line for t in result.todos if "already sums over the batch" in t.message] == [15], result.todos


_BY_DATASET = '''
import torch
from torch.utils.data import DataLoader, TensorDataset


def train(model, loader, opt):
    running = 0.0
    seen = 0
    for xb, yb in loader:
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        running += loss.item()
        seen += 1
    running /= len(loader.dataset)
    print(f"loss {running:.5f} over {seen} steps")
    return running / {divisor}


def main():
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = torch.nn.Linear(4, 2)
    train(model, loader, torch.optim.Adam(model.parameters()))


if __name__ == "__main__":
    main()
'''


def test_a_sum_of_step_losses_divided_by_the_datasets_size_is_averaged_over_ranks_not_summed():
    # `len(loader.dataset)` is the whole dataset on every rank, not a count the port reduces: the per-step sum it
    # divides is still the mean over ranks (summed, the printed loss was world_size times the original's)
    code = port_source(_BY_DATASET.replace("{divisor}", "100"), "by_dataset.py").code
    assert "running = (ddpkit.all_reduce_sum(ctx, running) / ctx.world_size).item()" in code
    # a division by a count of this rank's steps still sums, and so does the count
    counted = port_source(_BY_DATASET.replace("running /= len(loader.dataset)", "running /= seen").replace(
        "{divisor}", "1"), "by_steps.py").code
    assert "running = ddpkit.all_reduce_sum(ctx, running).item()" in counted
    assert "seen = int(ddpkit.all_reduce_sum(ctx, seen).item())" in counted  # `running /= seen`: every rank's steps


def test_a_loader_handed_to_a_prefetcher_of_another_file_is_no_figure_to_reduce_but_an_evaluation_is():
    source = ("import torch\nfrom torch.utils.data import DataLoader\nfrom helpers import DataPrefetcher, evaluate\n\n\n"
              "def main():\n    model = torch.nn.Linear(4, 4)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              "    train_loader = DataLoader(list(range(8)), batch_size=4, shuffle=True)\n"
              "    test_loader = DataLoader(list(range(8)), batch_size=4)\n"
              "    prefetcher = DataPrefetcher(train_loader)\n    batch = prefetcher.next()\n"
              "    while batch is not None:\n        opt.zero_grad()\n        model(batch).sum().backward()\n"
              "        opt.step()\n        batch = prefetcher.next()\n    acc = evaluate(model, test_loader)\n"
              "    print(acc)\n\n\nif __name__ == '__main__':\n    main()\n")
    todos = [t.message for t in port_source(source, "prefetched.py").todos if "defined outside this file" in t.message]
    # a prefetcher hands back the loader's batches; an evaluation hands back a figure of this rank's shard
    assert [m.split(" comes from")[0] for m in todos] == ["not checked: `acc`"], todos
    # a function named for what it scores over a loader still hands back a figure
    scored = port_source(source.replace("DataPrefetcher", "score_loader"), "scored.py").todos
    assert [t.message.split(" comes from")[0] for t in scored if "defined outside this file" in t.message] == [
        "not checked: `prefetcher`", "not checked: `acc`"]
