"""DDP001 is not asked of a loader the program passes over once: one iterator made outside any loop and taken with
next() in a step loop (a dataset sized to the run's steps). Made again when it runs out, it is a second pass."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_ONE_PASS = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler


    def main(num_steps=1000):
        dist.init_process_group("gloo")
        data = TensorDataset(torch.randn(num_steps * 8, 4), torch.randn(num_steps * 8, 1))
        sampler = DistributedSampler(data)
        loader = DataLoader(data, batch_size=8, sampler=sampler)
        loader_iter = enumerate(loader)
        model = DDP(torch.nn.Linear(4, 1))
        for step in range(num_steps):
            _, (x, y) = next(loader_iter)
            for part in range(2):  # two micro-batches per step
                (model(x[part::2]) - y[part::2]).pow(2).mean().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _ddp001(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": textwrap.dedent(source)}) if f.rule == "DDP001"]


def test_one_iterator_taken_with_next_is_one_pass_and_needs_no_set_epoch():
    assert _ddp001(_ONE_PASS) == []
    assert _ddp001(_ONE_PASS.replace("loader_iter = enumerate(loader)", "loader_iter = iter(loader)").replace(
        "_, (x, y) = next(loader_iter)", "x, y = next(loader_iter)")) == []


def test_an_iterator_made_again_when_it_runs_out_is_a_second_pass():
    again = _ONE_PASS.replace("            _, (x, y) = next(loader_iter)\n", (
        "            try:\n"
        "                _, (x, y) = next(loader_iter)\n"
        "            except StopIteration:\n"
        "                loader_iter = enumerate(loader)\n"
        "                _, (x, y) = next(loader_iter)\n"))
    assert _ddp001(again) == [12]


def test_a_loader_iterated_by_an_epoch_loop_still_needs_set_epoch():
    epochs = _ONE_PASS.replace("        loader_iter = enumerate(loader)\n", "").replace(
        "        for step in range(num_steps):\n            _, (x, y) = next(loader_iter)\n",
        "        for epoch in range(3):\n            for x, y in loader:\n                pass\n")
    assert "for x, y in loader:" in epochs
    assert _ddp001(epochs) == [12]


def test_an_iterator_made_in_a_function_called_every_epoch_is_not_one_pass():
    per_call = _ONE_PASS.replace("        main()", "        for epoch in range(3):\n            main()")
    assert _ddp001(per_call) == [12]
