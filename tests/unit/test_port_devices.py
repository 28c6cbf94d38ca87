"""`ddpkit port`: CPU tensors made by the script's own functions, helpers that assert the DataParallel the port
removed, files every rank numbers itself, figures made on every rank, trackers made at import."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from ddpkit.port import port_source

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


def _port(name: str):
    path = FIXTURES / name
    return port_source(path.read_text(), str(path))


def _todo_above(result, text: str) -> str:
    lines = result.code.splitlines()
    [i] = [i for i, line in enumerate(lines) if line.strip() == text]
    assert "TODO(ddpkit port):" in lines[i - 1], lines[i - 1]
    return lines[i - 1]


def test_tensors_made_on_the_cpu_by_the_scripts_helpers_and_fed_to_the_model_are_named_with_their_line():
    result = _port("helper_tensors.py")
    assert result.exit_code == 3 and "ported fully" not in result.message
    by_message = {t.message.split("`")[1]: t for t in result.todos if "made on the CPU" in t.message
                  or "makes on the CPU" in t.message}
    # `inp` comes through `*pair(...)` from as_tensor's torch.LongTensor (line 16); the hidden state from the
    # model class's init_hidden (line 35); the lookup table at module level (line 9) is indexed by loader labels
    assert "`torch.LongTensor(...)` (line 16)" in by_message["inp"].message
    assert "`torch.zeros(...)` (line 35)" in by_message["hidden"].message
    assert "`torch.zeros(...)` (line 9)" in by_message["table[yb]"].message
    assert "out, hidden = model(inp[i], hidden)" in result.code.splitlines()[
        result.code.splitlines().index(_todo_above(result, "out, hidden = model(inp[i], hidden)")) + 1]
    ast.parse(result.code)


def test_tensors_the_helpers_make_on_the_models_device_are_not_named():
    source = (FIXTURES / "helper_tensors.py").read_text()
    source = source.replace("return torch.LongTensor(ids)", "return torch.tensor(ids, device=DEVICE)")
    source = source.replace("return torch.zeros(1, 1, 8)", "return torch.zeros(1, 1, 8, device=DEVICE)")
    source = source.replace("table = torch.zeros(4, 3)", "table = torch.zeros(4, 3).to(DEVICE)")
    source = source.replace("LETTERS = ", "DEVICE = 'cuda'\nLETTERS = ")
    result = port_source(source, "helper_tensors.py")
    assert not any("on the CPU" in t.message for t in result.todos), [t.message for t in result.todos]


def test_a_helper_that_asserts_the_removed_data_parallel_is_named_once_at_its_call():
    result = _port("parallel_patch/train.py")
    assert result.exit_code == 3
    todo = _todo_above(result, "patch_replication(net)")
    assert "asserts that `data_parallel` is an nn.DataParallel (replicate.py:7)" in todo
    assert "delete it" in todo
    assert not any("not checked: `patch_replication`" in t.message for t in result.todos)
    assert "nn.DataParallel(net)" not in result.code


def test_files_numbered_per_rank_figures_made_on_every_rank_and_a_tracker_made_at_import():
    result = _port("rank_files.py")
    assert result.exit_code == 3
    lines = result.code.splitlines()
    numbered = _todo_above(result, 'Image.fromarray(picture).save("results/%d_pred.png" % img_id)')
    assert "numbered by `img_id`" in numbered and "ctx.rank" in numbered
    assert "made at import, on every rank" in _todo_above(result, 'writer = SummaryWriter("runs/demo")')
    # the figure and the axes it draws on are rank 0's, like the drawing calls the port already guarded
    for text in ("fig = plt.figure()", "ax = plt.gca()", 'ax.set_xlabel("epoch")', "plt.plot(losses)",
                 "twin = ax.twinx()", "twin.plot(losses[::-1])"):
        [i] = [i for i, line in enumerate(lines) if line.strip() == text]
        assert lines[i - 1].strip() == "if ctx.is_main:", text


def test_a_figure_whose_handle_is_used_where_the_port_cannot_guard_it_stays_whole_on_every_rank():
    source = textwrap.dedent("""\
        import matplotlib.pyplot as plt
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset


        def main():
            x = torch.rand(32, 2)
            loader = DataLoader(TensorDataset(x, x), batch_size=4, shuffle=True)
            model = nn.Linear(2, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for xb, yb in loader:
                loss = nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
            fig = plt.figure()
            plt.plot([1, 2])
            size = fig.get_size_inches()
            print(size)


        if __name__ == "__main__":
            main()
        """)
    result = port_source(source, "figure.py")
    # nothing of it moves to rank 0 (a handle bound there alone would be unbound where `print(size)` reads it),
    # and no TODO: the figure the other ranks make is never drawn, which breaks nothing
    assert not any("figure" in t.message for t in result.todos)
    lines = result.code.splitlines()
    [i] = [i for i, line in enumerate(lines) if line.strip() == "fig = plt.figure()"]
    assert lines[i - 1].strip() != "if ctx.is_main:"


def test_a_model_moved_to_the_cpu_and_back_keeps_its_move_back_and_stays_wrapped(tmp_path, monkeypatch):
    result = _port("cpu_round_trip.py")
    assert result.exit_code == 0, [t.message for t in result.todos]
    lines = [line.strip() for line in result.code.splitlines()]
    # the placement before any move to the CPU is ddpkit.wrap's; every move that may follow one brings it back
    assert "model = ddpkit.wrap(nn.Linear(8, 2), ctx)" in lines and "model.cuda()" not in lines
    assert "model.to(ctx.device).train()" in lines  # in the helper the loop calls
    body = lines[lines.index("ddpkit.unwrap(model).cpu()"):]
    assert body[1:4] == ["if ctx.is_main:", 'torch.save(ddpkit.unwrap(model).state_dict(), "epoch.pt")',
                         "model.to(ctx.device)"]
    # inside the loop the name stays the wrapped model; after training it may become the bare module to sample
    assert lines.count("model = ddpkit.unwrap(model).cpu()") == 1
    assert lines.index("model = ddpkit.unwrap(model).cpu()") > lines.index('checkpoint(model, "last.pt", ctx=ctx)')
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "cpu_round_trip_ddp.py"
    path.write_text(result.code)
    import contextlib
    import io
    import runpy
    import sys
    monkeypatch.setattr(sys, "argv", [str(path)])
    with contextlib.redirect_stdout(io.StringIO()):
        runpy.run_path(str(path), run_name="__main__")
    assert (tmp_path / "epoch.pt").exists() and (tmp_path / "last.pt").exists()


def test_paths_that_run_the_model_before_or_without_its_wrap_keep_it_on_the_device(monkeypatch):
    from test_port_placement import _run_on_meta

    result = _port("eval_paths.py")
    assert result.exit_code == 0, [t.message for t in result.todos]
    lines = [line.strip() for line in result.code.splitlines()]
    # `--test` returns before the wrap, and the first evaluation runs before it: no wrap placed the model there
    assert "with ddpkit.init() as ctx:" in lines  # `if args.test: model.cuda()` picks a path, not the device
    assert lines[lines.index("if args.test:") + 1] == "model = model.to(ctx.device)"
    assert lines[lines.index("def predict(model, x, *, ctx):") + 1] == "model.to(ctx.device)"  # called unwrapped there
    assert lines[lines.index('ddpkit.print0(ctx, "before training", evaluate(model, test_loader, ctx=ctx))') - 1] \
        == "model.to(ctx.device)"
    # on the meta stand-in a model left on the CPU meets the loader's device batches and raises, as on a GPU
    _run_on_meta(result.code, ["--test"], monkeypatch)
    _run_on_meta(result.code, [], monkeypatch)


def test_a_forward_while_the_model_sits_on_the_cpu_between_its_moves_is_named():
    source = textwrap.dedent('''\
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        def main():
            loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=16)
            model = nn.Linear(8, 2).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(2):
                for x, y in loader:
                    x, y = x.cuda(), y.cuda()
                    loss = nn.functional.cross_entropy(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                model.cpu()
                sample = model(torch.randn(1, 8))
                model.cuda()
            print(sample)

        if __name__ == "__main__":
            main()
        ''')
    result = port_source(source, "sample_on_cpu.py")
    assert result.exit_code == 3
    [todo] = [t for t in result.todos if "is on the CPU here" in t.message]
    assert "moved at line 16, back at line 18" in todo.message and "ddpkit.unwrap(model)" in todo.message
    assert "ddpkit.unwrap(model).cpu()" in result.code and "model.to(ctx.device)" in result.code


def test_a_cpu_scripts_evaluation_batches_given_to_the_model_on_the_device_are_named_too():
    result = _port("cpu_eval_batches.py")
    assert result.exit_code == 3 and "ported fully" not in result.message
    # training's forward as before; the evaluation's, in another function, over batches no ddpkit loader makes
    assert "`x` is made on the CPU (the script names no device)" in _todo_above(
        result, "loss = F.cross_entropy(model(x), y)")
    todo = _todo_above(result, "correct += (model(inputs).argmax(1) == labels).sum().item()")
    assert "`inputs` comes from a batch of `data` (not a ddpkit loader" in todo and "ddpkit.device.to_device(batch, ctx.device)" in todo
    ast.parse(result.code)


def test_tensors_the_wrapped_models_own_methods_make_on_the_cpu_for_its_submodules_are_named():
    # the agent's class lives in src/ (a folder without __init__.py) beside scripts/: it is read all the same
    result = _port("env_agent/scripts/train.py")
    assert result.exit_code == 3 and "ported fully" not in result.message
    [todo] = [t.message for t in result.todos if "agent.py" in t.message]
    assert todo.startswith("`Agent.episode` in agent.py (read, not ported) makes `torch.from_numpy(observation)` on "
                           "the CPU (agent.py:15) and gives it to `self.policy`, which ddpkit.wrap put on ctx.device")


def test_a_cpu_tensor_a_submodule_keeps_as_a_plain_attribute_is_named_and_a_registered_buffer_is_not(tmp_path):
    # layers.py is reached through nets.py's Classifier: `self.body = Shifted(width)`
    result = _port("cpu_plain_tensor/train.py")
    assert result.exit_code == 3 and "ported fully" not in result.message
    [todo] = [t.message for t in result.todos if "plain attribute" in t.message]
    assert todo.startswith("`Shifted` in layers.py (read, not ported) keeps `self.shift`, a tensor made on the CPU "
                           "(layers.py:10)") and "`forward` meets it there (layers.py:14)" in todo, todo
    for name in ("train.py", "nets.py", "layers.py"):
        text = (FIXTURES / "cpu_plain_tensor" / name).read_text()
        (tmp_path / name).write_text(text.replace(
            "self.shift = torch.arange(width).float()\n        self.shift = self.shift.unsqueeze(0)",
            'self.register_buffer("shift", torch.arange(width).float().unsqueeze(0))'))
    buffered = port_source((tmp_path / "train.py").read_text(), str(tmp_path / "train.py"))
    assert buffered.exit_code == 0, buffered.message


def test_a_model_method_that_builds_its_input_on_the_cpu_is_named_at_its_call_and_only_a_graph_trains():
    result = _port("acting_method.py")
    assert result.exit_code == 3 and "ported fully" not in result.message
    [todo] = [t for t in result.todos if "model.act(...)" in t.message]
    # act turns the state into a tensor itself and runs forward on it: the model is on ctx.device after the port
    assert "builds its input `obs` on the CPU (`torch.FloatTensor(state).unsqueeze(0)`, line 20)" in todo.message
    assert "device mismatch" in todo.message and "trains through a method" not in todo.message
    # act returns `.item()` or a draw: its output never reaches backward(), so it trains nothing
    assert not any("trains through a method" in t.message for t in result.todos)
    # the same method returning the forward's output (a graph) that the step's loss is built from does train
    source = (FIXTURES / "acting_method.py").read_text()
    trained = source.replace("        return self.forward(obs).argmax(1).item()\n",
                             "        return self.forward(obs).max()\n").replace(
        "        loss = model(batch).pow(2).mean()\n", "        loss = model(batch).pow(2).mean() + action\n")
    assert trained != source
    messages = [t.message for t in port_source(trained, "acting_method.py").todos]
    assert any(m.startswith("`model.act(...)` trains through a method of the model") for m in messages), messages
    # a method that places its input itself is left alone
    placed = source.replace("torch.FloatTensor(state).unsqueeze(0)",
                            "torch.FloatTensor(state).unsqueeze(0).to(next(self.parameters()).device)")
    assert not any("builds its input" in t.message for t in port_source(placed, "acting_method.py").todos)


def _model_factory_project(tmp_path: Path, moves: str) -> Path:
    """A script whose model comes from its package's factory, which imports the model class inside the function
    (`from .seg import Segmenter`); the class puts itself on the GPU in its own code (or not)."""
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "__init__.py").write_text(textwrap.dedent('''
        def build(opts):
            from .seg import Segmenter
            return Segmenter(opts)
    '''))
    (tmp_path / "nets" / "seg.py").write_text(textwrap.dedent(f'''
        import torch

        class Segmenter:
            def __init__(self, opts):
                self.net = torch.nn.Linear(4, 2){moves}
                self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)
    '''))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from nets import build

        model = build({})
        loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4, shuffle=True)
        for (x,) in loader:
            model.step(x)
    '''))
    return script


def test_a_model_that_puts_itself_on_the_gpu_in_a_module_its_package_imports_keeps_the_default_device(tmp_path):
    script = _model_factory_project(tmp_path, ".cuda()")
    result = port_source(script.read_text(), str(script))
    assert "ctx = ddpkit.init()" in result.code and 'device="cpu"' not in result.code
    (tmp_path / "bare").mkdir()
    bare = _model_factory_project(tmp_path / "bare", "")  # nothing names a device: the CPU stays
    assert 'ddpkit.init(device="cpu")' in port_source(bare.read_text(), str(bare)).code
