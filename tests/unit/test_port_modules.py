"""What the script's own modules do to a port: heads whose output is thrown away, GPUs they pick themselves, and
the batch size the port divided for its loader that they still read as the batch's size."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from ddpkit.port import port_source

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


_TRAINS_NET = """

loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))), batch_size=8)
model = Net({args})
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
"""
"""The training of a class `Net` of the script (its arguments `args`), after its definition."""


def _todo_at(result, statement: str) -> str:
    lines = result.code.splitlines()
    found = [t.message for t in result.todos if t.in_output and lines[t.line - 1].strip() == statement]
    assert found, [(lines[t.line - 1].strip(), t.message[:80]) for t in result.todos]
    return found[0]


def test_a_module_whose_output_never_reaches_forwards_result_is_found_on_any_path():
    from ddpkit.port.weights import discarded_outputs

    tree = ast.parse((FIXTURES / "module_heads" / "nets.py").read_text())
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    assert [a for a, _ in discarded_outputs(classes["AuxNet"])] == ["side"]  # computed, transformed, dropped
    assert [a for a, _ in discarded_outputs(classes["ProbeNet"])] == ["probe"]  # a bare call's value
    assert discarded_outputs(classes["HeadsNet"]) == []  # through a list, a dict item and a helper method
    # through the methods forward calls: `_join(v, t)` returns what it makes of v alone, so tag's output is lost
    assert [a for a, _ in discarded_outputs(classes["JoinNet"])] == ["tag"]
    assert discarded_outputs(classes["JoinBothNet"]) == []  # its join keeps both (t given by keyword)


def test_a_model_class_of_another_module_with_a_thrown_away_head_is_wrapped_with_find_unused_parameters():
    path = FIXTURES / "module_heads" / "train.py"
    result = port_source(path.read_text(), str(path))
    assert result.exit_code == 0, result.todos  # slower, never wrong: not a TODO
    lines = result.code.splitlines()
    at = lines.index("model = ddpkit.wrap(model, ctx, find_unused_parameters=True)")
    # HeadsNet is built first (another branch): every class the name may be built by is read
    assert lines[at - 1].startswith("# ddpkit port: `ProbeNet` in nets.py (read, not ported) may leave self.probe")
    ast.parse(result.code)


def test_a_model_built_and_moved_in_one_line_then_wrapped_apart_is_read_for_unused_modules():
    path = FIXTURES / "module_heads" / "train_join.py"
    result = port_source(path.read_text(), str(path))
    assert result.exit_code == 0, result.todos
    lines = result.code.splitlines()
    at = lines.index("model = ddpkit.wrap(model, ctx, find_unused_parameters=True)")  # `JoinNet().to(device)`
    assert lines[at - 1].startswith("# ddpkit port: `JoinNet` in nets.py (read, not ported) may leave self.tag")


def test_a_thrown_away_head_of_the_scripts_own_class_gets_find_unused_parameters():
    source = textwrap.dedent("""\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.trunk = nn.Linear(4, 8)
                self.aux = nn.Linear(8, 2)
                self.out = nn.Linear(8, 2)

            def forward(self, x):
                h = self.trunk(x)
                _ = self.aux(h)
                return self.out(h)

    """) + _TRAINS_NET.format(args="")
    result = port_source(source)
    assert "ddpkit.wrap(Net(), ctx, find_unused_parameters=True)" in result.code
    assert "Net.forward throws away what self.aux computes" in result.code


def test_a_gpu_a_helper_module_picks_itself_is_a_todo_naming_its_file_and_line():
    path = FIXTURES / "helper_gpu" / "train.py"
    result = port_source(path.read_text(), str(path))
    assert result.exit_code == 3
    fit = _todo_at(result, "helpers.fit(net, loader, optimizer, 3)")
    assert "fit.py:10 `net.to(f'cuda:{gpu}'" in fit and "fit.py:14 `x.cuda(0)`" in fit
    assert "chooses a device of its own, not the rank's (ctx.device)" in fit
    evaluate = _todo_at(result, "ddpkit.print0(ctx, helpers.evaluate(net, x, y))")
    assert "fit.py:20 `x.to(DEVICE)` chooses a device of its own" in evaluate  # a module-level cuda:0 name


def test_a_helper_handed_nothing_that_changed_still_may_not_pick_gpu_0(tmp_path):
    (tmp_path / "prep.py").write_text(textwrap.dedent("""\
        import torch


        def load_features():
            device = torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')
            return torch.randn(64, 4).to(device), torch.randn(64, 1).to(device)
    """))
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from prep import load_features

        features, labels = load_features()
        loader = DataLoader(TensorDataset(features.cpu(), labels.cpu()), batch_size=8, shuffle=True)
        net = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            optimizer.step()
    """))
    result = port_source(script.read_text(), str(script))
    todo = _todo_at(result, "features, labels = load_features()")
    assert todo.startswith("not checked: `load_features` in prep.py (read, not ported) runs on every rank")
    assert "prep.py:5 `torch.device('cuda:0' if" in todo


