"""`ddpkit port`: every TODO the summary reports is written in the ported file (nested functions too)."""

from __future__ import annotations

from ddpkit.port import port_source
from ddpkit.port.codemod import TODO_MARK, Todo, open_todos

NESTED_STEP = '''
import json

import torch
import torch.nn as nn
from replay import Pool


def run(steps=10):
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    pool = Pool()

    def update(n):
        obs, picked, gain = pool.draw(n)
        values = net(obs)
        chosen = values.gather(1, picked.unsqueeze(1)).squeeze(1)
        loss = (chosen - gain).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(steps):
        update(8)


if __name__ == "__main__":
    with open("run.json") as fh:
        config = json.load(fh)
    run(**config)
'''


def test_a_todo_on_a_forward_in_a_nested_function_is_written_in_the_file_and_names_what_was_unpacked_with_it():
    result = port_source(NESTED_STEP)
    assert result.todos
    written = open_todos(result.code)
    for todo in result.todos:
        assert todo.message in {t.message for t in written}, todo.message
    cpu = next(t for t in written if "`obs` is made on the CPU" in t.message)
    assert result.code.splitlines()[cpu.line - 1].strip() == "values = net(obs)"
    assert "so are `picked`, `gain`, unpacked from the same call" in cpu.message


def test_a_planned_todo_the_rewrite_did_not_write_goes_at_the_top_naming_its_original_line():
    from ddpkit.port.codemod import _with_every_todo

    code = "#!/usr/bin/env python\nimport torch\n# TODO(ddpkit port): kept\nx = 1\n"
    out = _with_every_todo(code, [Todo(4, "kept"), Todo(9, "lost on the way")])
    assert out.splitlines()[:2] == ["#!/usr/bin/env python",
                                    f"# {TODO_MARK}: at line 9 of the original: lost on the way"]
    assert out.count("kept") == 1


def test_a_todo_planned_on_a_statement_the_rewrite_removes_is_written_before_the_next_one():
    result = port_source(
        "import argparse\nimport torch\nfrom torch.utils.data import DataLoader\n\n"
        "p = argparse.ArgumentParser()\np.add_argument('--gpu', type=int, default=0)\nargs = p.parse_args()\n"
        "torch.cuda.set_device(args.gpu)\n"
        "loader = DataLoader(torch.randn(8, 3), batch_size=4)\nnet = torch.nn.Linear(3, 1).cuda()\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x in loader:\n    opt.zero_grad()\n    net(x.cuda()).sum().backward()\n    opt.step()\n")
    assert result.todos
    written = {t.message: t.line for t in open_todos(result.code)}
    for todo in result.todos:  # in the file, at a statement of the port (not the fallback at the top)
        assert todo.message in written, todo.message
        assert result.code.splitlines()[written[todo.message] - 1].startswith("loader = ddpkit.loader(")
