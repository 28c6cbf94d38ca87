"""Lists an evaluation loop fills over its shard: joined across ranks after the loop, or a TODO naming what stops it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ddpkit.port import port_source

FIXTURES = Path(__file__).parents[1] / "fixtures" / "port"
_JOIN = "{0} = ddpkit.gather_list(ctx, {0})  # every rank's entries, joined in rank order"


def test_lists_and_a_concatenated_tensor_of_an_evaluation_loop_are_joined_after_it():
    result = port_source((FIXTURES / "eval_lists.py").read_text(), "eval_lists.py")
    code = result.code
    assert result.exit_code == 0 and result.todos == [], result.todos
    ast.parse(code)
    joins = "\n".join(f"        {_JOIN.format(n)}" for n in ("losses", "predicted", "truth", "scores"))
    # after the loop, at its indentation (inside `with torch.no_grad():`), before the first use
    assert f"            scores = torch.cat([scores, out.softmax(1)[:, 1]])\n{joins}\n    model.train()" in code
    assert "all_reduce_sum" not in code  # counts made from the joined lists are every rank's already
    # the decision to stop reads the joined accuracy: the same on every rank, no TODO


def _eval_script(loop: str, after: str = "    print(np.mean(xs))\n", head: str = "",
                 loader: str = "DataLoader(val_ds, batch_size=8)") -> str:
    return ("import numpy as np\nimport torch\nfrom torch.utils.data import DataLoader\n\n\n"
            f"def main():\n    train_loader = DataLoader(train_ds, batch_size=8, shuffle=True)\n"
            f"    val_loader = {loader}\n    model = Net()\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    for x, y in train_loader:\n        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n"
            f"{head}    xs = []\n{loop}{after}\n\nif __name__ == '__main__':\n    main()\n")


@pytest.mark.parametrize(("loop", "after", "head", "blocker"), [
    ("    for i, (x, y) in enumerate(val_loader):\n        name = f'sample{i}.wav'\n        xs.append(name)\n", "",
     "", "its entries depend on `i` (through `name`), which counts or sums this rank's own batches"),
    ("    for x, y in val_loader:\n        xs.append(model(x).mean().item())\n        print(np.mean(xs))\n", "", "",
     "`xs` is read inside the loop (line 18)"),
    ("    for x, y in val_loader:\n        xs.append(y)\n        if len(y) < 8:\n            break\n", "", "",
     "the loop may stop before the end of the shard (`break`, line 19)"),
    ("    for i, (x, y) in enumerate(val_loader):\n        xs.append(model(x).sum().item())\n",
     "    print(sum(xs) / (i + 1))\n", "", "line 18 reads it with `i`, this rank's own count or sum"),
    ("    for x, y in val_loader:\n        xs.append(y)\n", "    for x, y in val_loader:\n        xs.append(y)\n"
     "    print(xs)\n", "", "`xs` is filled again after the loop (line 19)"),
    ("    if loss.item() < 0.5:\n        for x, y in val_loader:\n            xs.append(y)\n", "", "",
     "`loss.item() < 0.5` (line 16) may differ between ranks"),
    ("    for k, (a, b) in enumerate(val_loader):\n        xs = []\n        for x, y in val_loader:\n            xs.append(y)\n"
     "        print(len(xs))\n", "", "", "it sits inside another loop over an evaluation loader (line 16)"),
], ids=["entry_from_batch_index", "read_inside", "break", "divided_by_own_count", "filled_again", "per_rank_branch",
        "inside_an_evaluation_loop"])
def test_a_list_the_port_cannot_follow_keeps_a_todo_naming_why(loop, after, head, blocker):
    result = port_source(_eval_script(loop, after or "    print(np.mean(xs))\n", head))
    todo = min((t for t in result.todos if t.message.startswith("`xs` collects values")), key=lambda t: t.line)
    assert "the port does not join it across ranks: " + blocker in todo.message, todo.message
    assert "ddpkit.gather_list(ctx, xs)  #" not in result.code


def test_a_list_filled_over_several_runs_of_an_outer_loop_keeps_a_todo():
    src = _eval_script("    for epoch in range(3):\n        for x, y in val_loader:\n            xs.append(y)\n")
    (todo,) = [t for t in port_source(src).todos if t.message.startswith("`xs` collects values")]
    assert "starts empty outside the loop around this one (line 16)" in todo.message


def test_an_evaluation_dataloader_that_drops_its_last_batch_keeps_a_todo():
    src = _eval_script("    for x, y in val_loader:\n        xs.append(y)\n",
                       loader="DataLoader(val_ds, batch_size=8, drop_last=True)")
    (todo,) = [t for t in port_source(src).todos if t.message.startswith("`xs` collects values")]
    assert "drops its last batch (line 8)" in todo.message


def test_a_loop_run_over_both_loaders_and_a_training_list_keep_their_todos():
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n\ndef run(model, loader, opt=None):\n"
           "    outs = []\n    for x, y in loader:\n        out = model(x)\n        if opt is not None:\n"
           "            out.sum().backward()\n            opt.step()\n        outs.append(out)\n"
           "    return torch.cat(outs)\n\n\ndef main():\n    train_loader = DataLoader(train_ds, batch_size=8, shuffle=True)\n"
           "    val_loader = DataLoader(val_ds, batch_size=8)\n    model = Net()\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    losses = []\n    for x, y in train_loader:\n"
           "        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n        losses.append(loss.item())\n"
           "    print(sum(losses))\n    run(model, train_loader, opt)\n    print(run(model, val_loader).mean())\n\n\n"
           "if __name__ == '__main__':\n    main()\n")
    result = port_source(src)
    todos = {t.message.split("`")[1]: t.message for t in result.todos if "collects values" in t.message}
    assert "the same loop also runs over the training loader" in todos["outs"]
    # a training loader's shard is padded: as before, no join
    assert todos["losses"].endswith("or ddpkit.all_gather_object for lists)") and "does not join" not in todos["losses"]
    assert "gather_list" not in result.code.replace("ddpkit.gather_list(ctx, outs)`", "")


def test_a_tensor_concatenated_in_a_training_loop_is_named():
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n\ndef main():\n"
           "    loader = DataLoader(ds, batch_size=8, shuffle=True)\n    model = Net()\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    seen = torch.tensor([])\n"
           "    for x, y in loader:\n        model(x).sum().backward()\n        opt.step()\n"
           "        seen = torch.cat([seen, y])\n    print(seen.float().mean())\n\n\n"
           "if __name__ == '__main__':\n    main()\n")
    (todo,) = port_source(src).todos
    assert todo.line == 13 and todo.message.startswith("`seen` concatenates values over this rank's shard")


def test_a_joined_list_divided_by_the_loaders_length_counts_every_ranks_batches():
    code = port_source(_eval_script("    for x, y in val_loader:\n        xs.append(model(x).sum().item())\n",
                                    "    print(sum(xs) / len(val_loader))\n")).code
    assert "        xs = ddpkit.gather_list(ctx, xs)" in code
    assert "sum(xs) / ddpkit.all_reduce_sum(ctx, len(val_loader)).item()" in code


def test_a_set_and_a_dicts_entries_keep_a_todo_naming_them():
    src = _eval_script("    ids = set()\n    out = {'p': []}\n    for x, y in val_loader:\n        ids |= set(y.tolist())\n"
                       "        out['p'].append(model(x))\n        xs.append(y)\n", "    print(ids, out, xs)\n")
    todos = {t.line: t.message for t in port_source(src).todos}
    assert "the port does not join it across ranks: `ids` is a set, which has no order to join in" in todos[19]
    assert "`out[...]` is an entry of a dict (or a list of lists)" in todos[20]
    assert set(todos) == {19, 20}  # `xs` beside them is joined


def test_a_tensor_started_as_none_and_concatenated_in_the_loop_is_named_for_the_metric_after_it():
    # `xs = None`, then `if xs is None: xs = out` / `else: xs = torch.cat(...)`: the first batch starts it; a rank
    # with no batch would keep None, so it is named rather than joined
    loop = ("    for x, y in val_loader:\n        out = model(x)\n"
            "        if xs is None:\n            xs = out\n            ys = y\n        else:\n"
            "            xs = torch.cat((xs, out), dim=0)\n            ys = torch.cat((ys, y), dim=0)\n")
    source = _eval_script(loop, after="    print(f1_score(ys.cpu(), xs.argmax(1).cpu()))\n").replace(
        "    xs = []\n", "    xs, ys = None, None\n")
    result = port_source(source, "script.py")
    code = result.code
    named = [t for t in result.todos if t.message.startswith("`xs` concatenates values over this rank's shard")]
    assert len(named) == 1 and "starts as None (line 15)" in named[0].message, result.todos
    assert "ddpkit.gather_list(ctx, xs)" in named[0].message and _JOIN.format("xs") not in code
    assert [t for t in result.todos if t.message.startswith("`ys` concatenates values over this rank's shard")]