def test_the_batch_size_the_port_divided_read_by_another_module_is_a_todo():
    path = FIXTURES / "split_settings" / "train.py"
    result = port_source(path.read_text(), str(path))
    assert "batch_size=conf.BATCH // ctx.world_size" in result.code
    trainer = _todo_at(result, "trainer = Trainer(conf)")
    assert "gan.py:15 reads `self.options.BATCH`, the global batch size the port divided" in trainer  # handed
    assert "gan.py:17 reads `conf.BATCH`, the global batch size the port divided" in trainer  # imported there
    assert "NOISE" not in trainer and "LR" not in trainer  # other settings are no batch size


def test_a_divided_batch_size_handed_to_a_helper_that_shapes_tensors_with_it_is_a_todo():
    path = FIXTURES / "split_settings" / "train_name.py"
    result = port_source(path.read_text(), str(path))
    noise = _todo_at(result, "noise = gan.noise_for(batch_size)")
    assert "gan.py:25 shapes a tensor with `count` (the global batch size the port divided" in noise


def test_a_throwaway_name_does_not_link_a_discarded_branch_to_the_result():
    """`a_out, _ = self.enc_a(a)` then `b_out, _ = self.enc_b(b)`: the `_` both bind carries nothing to the return."""
    import ast

    from ddpkit.port.weights import discarded_outputs

    source = (
        "import torch.nn as nn\n\n\n"
        "class TwoInputs(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.words = nn.Embedding(50, 8)\n"
        "        self.enc_a = nn.GRU(8, 8, batch_first=True)\n"
        "        self.enc_b = nn.LSTM(4, 8, batch_first=True)\n"
        "        self.head = nn.Linear(8, 1)\n\n"
        "    def forward(self, tokens, signal):\n"
        "        a_in = self.words(tokens)\n"
        "        a_out, _ = self.enc_a(a_in)\n"
        "        b_out, _ = self.enc_b(signal)\n"
        "        return self.head(b_out)\n"
    )
    (cls,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    assert [attr for attr, _ in discarded_outputs(cls)] == ["words", "enc_a"]
    used = source.replace("return self.head(b_out)", "return self.head(b_out + a_out)")
    (cls,) = [n for n in ast.parse(used).body if isinstance(n, ast.ClassDef)]
    assert discarded_outputs(cls) == []


def test_a_class_imported_from_a_module_folder_the_project_puts_on_sys_path_is_read(tmp_path):
    # `from solver import Solver` where solver/ is a package without the name: the project runs with its module
    # folders on PYTHONPATH, so solver/solver.py is what the script imports, and the model it is handed is the
    # DDP wrapper, which has no `package` method
    for folder in ("bin", "solver"):
        (tmp_path / folder).mkdir()
    (tmp_path / "solver" / "__init__.py").write_text("")
    (tmp_path / "solver" / "solver.py").write_text(textwrap.dedent("""\
        import torch


        class Solver:
            def __init__(self, loader, model, optimizer):
                self.loader = loader
                self.model = model
                self.optimizer = optimizer

            def run(self, epochs):
                for epoch in range(epochs):
                    for x, y in self.loader:
                        loss = torch.nn.functional.mse_loss(self.model(x), y)
                        self.optimizer.zero_grad()
                        loss.backward()
                        self.optimizer.step()
                    state = self.model.package(self.model)
    """))
    script = tmp_path / "bin" / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        from solver import Solver


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)

            def forward(self, x):
                return self.fc(x)

            @staticmethod
            def package(model):
                return {"state_dict": model.state_dict()}


        def main():
            loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16, shuffle=True)
            model = Net()
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            solver = Solver(loader, model, optimizer)
            solver.run(2)


        if __name__ == "__main__":
            main()
    """))
    result = port_source(script.read_text(), str(script))
    todo = _todo_at(result, "solver = Solver(loader, model, optimizer)")
    assert todo.startswith("not checked: `Solver` in solver.py (read, not ported) gets the loader, model")
    assert "solver.py:17 `self.model.package` is no attribute of the DDP wrapper" in todo
    assert result.exit_code == 3


def test_a_module_found_twice_off_the_scripts_folder_is_not_guessed(tmp_path):
    from ddpkit.port.localcode import path_module

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "solver.py").write_text("class Solver:\n    pass\n")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "tools.py").write_text("def helper():\n    pass\n")
    assert path_module(str(tmp_path), "solver", "Solver") is None  # two candidates: a guess
    assert path_module(str(tmp_path), "tools", "helper") == str(tmp_path / "c" / "tools.py")
    assert path_module(str(tmp_path), "tools", "other") is None  # the file does not define the name


def _nested_unused(name: str) -> list[tuple[str, str, int]]:
    """What ddpkit.port.untrained finds unused in a class of nested_blocks/blocks.py wrapped as the model."""
    from ddpkit.port.untrained import unused_wraps

    blocks = FIXTURES / "nested_blocks" / "blocks.py"
    module = ast.parse(blocks.read_text())
    defs = {n.name: n for n in module.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    tree = ast.parse(f"model = ddpkit.wrap({name}(3), ctx)")
    found = unused_wraps(tree, {}, lambda cls: (str(blocks), cls, defs[cls]) if cls in defs else None,
                         lambda n, where: (str(blocks), defs[n]) if n in defs else None)
    return [note for _, note in found]


def test_layers_a_nested_class_builds_but_never_calls_are_found_through_helpers_and_sequential():
    # PlainNet -> Trunk(PlainBlock, ...) -> self._stage(block, ...) -> nn.Sequential(*[block(...), ...])
    notes = _nested_unused("PlainNet")
    assert len(notes) == 1 and "may leave PlainBlock.norm (blocks.py:14) without gradient" in notes[0]
    # the same trunk of blocks that call every layer: nothing (the class bound to `block` decides)
    assert _nested_unused("NormNet") == []
    # a class the model builds and calls holds a layer its own forward never calls
    notes = _nested_unused("HeadNet")
    assert len(notes) == 1 and "Head.spare (blocks.py:51)" in notes[0] and "NormBlock" not in notes[0]
    # forward picks among the instances it holds (self.heads[task]): which run is not known, so no claim
    assert _nested_unused("PickNet") == []
    # forward runs another method of the nested class (`self.coder.encode(x)`): its forward says nothing of that
    assert _nested_unused("CodeNet") == []
    # GatedBlock's forward never names self.proj, but the base's forward it runs (`super().forward(x)`) does
    assert _nested_unused("GatedNet") == []


def test_a_model_whose_nested_blocks_skip_a_layer_is_wrapped_with_find_unused_parameters():
    path = FIXTURES / "nested_blocks" / "train.py"
    result = port_source(path.read_text(), str(path))
    lines = result.code.splitlines()
    at = lines.index("model = ddpkit.wrap(model, ctx, find_unused_parameters=True)")
    # plain_net(3), a builder of the project, is seen through to PlainNet, then to the blocks its trunk builds
    assert lines[at - 1].startswith("# ddpkit port: `PlainNet` in blocks.py (read, not ported) may leave "
                                    "PlainBlock.norm (blocks.py:14)")
    assert result.exit_code == 0, result.todos
    ast.parse(result.code)


def test_a_scripts_own_model_class_building_blocks_that_skip_a_layer_gets_find_unused_parameters(tmp_path):
    source = textwrap.dedent("""\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        class Block(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.lin = nn.Linear(width, width)
                self.norm = nn.LayerNorm(width)

            def forward(self, x):
                return torch.relu(self.lin(x))  # self.norm(...) switched off

        class Net(nn.Module):
            def __init__(self, width, depth):
                super().__init__()
                self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
                self.out = nn.Linear(width, 2)

            def forward(self, x):
                return self.out(self.blocks(x))

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
        loader = DataLoader(data, batch_size=8, shuffle=True)
        model = Net(4, 2).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        """)
    path = tmp_path / "train.py"
    path.write_text(source)
    result = port_source(source, str(path))
    assert "find_unused_parameters=True" in result.code, result.code
    assert "`Net` in this file may leave Block.norm (this file:10)" in result.code  # a line of the output
    assert result.exit_code == 0, result.todos


def port_project(tmp_path, files: dict[str, str], script: str):
    """Writes a small project (its modules and main.py) under tmp_path and ports main.py (also used by other tests)."""
    tmp_path.mkdir(exist_ok=True)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    path = tmp_path / "main.py"
    path.write_text(textwrap.dedent(script))
    return port_source(path.read_text(), str(path))


_LOOP = """\
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
"""


def test_a_layer_class_the_models_class_builds_that_pins_cuda_0_in_its_forward_is_a_todo(tmp_path):
    layers = """\
        import torch


        class Scale(torch.nn.Module):
            def __init__(self, n):
                super().__init__()
                self.w = torch.nn.Parameter(torch.ones(1, n))

            def forward(self, x):
                return x * torch.ones(x.size(1)).to('cuda:0') * self.w
    """
    nets = """\
        import torch
        from layers import Scale


        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = Scale(4)
                self.out = torch.nn.Linear(4, 1)

            def forward(self, x):
                return self.out(self.scale(x))
    """
    script = "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom nets import Net\n\n" \
             "net = Net()\n" + textwrap.dedent(_LOOP)
    result = port_project(tmp_path, {"layers.py": layers, "nets.py": nets}, script)
    todo = _todo_at(result, "net = ddpkit.wrap(Net(), ctx)")
    # the pin is two classes away, in another module: named at the script's line that builds the model
    assert todo.startswith("not checked: `Net` in nets.py (read, not ported) runs on every rank")
    assert "layers.py:10 `torch.ones(x.size(1)).to('cuda:0')` chooses a device of its own" in todo
    # "cuda" (the current device, the rank's after ddpkit.init) is no pin
    result = port_project(tmp_path, {"layers.py": layers.replace("'cuda:0'", "'cuda'"), "nets.py": nets}, script)
    assert not [t for t in result.todos if "not checked" in t.message], [t.message for t in result.todos]


def test_a_factory_that_wraps_in_data_parallel_through_its_helpers_is_a_todo(tmp_path):
    factory = """\
        import torch


        def _build(width):
            net = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 1))
            return torch.nn.DataParallel(net).cuda()


        def create(width):
            return _build(width)
    """
    script = "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom models import factory\n\n" \
             "net = factory.create(8)\n" + textwrap.dedent(_LOOP)
    result = port_project(tmp_path, {"models/__init__.py": "", "models/factory.py": factory}, script)
    todo = _todo_at(result, "net = ddpkit.wrap(factory.create(8), ctx)")
    assert "factory.py:6 `torch.nn.DataParallel(net)` wraps in nn.DataParallel" in todo


def test_settings_that_make_a_folder_named_from_the_clock_on_every_rank_are_a_todo(tmp_path):
    settings = """\
        import argparse
        import os
        from datetime import datetime


        def get_args():
            args = argparse.ArgumentParser().parse_args([])
            args.log_dir = os.path.join('runs', datetime.now().strftime('%m%d%H%M%S'))
            os.makedirs(args.log_dir, exist_ok=False)
            os.makedirs('checkpoints', exist_ok=True)
            return args
    """
    script = "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom settings import get_args\n\n" \
             "args = get_args()\nnet = torch.nn.Linear(4, 1)\n" + textwrap.dedent(_LOOP)
    result = port_project(tmp_path, {"settings.py": settings}, script)
    todo = _todo_at(result, "args = get_args()")
    assert "settings.py:9 `os.makedirs(...)` on every rank, at a path made from the clock (`datetime.now()`)" in todo
    assert "settings.py:10" not in todo  # a fixed folder with exist_ok=True: every rank may make it
    # without the clock, exist_ok=False still fails on the rank that comes second
    plain = settings.replace("datetime.now().strftime('%m%d%H%M%S')", "'latest'")
    todo = _todo_at(port_project(tmp_path, {"settings.py": plain}, script), "args = get_args()")
    assert "settings.py:9 `os.makedirs(...)` writes or downloads on every rank" in todo
    # a mkdir whose failure the code lets pass is fine; one whose failure ends the rank is not
    caught = plain.replace("os.makedirs(args.log_dir, exist_ok=False)\n", "try:\n" + " " * 16 + "os.makedirs("
                           "args.log_dir)\n" + " " * 12 + "except OSError:\n" + " " * 16 + "{}\n")
    ast.parse(textwrap.dedent(caught))
    result = port_project(tmp_path / "passes", {"settings.py": caught.format("pass")}, script)  # a folder each: the
    assert not [t for t in result.todos if "settings.py" in t.message], [t.message for t in result.todos]  # port
    todo = _todo_at(port_project(tmp_path / "quits", {"settings.py": caught.format("quit()")}, script),  # reads each
                    "args = get_args()")  # module once per path
    assert "settings.py:10 `os.makedirs(...)` writes or downloads on every rank" in todo


def test_a_class_that_turns_its_device_argument_into_cuda_0_and_moves_itself_there_is_a_todo(tmp_path):
    nets = """\
        import torch


        class Net(torch.nn.Module):
            def __init__(self, device='cpu'):
                super().__init__()
                if device != 'cpu':
                    device = 'cuda:0'
                self.device = device
                self.out = torch.nn.Linear(4, 1)
                self.to(self.device)

            def forward(self, x):
                return self.out(x)
    """
    script = "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom nets import Net\n\n" \
             "net = Net(device='gpu')\n" + textwrap.dedent(_LOOP)
    result = port_project(tmp_path, {"nets.py": nets}, script)
    # `device = 'cuda:0'`, then self.device = device: GPU 0 on every rank, beside ddpkit.wrap's cuda:local_rank
    todo = _todo_at(result, "net = ddpkit.wrap(Net(device='gpu'), ctx)")
    assert "nets.py:11 `self.to(self.device)` chooses a device of its own" in todo
    # a device the class reads as it is handed (no GPU of its own) is no pin
    result = port_project(tmp_path, {"nets.py": nets.replace("device = 'cuda:0'", "pass")}, script)
    assert not [t for t in result.todos if "not checked" in t.message], [t.message for t in result.todos]


def test_a_module_forward_never_reads_but_the_loss_uses_outside_forward_is_named(tmp_path):
    # weight tying in the loss (an adaptive softmax over the decoder's weight), the decoder unused in forward
    (tmp_path / "lm.py").write_text(textwrap.dedent("""\
        from torch import nn


        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Linear(4, 4)
                self.decoder = nn.Linear(4, 3)

            def forward(self, x):
                return self.body(x)
        """))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        import torch.nn.functional as F
        from torch.utils.data import DataLoader, TensorDataset
        from lm import LM

        model = LM()
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,))), batch_size=8, shuffle=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            logits = F.linear(model(x), model.decoder.weight, model.decoder.bias)
            F.cross_entropy(logits, y).backward()
            optimizer.step()
        """))
    result = port_source(script.read_text(), str(script))
    assert "ctx, find_unused_parameters=True)" in result.code
    message = _todo_at(result, "logits = F.linear(model(x), ddpkit.unwrap(model).decoder.weight, "
                               "ddpkit.unwrap(model).decoder.bias)")
    assert "outside the model's forward" in message and "(lm.py:8)" in message and "ready a second time" in message


def test_a_module_read_in_every_branch_of_forward_is_no_unused_parameter():
    source = textwrap.dedent("""\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset


        class Net(nn.Module):
            def __init__(self, ngpu):
                super().__init__()
                self.ngpu = ngpu
                self.main = nn.Linear(4, 2)
                self.extra = nn.Linear(4, 2)

            def forward(self, x):
                if x.is_cuda and self.ngpu > 1:
                    out = nn.parallel.data_parallel(self.main, x, range(self.ngpu))
                else:
                    out = self.main(x)
                return out

    """) + _TRAINS_NET.format(args="1")
    result = port_source(source)
    assert "self.main" not in "".join(line for line in result.code.splitlines() if "ddpkit port" in line)
    assert "ddpkit.wrap(Net(1), ctx, find_unused_parameters=True)" in result.code  # self.extra: never read
    only_main = port_source(source.replace("        self.extra = nn.Linear(4, 2)\n", "")).code
    assert "find_unused_parameters" not in only_main  # self.main is read whichever branch runs
