"""`ddpkit port` on losses summed over the batch, and on per-rank figures a helper returns or shows."""

from __future__ import annotations

import ast
from pathlib import Path

from ddpkit.port import port_source

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


def _port(name: str):
    path = FIXTURES / f"{name}.py"
    return port_source(path.read_text(), str(path))


def test_a_loss_summed_over_the_batch_is_scaled_by_the_world_size_at_backward_only():
    result = _port("summed_loss")
    code = result.code
    assert result.exit_code == 0, result.todos
    ast.parse(code)
    # a criterion whose reduction is a module constant, passed in, plus a helper's size_average=False and torch.sum
    assert "        (loss * ctx.world_size).backward()\n" in code
    assert "        (err * ctx.world_size).backward()\n" in code  # a hand-written .sum() over the batch
    # means stay as they are: a mean loss, and a sum divided by this rank's own batch size
    assert "        mean_err.backward()\n" in code and "        per_sample.backward()\n" in code
    assert code.count("* ctx.world_size).backward()") == 2
    # the reported value is the script's own: only backward() sees the scaled loss
    assert "total += loss.item()" in code and "size_average=False" in code.split("(loss * ctx.world_size)")[0]
    note = code.split("        (loss * ctx.world_size).backward()")[0].rsplit("\n", 2)[-2]
    assert "# ddpkit port: `loss` sums over the batch" in note and "L1Loss(reduction=REDUCTION)" in note


def test_a_reduction_chosen_at_run_time_or_summed_and_averaged_terms_together_are_todos():
    result = _port("summed_loss_unclear")
    todos = {t.line: t.message for t in result.todos}
    assert result.exit_code == 3 and set(todos) == {28, 33}, todos
    assert "`fit`" in todos[28] and "args.reduction" in todos[28] and "chosen at run time" in todos[28]
    assert "`both` adds terms summed over the batch" in todos[33] and 'reduction="sum"' in todos[33]
    assert "ctx.world_size).backward()" not in result.code  # nothing scaled where the port cannot tell


def test_a_returned_mean_of_a_sum_named_like_a_counter_is_reduced_and_a_shared_pass_report_is_a_todo():
    result = _port("shard_returns")
    code = result.code
    todos = {t.line: t.message for t in result.todos}
    # `loss_epoch += loss.item()` is a sum of this rank's losses, not a step counter: reduced, and divided by every
    # rank's batches, before it is returned
    reduced = code.index("loss_epoch = ddpkit.collectives.all_reduce_number(ctx, loss_epoch)")
    assert reduced < code.index("loss_epoch /= ddpkit.all_reduce_sum(ctx, len(batches)).item()") \
        < code.index("return loss_epoch")
    # the running mean shown in the postfix comes from a pass over both loaders: no collective fits there
    assert result.exit_code == 3 and set(todos) == {33}, todos
    assert "`seen_loss` sums this rank's shard" in todos[33] and "evaluation loader" in todos[33]


def test_a_loss_from_the_projects_own_module_that_sums_is_named():
    path = FIXTURES / "summed_elsewhere" / "train.py"
    result = port_source(path.read_text(), str(path))
    todos = {t.line: t.message for t in result.todos}
    assert result.exit_code == 3 and set(todos) == {38}, todos  # the line of `total.backward()` in the port
    assert "`total` reaches backward() from `BoxAndClassLoss` in criteria.py" in todos[38]
    assert "criteria.py:8 `size_average=False`" in todos[38]
    assert "ctx.world_size).backward()" not in result.code


def test_a_summed_loss_under_amp_and_one_with_backward_options_are_scaled():
    result = _port("summed_loss_amp")
    # `print(loss.item())` after the loop: this rank's last batch, summed over batch_size // world_size samples
    assert result.exit_code == 3 and [t.line for t in result.todos] == [27], result.todos
    assert "last training batch only (the port scales it as a sum" in result.todos[0].message
    assert "(scaler.scale(loss) * ctx.world_size).backward()" in result.code
    assert "(extra * ctx.world_size).backward(retain_graph=True)" in result.code
    assert "loss.item())" in result.code and "loss * ctx.world_size).item" not in result.code  # the figure: the loss


def test_a_summed_loss_printed_as_the_epochs_figure_is_a_todo_a_per_sample_mean_of_it_is_not():
    code = (
        "import torch\nimport torch.nn.functional as F\n\n\ndef main():\n"
        "    data = torch.utils.data.TensorDataset(torch.rand(64, 4), torch.rand(64, 4))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)\n"
        "    model = torch.nn.Linear(4, 4)\n    opt = torch.optim.Adam(model.parameters())\n"
        "    for epoch in range(2):\n        for x, y in loader:\n            opt.zero_grad()\n"
        "            loss = F.mse_loss(model(x), y, reduction='sum')\n            loss.backward()\n"
        "            opt.step()\n            print('per sample', loss.item() / len(x))\n"
        "        print('Epoch {} Loss: {:.4f}'.format(epoch, loss.item()))\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    result = port_source(code, "summed_print.py")
    assert "(loss * ctx.world_size).backward()" in result.code
    # rank 0's last batch, summed over batch_size // world_size samples: about 1/world_size of the original's figure
    [todo] = [t for t in result.todos if "reported here" in t.message]
    assert todo.line == 17 and "ddpkit.all_reduce_sum(ctx, loss.detach())" in todo.message


def _project_loss(tmp_path: Path, returned: str):
    """A script whose criterion is a class of its project summing the batch's terms, returning `returned`."""
    (tmp_path / "boxloss.py").write_text(
        "import torch\nfrom torch import nn\nimport torch.nn.functional as F\n\n\n"
        "class BoxLoss(nn.Module):\n"
        "    def forward(self, pred, target):\n"
        "        pos = target > 0\n"
        "        num_pos = pos.sum().item()\n"
        "        loc = F.smooth_l1_loss(pred[pos], target[pos], size_average=False)\n"
        f"        loss = {returned}\n"
        "        return loss\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "from boxloss import BoxLoss\n\n"
        "model = nn.Linear(4, 4)\ncriterion = BoxLoss()\n"
        "loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 4)), batch_size=8, shuffle=True)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in loader:\n"
        "    optimizer.zero_grad()\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n")
    return port_source(script.read_text(), str(script))


def test_a_project_loss_summed_and_divided_by_its_own_count_is_no_scaling_todo(tmp_path):
    summed = _project_loss(tmp_path, "loc")
    assert [t for t in summed.todos if "reduces a loss by a sum" in t.message], summed.todos
    for divided in ("loc / num_pos", "(loc + 0.5 * loc) / max(num_pos, 1)", "loc.div(num_pos)"):
        result = _project_loss(tmp_path, divided)
        assert not [t for t in result.todos if "reduces a loss by a sum" in t.message], (divided, result.todos)
    fixed = _project_loss(tmp_path, "loc / 4.0")  # a fixed number: still a sum over the batch
    assert [t for t in fixed.todos if "reduces a loss by a sum" in t.message], fixed.todos


def test_batch_means_weighted_by_a_constant_vector_and_summed_over_it_stay_means():
    # `torch.sum(torch.mul(weight, mean_loss))` sums over the weight vector's terms, not over the batch: no TODO, no
    # scaling (a "multiply by world_size" there would scale the step N-fold); a weighted sum of per-sample squares
    # still sums over the batch and is scaled
    result = _port("weighted_terms")
    code = result.code
    assert not any("summed over the batch" in t.message or "reduces over the batch" in t.message
                   for t in result.todos), result.todos
    assert "            loss.backward()\n" in code
    assert "            (total * ctx.world_size).backward()\n" in code
