"""DDP008 and a rank's own NaN/inf diagnostics: a message in the body of `if torch.isnan(loss):` is shown only by
the rank whose values went bad, not world_size times."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = """
    import torch
    import torch.distributed as dist


    def main():
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            x = torch.randn(4, 2)
            loss = model(x).pow(2).mean()
            if torch.isnan(x).any() or not torch.isfinite(loss):
                print("bad batch", x)  # the rank's own diagnostic
            opt.zero_grad()
            loss.backward()
            opt.step()
            print("step", step)  # every rank
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _lines(code: str) -> set[int]:
    return {f.line for f in lint_sources({"train.py": textwrap.dedent(code)}) if f.rule == "DDP008"}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line)


def test_a_message_under_a_nan_test_of_the_rank_s_own_values_is_its_own_diagnostic():
    assert _lines(_TRAIN) == {_line(_TRAIN, "# every rank")}


def test_a_message_under_a_test_that_the_values_are_finite_is_every_rank_s_output():
    healthy = _TRAIN.replace("if torch.isnan(x).any() or not torch.isfinite(loss):", "if torch.isfinite(loss):")
    assert _lines(healthy) == {_line(healthy, "# the rank's own"), _line(healthy, "# every rank")}
