"""`ddpkit port` never breaks what it touches: each rewrite keeps the script running where the original ran."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import runpy
import sys
from pathlib import Path

from ddpkit.port import main, port_source

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


def _port_text(text: str):
    return port_source(text, "script.py")


def _run(path: Path, args: list[str], monkeypatch) -> dict:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "argv", [str(path), *args])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(path), run_name="__main__")
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_the_ported_safety_fixture_runs_at_world_size_1(tmp_path, monkeypatch):
    source = FIXTURES / "rewrite_safety.py"
    result = port_source(source.read_text(), str(source))
    code = result.code
    # a seed only set under `if args.seed is not None:` may be None: ddpkit.init keeps its own default
    assert "with ddpkit.init() as ctx:" in code
    # the script's own split function takes no generator
    assert "random_split(TensorDataset(x, y), [192, 64])\n" in code
    # the script's device variable is bound, not turned into `ctx.device = ctx.device`
    assert "args.device = ctx.device" in code and "ctx.device = ctx.device" not in code
    assert "CUDA_VISIBLE_DEVICES" not in code  # every rank would see one GPU
    assert 'torch.save({"model": ddpkit.unwrap(net), "steps": steps}, args.out)' in code
    assert "steps = 0;" in code  # an untouched line keeps its bytes
    ported = tmp_path / "ported.py"
    ported.write_text(code)
    out = tmp_path / "ckpt.pt"
    assert _run(ported, ["--out", str(out)], monkeypatch)["mse"] < 1e-3
    import torch

    saved = torch.load(out, weights_only=False)
    assert type(saved["model"]).__name__ == "Linear"  # the model itself, not the DDP wrapper


def test_a_seed_set_again_before_the_manual_seed_is_not_read_before_init():
    code = _port_text(
        "import argparse\nimport random\nimport torch\n\n"
        "p = argparse.ArgumentParser()\np.add_argument('--seed', type=int, default=1)\nargs = p.parse_args()\n"
        "args.seed = random.randint(0, 100)\ntorch.manual_seed(args.seed)\n"
        "net = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n").code
    assert "ctx = ddpkit.init()\n" in code


def test_a_save_helper_of_another_module_gets_the_model_on_rank_0():
    code = _port_text(
        "import torch\nimport utils\nfrom torch.utils.data import DataLoader\n\n"
        "net = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "loader = DataLoader(utils.data(), batch_size=8)\n"
        "for x, y in loader:\n    opt.zero_grad()\n    torch.nn.functional.mse_loss(net(x), y).backward()\n"
        "    opt.step()\n"
        "utils.save_model(model=net, target_dir='out', model_name='net.pt')\n").code
    assert "if ctx.is_main:\n    utils.save_model(model=ddpkit.unwrap(net), target_dir='out'" in code


def test_torch_random_split_still_gets_its_generator():
    code = _port_text(
        "import torch\nfrom torch.utils import data\n\n"
        "ds = data.TensorDataset(torch.randn(10, 2), torch.randn(10, 1))\na, b = data.random_split(ds, [8, 2])\n"
        "net = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n").code
    assert "data.random_split(ds, [8, 2], generator=torch.Generator().manual_seed(0))" in code


def test_crlf_bom_and_semicolons_outside_the_changes_keep_their_bytes(tmp_path):
    source = (FIXTURES / "rewrite_safety.py").read_text()
    script = tmp_path / "crlf.py"
    script.write_bytes(("\ufeff" + source).replace("\n", "\r\n").encode("utf-8"))
    out = tmp_path / "crlf_ddp.py"
    assert main([str(script), "-o", str(out)]) == 0
    data = out.read_bytes()
    assert data.startswith("\ufeff".encode("utf-8"))
    assert data.count(b"\n") == data.count(b"\r\n")  # no line of LF alone
    ast.parse(data.decode("utf-8-sig"))


def test_a_module_level_model_wrapped_inside_a_function_is_declared_global(tmp_path, monkeypatch):
    source = FIXTURES / "global_model.py"
    code = port_source(source.read_text(), str(source)).code
    assert '    """Train the module-level model."""\n    global model  # ddpkit port:' in code
    ported = tmp_path / "ported.py"
    ported.write_text(code)
    assert _run(ported, [], monkeypatch)["mse"] < 1e-3  # no UnboundLocalError on the function's first read


def test_a_module_named_like_the_model_is_read_as_the_module_where_the_model_is_built():
    code = _port_text(
        "import torch\nfrom torch.utils.data import DataLoader\nfrom nets import defs as model\n\n"
        "loader = DataLoader(torch.randn(8, 3), batch_size=4)\nmodel = model.Reg(3)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in loader:\n    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\n"
        "print(model.lin.weight)\n").code
    assert "model = ddpkit.wrap(model.Reg(3), ctx)" in code
    assert "ddpkit.print0(ctx, ddpkit.unwrap(model).lin.weight)" in code  # after the build: the model


def test_a_model_moved_to_the_gpu_only_under_a_setting_keeps_that_setting(tmp_path, monkeypatch):
    source = FIXTURES / "device_flag.py"
    code = port_source(source.read_text(), str(source)).code
    # without --cuda the original trains on the CPU, where its inputs stay: ddpkit.init's device follows the flag
    assert 'ctx = ddpkit.init(device="auto" if args.cuda else "cpu")' in code
    ported = tmp_path / "ported.py"
    ported.write_text(code)
    assert _run(ported, [], monkeypatch)["mse"] < 1e-2


def test_an_availability_check_alone_leaves_the_device_to_init():
    code = _port_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\n"
        "loader = DataLoader(torch.randn(8, 3), batch_size=4)\nnet = torch.nn.Linear(3, 1)\n"
        "if torch.cuda.is_available():\n    net.cuda()\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x in loader:\n    opt.zero_grad()\n    net(x).sum().backward()\n    opt.step()\n").code
    assert "ctx = ddpkit.init()\n" in code


def test_a_state_sized_by_the_global_batch_outside_the_loop_rule_is_a_todo():
    source = FIXTURES / "batch_sized_state.py"
    result = port_source(source.read_text(), str(source))
    assert result.exit_code == 3
    messages = [t.message for t in result.todos]
    assert any(m.startswith("`net.init_hidden(8)` is sized by the batch size 8") for m in messages), messages


def test_the_scripts_own_gpu_choice_goes_and_an_explicit_cpu_move_stays():
    code = _port_text(
        "import argparse\nimport torch\nfrom torch.utils.data import DataLoader\n\n"
        "p = argparse.ArgumentParser()\np.add_argument('--gpu', type=int, default=0)\nargs = p.parse_args()\n"
        "torch.cuda.set_device(args.gpu)\n"
        "loader = DataLoader(torch.randn(8, 3), batch_size=4)\nnet = torch.nn.Linear(3, 1).cuda()\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "with torch.cuda.device(args.gpu):\n"
        "    for x in loader:\n        opt.zero_grad()\n        net(x.cuda()).sum().backward()\n        opt.step()\n"
        "net.to('cpu')\nwith torch.no_grad():\n    print(net(torch.zeros(1, 3)))\n").code
    assert "torch.cuda.set_device(" not in code  # ddpkit.init chose this rank's GPU (a TODO may name it)
    assert "with torch.cuda.device(ctx.device):" in code
    # the CPU sampling below keeps its CPU model, and calls it directly (DDP would move the inputs to its GPU)
    assert "\nnet = ddpkit.unwrap(net).to('cpu')\n" in code


def test_a_sum_read_in_a_rank_0_write_is_computed_by_every_rank_before_it():
    source = FIXTURES / "rank0_report.py"
    result = port_source(source.read_text(), str(source))
    code = result.code
    assert result.exit_code == 0, result.todos
    hoisted = code.index("total_all_ranks = ddpkit.all_reduce_sum(ctx, total).item()")
    guard = code.index("if ctx.is_main:", hoisted)
    assert hoisted < guard < code.index("(total_all_ranks / ctx.world_size) / (i + 1)")
    guards = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.If) and ast.unparse(n.test) == "ctx.is_main"]
    assert len(guards) == 2
    for guard_node in guards:  # no collective left where rank 0 alone runs
        assert "ddpkit.all_reduce" not in ast.unparse(guard_node), ast.unparse(guard_node)


def test_a_module_forward_never_reads_is_wrapped_with_find_unused_parameters():
    source = FIXTURES / "ema_inside.py"
    result = port_source(source.read_text(), str(source))
    assert result.exit_code == 0, result.todos  # update_average is @torch.no_grad(): it trains nothing
    assert "model = ddpkit.wrap(Averaged(), ctx, find_unused_parameters=True)" in result.code
    assert "Averaged.forward never reads self.avg" in result.code


def test_a_batch_size_read_in_an_evaluation_loop_is_no_todo():
    code = _port_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\nB = 8\n"
        "train = DataLoader(torch.randn(32, 3), batch_size=B, shuffle=True)\n"
        "test_loader = DataLoader(torch.randn(16, 3), batch_size=B)\n"
        "net = torch.nn.Linear(3, 3)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x in train:\n    opt.zero_grad()\n    net(x).sum().backward()\n    opt.step()\n"
        "with torch.no_grad():\n    for x in test_loader:\n        print(net(x).view(B, 3, 1).shape)\n")
    assert code.exit_code == 0, code.todos  # ddpkit.eval_loader keeps batch_size=B per rank


def test_a_load_helper_of_another_module_loads_into_the_model_on_every_rank():
    code = _port_text(
        "import torch\nimport utils\nfrom torch.utils.data import DataLoader\n\n"
        "net = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "utils.load_checkpoint(torch.load('ckpt.pt'), net)\n"
        "loader = DataLoader(utils.data(), batch_size=8)\n"
        "for x, y in loader:\n    opt.zero_grad()\n    torch.nn.functional.mse_loss(net(x), y).backward()\n"
        "    opt.step()\n").code
    assert "\nutils.load_checkpoint(torch.load('ckpt.pt', map_location=ctx.device), ddpkit.unwrap(net))\n" in code


def test_a_sample_drawn_without_gradients_may_use_the_batch_size():
    code = _port_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\nbatch_size = 8\n"
        "train = DataLoader(torch.randn(32, 3), batch_size=batch_size, shuffle=True)\n"
        "net = torch.nn.Linear(3, 3)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x in train:\n    opt.zero_grad()\n    net(x).sum().backward()\n    opt.step()\n"
        "with torch.no_grad():\n    z = torch.randn(batch_size, 3)\n    print(net(z).shape)\n")
    assert not any("sized by the batch size" in t.message for t in code.todos), code.todos


def test_a_gpu_switch_computed_from_settings_after_parsing_is_read_by_init():
    code = _port_text(
        "import argparse\nimport torch\nfrom torch.utils.data import DataLoader\n\n"
        "p = argparse.ArgumentParser()\np.add_argument('--no-cuda', action='store_true')\nargs = p.parse_args()\n"
        "args.cuda = not args.no_cuda and torch.cuda.is_available()\n"
        "loader = DataLoader(torch.randn(8, 3), batch_size=4)\nnet = torch.nn.Linear(3, 1)\n"
        "if args.cuda:\n    net.cuda()\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x in loader:\n    opt.zero_grad()\n    net(x).sum().backward()\n    opt.step()\n").code
    assert 'ddpkit.init(device="auto" if (not args.no_cuda and torch.cuda.is_available()) else "cpu")' in code


def test_a_save_helper_called_with_a_checkpoint_dict_runs_on_rank_0():
    code = _port_text(
        "import torch\nfrom utils import save_checkpoint, loaders\n\n"
        "net = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x, y in loaders()[0]:\n    opt.zero_grad()\n    torch.nn.functional.mse_loss(net(x), y).backward()\n"
        "    opt.step()\n"
        "checkpoint = {'state_dict': net.state_dict()}\nsave_checkpoint(checkpoint)\n").code
    assert "if ctx.is_main:\n    save_checkpoint(checkpoint)\n" in code


def test_torch_imported_under_another_name_still_loads_onto_the_rank_device():
    code = _port_text(
        "import torch as t\nfrom torch.utils.data import DataLoader\n\n"
        "net = t.nn.Linear(2, 1)\nnet.load_state_dict(t.load('net.pt'))\n"
        "opt = t.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x in DataLoader(t.randn(8, 2), batch_size=4):\n    opt.zero_grad()\n    net(x).sum().backward()\n"
        "    opt.step()\nt.save(net.state_dict(), 'net.pt')\n").code
    assert "t.load('net.pt', map_location=ctx.device)" in code
    assert "if ctx.is_main:\n    t.save(ddpkit.unwrap(net).state_dict(), 'net.pt')" in code


def test_a_rewrite_that_breaks_the_syntax_is_reported_as_a_bug_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    import ddpkit.port.codemod as codemod
    from ddpkit.port import PortBug

    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    out = tmp_path / "ported.py"
    real = codemod._with_every_todo
    monkeypatch.setattr(codemod, "_with_every_todo", lambda code, todos: real(code, todos) + "(a, b) + 1 = 2\n")
    try:
        port_source(script.read_text(), str(script))
    except PortBug as e:
        assert "a bug in ddpkit port, nothing was written" in str(e)
    else:
        raise AssertionError("a port whose output does not parse was handed back")
    assert main([str(script), "-o", str(out)]) == 2
    assert not out.exists() and "cannot parse" in capsys.readouterr().err
