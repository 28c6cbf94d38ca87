"""A name stored into itself (a parameter bound to an argument of the same name through `mp.spawn`) is followed
once: linting such a program used to end in a RecursionError."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_SPAWNED = textwrap.dedent("""
    import os

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def make_dirs(root):
        model_dir = os.path.join(root, "model.pth")
        return root, model_dir


    def worker(rank, model_dir):
        dist.init_process_group("gloo", rank=rank, world_size=2)
        model = torch.nn.Linear(4, 1)
        torch.save(model.state_dict(), model_dir)
        dist.destroy_process_group()


    if __name__ == "__main__":
        log_dir, model_dir = make_dirs("runs")
        mp.spawn(worker, args=(model_dir,), nprocs=2)
""")


def test_a_path_handed_to_a_spawned_worker_under_its_own_name_is_linted_without_recursing():
    saves = [f for f in lint_sources({"train.py": _SPAWNED}) if f.rule == "DDP004"]
    # every rank saves to the same path: reported, and not mistaken for an in-memory buffer
    assert [(f.line, f.severity) for f in saves] == [(17, "error")]


def test_two_names_assigned_from_each_other_end():
    source = _SPAWNED.replace('log_dir, model_dir = make_dirs("runs")',
                              'a = "x"\n    b = a\n    a = b\n    model_dir = a')
    assert any(f.rule == "DDP004" for f in lint_sources({"train.py": source}))
