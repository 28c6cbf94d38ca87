"""`ddpkit port` and what happens to the model after ddpkit.wrap: wrapped once, its parameters fixed, every trained
parameter inside a wrapper, and its weight files read back with the keys they were written with."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ddpkit.port import port_source

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


def _port(name: str):
    path = FIXTURES / f"{name}.py"
    return port_source(path.read_text(), str(path))


def _port_text(text: str):
    return port_source(textwrap.dedent(text), "script.py")


def test_a_model_trained_by_a_function_that_runs_every_epoch_is_wrapped_once_before_the_loop():
    result = _port("wrap_per_epoch")
    code = result.code
    assert result.todos == [], result.todos  # nor a "bound again" TODO on build()'s own local `net`
    # not inside train(): its second call would wrap the DDP wrapper again
    assert code.count("ddpkit.wrap(") == 1 and "global net" not in code
    assert code.index("net = ddpkit.wrap(net, ctx)\nfor epoch in range(3):") > code.index("def train(epoch):")


def test_a_wrap_that_would_run_again_in_a_function_is_a_todo_where_it_cannot_be_placed_once():
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        net = nn.Linear(4, 1)


        def train(epoch):
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1 / (epoch + 1))
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(net(x), y).backward()
                optimizer.step()


        def run():
            for epoch in range(3):
                train(epoch)


        run()
    ''')
    assert not any(line.strip().startswith("net = ddpkit.wrap") for line in result.code.splitlines())
    [todo] = [t for t in result.todos if "runs again" in t.message]
    assert todo.line == 11 and "the call at line 20" in todo.message and "built (line 7)" in todo.message


def test_a_model_rebuilt_from_the_trained_one_in_a_loop_is_a_todo_and_a_fresh_model_per_pass_is_wrapped():
    result = _port("prune_loop")
    assert not any(line.strip().startswith("model = ddpkit.wrap") for line in result.code.splitlines())
    # (beside the CPU-only TODO of a port that wraps no model and names no device)
    [todo] = [t for t in result.todos if "keeps every rank on the CPU" not in t.message]
    assert len(result.todos) == 2 and todo.line == 28 and "built again from another module in the loop at line 26 (line 27)" in todo.message
    fresh = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        for lr in (0.1, 0.01):
            model = nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
    ''')
    assert fresh.todos == [] and "    model = ddpkit.wrap(nn.Linear(4, 1), ctx)\n" in fresh.code


def test_requires_grad_changed_after_the_wrap_is_a_todo_and_a_freeze_before_it_is_not():
    result = _port("warmup_freeze")
    assert [t.line for t in result.todos] == [28, 30]
    assert all("requires_grad on parameters of the wrapped `model` after ddpkit.wrap" in t.message
               for t in result.todos)
    before = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        for p in model[0].parameters():
            p.requires_grad = False
        optimizer = torch.optim.SGD(model[1].parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    ''')
    assert not any("requires_grad" in t.message for t in before.todos), before.todos


def test_parameters_added_to_the_optimizer_apart_from_the_wrapped_model_are_named():
    result = _port("loss_proxies")
    [todo] = result.todos
    assert todo.line == 33 and "also trains `criterion`, which is not inside a wrapped model" in todo.message
    bare = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        model = nn.Linear(4, 2)
        centers = nn.Parameter(torch.zeros(1, 2))
        optimizer = torch.optim.SGD(list(model.parameters()) + [centers], lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            ((model(x) - centers) ** 2).mean().backward()
            optimizer.step()
    ''')
    assert [t.line for t in bare.todos] == [9] and "trains `centers`" in bare.todos[0].message


def test_a_parameter_the_forward_reads_only_under_a_flag_wraps_with_find_unused_parameters():
    result = _port("flagged_parameter")
    assert result.todos == [], result.todos
    assert "model = ddpkit.wrap(Net(learn_scale=False), ctx, find_unused_parameters=True)" in result.code


def test_a_model_kept_by_a_project_class_and_saved_by_its_helper_is_named_with_the_strict_false_load():
    path = FIXTURES / "trainer_pkg" / "train.py"
    result = port_source(path.read_text(), str(path))
    lines = result.code.splitlines()
    by_call = {lines[t.line - 1].strip(): t.message for t in result.todos if t.in_output}
    fitter = by_call["fitter = Fitter(model, optimizer)"]
    assert fitter.startswith("not checked: `Fitter` in fit.py")  # through the package's __init__.py
    assert "fit.py:21 `save_weights(self.model, path)` hands the model to `save_weights`: store.py:8 " \
           "`model.state_dict()` of the wrapped model" in fitter
    load = by_call['best = load_weights("weights.pt")']
    assert "loads a checkpoint with strict=False (store.py:13)" in load


def test_a_project_class_whose_forward_may_leave_a_parameter_unused_gets_find_unused_parameters(tmp_path):
    (tmp_path / "nets.py").write_text(textwrap.dedent('''\
        import torch
        import torch.nn as nn


        class Blocks(nn.Module):
            def __init__(self, learn_eps, pool):
                super().__init__()
                self.learn_eps, self.pool = learn_eps, pool
                self.eps = nn.Parameter(torch.zeros(1))
                self.lin = nn.Linear(4, 1)

            def mixed(self, x):
                return self.lin(x) * (1 + self.eps)

            def plain(self, x):
                return self.lin(x)

            def forward(self, x):
                if self.learn_eps:
                    return self.mixed(x)
                elif self.pool:
                    return self.plain(x.relu())
                else:
                    return self.plain(x)
    '''))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset
        from nets import Blocks

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        model = Blocks(False, True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    '''))
    result = port_source(script.read_text(), str(script))
    assert result.todos == [] and "model = ddpkit.wrap(Blocks(False, True), ctx, find_unused_parameters=True)" in result.code
    [note] = [line for line in result.code.splitlines() if line.startswith("# ddpkit port: `Blocks` in nets.py")]
    # self.lin is read in every branch: only self.eps may go without a gradient
    assert "may leave self.eps (nets.py:9) without gradient" in note and "self.lin" not in note


def test_weights_drawn_again_after_the_wrap_are_a_todo_and_other_applies_are_not():
    path = FIXTURES / "reinit_after_wrap.py"
    result = port_source(path.read_text(), str(path))
    lines = path.read_text().splitlines()
    flagged = sorted({lines[t.line - 1].strip() for t in result.todos if "draws the weights" in t.message})
    # inside the runs loop, after the wrap placed before it: reset_parameters and an init function that draws
    assert flagged == ["model.apply(init_weights)", "model.reset_parameters()"], result.todos
    assert len([t for t in result.todos if "draws the weights" in t.message]) == 2  # not the apply before the wrap
    assert result.exit_code == 3


def test_a_model_moved_on_a_one_line_if_is_read_without_a_crash():
    # `if use_gpu: model = model.cuda()` puts the rebinding in a one-line suite: the port raised KeyError there
    src = textwrap.dedent("""\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader

        def main(use_gpu=False):
            loader = DataLoader(ds, batch_size=32, shuffle=True)
            model = nn.Linear(4, 2)
            if use_gpu: model = model.cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()

        if __name__ == "__main__":
            main()
        """)
    result = port_source(src)
    assert "ddpkit.wrap(model, ctx)" in result.code


_EMA_NETS = '''\
    import copy

    import torch.nn as nn


    class Averaged(nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net
            self.ema = copy.deepcopy(net)
            {freeze}

        @torch.no_grad()
        def update_ema(self, decay=0.99):
            for e, p in zip(self.ema.parameters(), self.net.parameters()):
                e.mul_(decay).add_(p, alpha=1 - decay)

        def sample(self, x):
            return self.ema(x)

        def forward(self, x, y):
            return nn.functional.mse_loss(self.net(x), y)
'''
_EMA_BUILD = '''\
    import torch.nn as nn
    from lib.nets import Averaged


    def build(width):
        model = Averaged(nn.Linear(width, 1))
        return model
'''
_EMA_SCRIPT = '''\
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from lib import build

    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
    model = build.build(4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        model(x, y).backward()
        optimizer.step()
        model.update_ema()
'''


def _ema_project(tmp_path, freeze: str):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "nets.py").write_text(textwrap.dedent(_EMA_NETS).replace("{freeze}", freeze))
    (tmp_path / "lib" / "build.py").write_text(textwrap.dedent(_EMA_BUILD))
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "train.py"  # run from the project's root: `lib` is beside scripts/, not in it
    script.write_text(textwrap.dedent(_EMA_SCRIPT))
    return port_source(script.read_text(), str(script))


def test_an_ema_copy_a_project_builder_returns_inside_the_model_gets_find_unused_parameters(tmp_path):
    result = _ema_project(tmp_path, "")
    # forward never calls self.ema, whose parameters require grad: DDP fails at the second step without it
    assert "model = ddpkit.wrap(build.build(4), ctx, find_unused_parameters=True)" in result.code
    assert "`Averaged` in nets.py (read, not ported) may leave self.ema (nets.py:10)" in result.code


def test_a_frozen_ema_copy_needs_no_find_unused_parameters(tmp_path):
    result = _ema_project(tmp_path, "self.ema.requires_grad_(False)")
    # DDP leaves parameters that require no gradient out when it wraps: nothing waits for them
    assert "model = ddpkit.wrap(build.build(4), ctx)" in result.code and "find_unused_parameters" not in result.code


def test_a_frozen_ema_copy_of_the_scripts_own_class_needs_no_find_unused_parameters():
    nets = textwrap.dedent(_EMA_NETS).replace("{freeze}", "for p in self.ema.parameters():\n"
                                              "            p.requires_grad = False")
    script = textwrap.dedent(_EMA_SCRIPT).replace("from lib import build\n", "").replace(
        "model = build.build(4)", "model = Averaged(torch.nn.Linear(4, 1))")
    result = port_source(f"import torch\n{nets}\n\n{script}", "train.py")
    assert "model = ddpkit.wrap(Averaged(torch.nn.Linear(4, 1)), ctx)" in result.code
    assert "find_unused_parameters" not in result.code


def test_lengths_a_project_models_forward_packs_as_is_get_a_todo_at_the_wrap(tmp_path):
    (tmp_path / "seq.py").write_text(textwrap.dedent('''\
        import torch.nn as nn


        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(10, 4)
                self.rnn = nn.GRU(4, 4, batch_first=True)

            def forward(self, tokens, lengths):
                packed = nn.utils.rnn.pack_padded_sequence(self.emb(tokens), lengths, batch_first=True,
                                                           enforce_sorted=False)
                return self.rnn(packed)[1][-1]


        class Tagger(nn.Module):
            def __init__(self):
                super().__init__()
                self.enc = Encoder()
                self.out = nn.Linear(4, 2)

            def forward(self, tokens, lengths):
                return self.out(self.enc(tokens, lengths))
    '''))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset
        from seq import Tagger

        data = TensorDataset(torch.randint(1, 10, (32, 5)), torch.randint(1, 6, (32,)), torch.randint(0, 2, (32,)))
        loader = DataLoader(data, batch_size=8, shuffle=True)
        model = Tagger()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model.to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for tokens, lengths, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(tokens.to(device), lengths), y.to(device)).backward()
            optimizer.step()
    '''))
    result = port_source(script.read_text(), str(script))
    # DDP moves every input of the model to the GPU (device_ids), whatever the script does at the call
    [todo] = [t.message for t in result.todos if "pack_padded_sequence" in t.message]
    assert "`lengths` reaches `pack_padded_sequence` in seq.py:11" in todo and "`lengths.cpu()`" in todo
    (tmp_path / "seq.py").write_text((tmp_path / "seq.py").read_text().replace("lengths))", "lengths.cpu()))"))
    result = port_source(script.read_text(), str(script))
    assert not any("pack_padded_sequence" in t.message for t in result.todos)  # moved to the host in forward


def test_a_script_named_relative_to_the_working_folder_is_ported_beside_the_modules_found_for_it(monkeypatch):
    """`ddpkit port pkg/train.py` from the folder above: the script's path is relative, the modules the port finds
    for it are not; the linter the port runs on its output placed files by their folders and stopped on the mix
    ("Can't mix absolute and relative paths")."""
    monkeypatch.chdir(FIXTURES)
    path = Path("trainer_pkg") / "train.py"
    result = port_source(path.read_text(), str(path))
    assert any('load_weights("weights.pt")' in result.code.splitlines()[t.line - 1] for t in result.todos
               if t.in_output)
