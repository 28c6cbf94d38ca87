"""`ddpkit port`: a GPU the script's own modules pick themselves (`cuda:0`, the same on every rank) and then put
tensors on, or hand back to the script, is a TODO that names the file and line of each use."""

from __future__ import annotations

import textwrap

from ddpkit.port import port_source

_TRAIN = """\
import torch
{imports}


def main():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.ones(8, 4), torch.zeros(8, dtype=torch.long)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


if __name__ == "__main__":
    main()
"""


def _port(tmp_path, imports: str, files: dict[str, str]):
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    script = tmp_path / "train.py"
    script.write_text(_TRAIN.format(imports=imports))
    return port_source(script.read_text(), str(script))


def _pinned(result) -> list:
    return [t for t in result.todos if "GPU 0 on every rank" in t.message]


def test_a_module_level_gpu_of_a_settings_module_used_inside_the_projects_functions_is_named_with_each_use(tmp_path):
    result = _port(tmp_path, "import settings\nfrom layers import Head\nfrom batches import *", {
        "settings.py": """\
            import torch

            device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
            width = 4
            """,
        "layers.py": """\
            import torch
            import settings


            class Head(torch.nn.Module):
                def forward(self, x):
                    start = torch.zeros(x.size(0), settings.width).to(settings.device)
                    return x + start
            """,
        "batches.py": """\
            import torch

            spare = 'cuda:1'
            device = 'cuda:0'


            def collate(items):
                return torch.stack(items).to(device)
            """})
    [settings, batches] = sorted(_pinned(result), key=lambda t: t.line)
    lines = result.code.splitlines()
    assert lines[settings.line - 1] == "import settings"
    assert "settings.py:3 `device = torch.device(\"cuda:0\" if" in settings.message
    assert "layers.py:7" in settings.message
    assert lines[batches.line - 1] == "from batches import *"
    # the GPU name the code uses, not the first one bound (`spare` is never used)
    assert "batches.py:4 `device = 'cuda:0'`" in batches.message and "batches.py:8" in batches.message
    assert "\"cuda\"" in settings.message  # what to do: the current device, which ddpkit.init makes the rank's


def test_a_project_function_that_hands_back_gpu_0_is_named_at_the_scripts_call(tmp_path):
    result = _port(tmp_path, "from helpers import pick_device\n\ndevice, ids = pick_device(1)", {
        "helpers.py": """\
            import torch


            def pick_device(n_gpu):
                device = torch.device('cuda:0' if n_gpu > 0 else 'cpu')
                return device, list(range(n_gpu))
            """})
    [todo] = _pinned(result)
    assert result.code.splitlines()[todo.line - 1] == "device, ids = pick_device(1)"
    assert "`pick_device` returns" in todo.message and "helpers.py:5" in todo.message
    assert "ctx.device" in todo.message


def test_the_current_gpu_a_shadowed_name_and_a_gpu_nothing_uses_are_not_named(tmp_path):
    result = _port(tmp_path, "import settings\nfrom batches import collate\nfrom helpers import pick_device", {
        "settings.py": """\
            import os
            import torch

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            spare = "cuda:1"
            own = f"cuda:{os.environ['LOCAL_RANK']}"
            """,
        "batches.py": """\
            import torch
            import settings

            device = 'cuda:0'


            def collate(items, device):
                return torch.stack(items).to(device).to(settings.device).to(settings.own)
            """,
        "helpers.py": """\
            import torch


            def pick_device(n_gpu):
                return torch.device('cuda' if n_gpu > 0 else 'cpu')
            """})
    assert _pinned(result) == []
