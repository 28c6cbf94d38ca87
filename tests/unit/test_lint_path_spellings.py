"""Files named some relative to the working folder, some absolute, linted as one program."""

from __future__ import annotations

import os
import textwrap

from ddpkit.lint import lint_sources

TRAIN = textwrap.dedent('''\
    import torch
    import torch.distributed as dist
    from helpers import save

    dist.init_process_group("gloo")
    model = torch.nn.Linear(2, 2)
    save(model)
    dist.destroy_process_group()
''')
HELPERS = textwrap.dedent('''\
    import torch


    def save(model):
        torch.save(model.state_dict(), "model.pt")
''')


def test_a_mix_of_relative_and_absolute_paths_is_one_program_named_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    helpers = str(tmp_path / "pkg" / "helpers.py")
    train = os.path.join("pkg", "train.py")
    found = lint_sources({train: TRAIN, helpers: HELPERS})  # stopped: "Can't mix absolute and relative paths"
    absolute = lint_sources({str(tmp_path / train): TRAIN, helpers: HELPERS})
    assert found and [(f.path.replace(str(tmp_path / train), train), f.line, f.rule, f.message) for f in absolute] \
        == [(f.path, f.line, f.rule, f.message) for f in found]
    assert (helpers, 5, "DDP004") in [(f.path, f.line, f.rule) for f in found]
