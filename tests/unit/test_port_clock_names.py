"""A file name made from the clock on every rank, written by rank 0 alone, then stored in an object every rank hands
to code the port cannot see into: each rank hands on its own name (a TODO at the name)."""

from __future__ import annotations

import textwrap

from ddpkit.port import port_source

_TRAIN = """\
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in DataLoader(torch.randn(32, 4), batch_size=8, shuffle=True):
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()"""
"""A few steps of training, put into each script below at its indentation."""
_SCRIPT = """\
    import argparse
    import os
    from datetime import datetime

    import torch
    from torch.utils.data import DataLoader
    from evaluation import main as evaluate


    def main(args):
{train8}
        path = os.path.join("ckpt", f"net_{datetime.now().strftime('%H%M%S')}.pth")
        torch.save(model.state_dict(), path)
        print(f"saved to {path}")
        args.eval_from = path
        {last}


    if __name__ == "__main__":
        main(argparse.ArgumentParser().parse_args())
""".replace("{train8}", textwrap.indent(_TRAIN, " " * 8))


def test_a_clock_named_file_rank_0_writes_handed_on_in_an_object_is_a_todo():
    result = port_source(textwrap.dedent(_SCRIPT.replace("{last}", "evaluate(args)")))
    found = [t.message for t in result.todos if t.message.startswith("`path` is built from `datetime.now()`")]
    assert found and "hands it on in `args.eval_from` to `evaluate(...)`" in found[0], \
        [t.message[:80] for t in result.todos]


def test_an_object_holding_it_only_printed_is_left_alone():
    result = port_source(textwrap.dedent(_SCRIPT.replace("{last}", "print(args)")))
    assert not any("datetime.now()" in t.message for t in result.todos), [t.message[:80] for t in result.todos]


_DEFAULTS = """\
    import argparse
    import time

    import torch
    from torch.utils.data import DataLoader

    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1111)
    stamp = "".join(str(time.time()).split("."))
    parser.add_argument("--save", type=str, default=stamp + ".pt")
    parser.add_argument("--note", type=str, default="run")
    args = parser.parse_args()

{train4}
    torch.save(model.state_dict(), args.save)
    model.load_state_dict(torch.load(args.save))
""".replace("{train4}", textwrap.indent(_TRAIN, " " * 4))


def test_a_command_line_default_built_from_the_clock_is_a_todo_at_its_option():
    # a run that does not pass --save names a file per rank: rank 0 saves under its name, the others load theirs
    result = port_source(textwrap.dedent(_DEFAULTS))
    found = [t.message for t in result.todos if "default is built from" in t.message]
    assert len(found) == 1 and found[0].startswith("`--save`'s default is built from `time.time()`"), found
    assert "broadcast_object(ctx, args.save)" in found[0]
    assert [t.line for t in result.todos if "default is built from" in t.message] == [10]  # the --save option
