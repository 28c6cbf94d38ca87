"""`ddpkit port` as a codemod (no processes): what each single-device style becomes, TODOs, bad input, the CLI."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddpkit.lint import lint_source
from ddpkit.port import PortError, main, port_source

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "port"
PLAIN = ROOT / "examples" / "plain"
FULL = ["argparse_main", "toplevel_script", "trainer_class", "dict_batches", "amp_scaler", "checkpoint_resume",
        "tqdm_loops", "running_loss", "epoch_loss_mean", "two_optimizers", "gan_pair", "encoder_decoder",
        "model_list", "model_passed_in"]
# the port's first line after ddpkit.init in a script that seeds nothing before it
ALIKE = ("ddpkit.rng.seed_everything(ctx.seed)  # one seed on every rank until training: data shuffled or split "
         "before it agrees\n")
TODO = {"custom_sampler": ["custom sampler `sampler=sampler`"]}


def _path(name: str) -> Path:
    return PLAIN / f"{name}.py" if name in ("digits", "charlm") else FIXTURES / f"{name}.py"


def _port(name: str):
    path = _path(name)
    return port_source(path.read_text(), str(path))


@pytest.mark.parametrize("name", [*FULL, "digits", "charlm"])
def test_each_style_ports_fully_lints_clean_and_is_idempotent(name):
    result = _port(name)
    assert result.todos == [] and result.exit_code == 0, result.todos
    ast.parse(result.code)
    assert ("with ddpkit.init(" in result.code or "ctx = ddpkit.init(" in result.code) and "import ddpkit\n" in result.code
    assert "DataLoader(" not in result.code.split("import ddpkit", 1)[1]
    assert "ddpkit.wrap(" in result.code
    assert lint_source(result.code, f"{name}_ddp.py") == []
    again = port_source(result.code, f"{name}_ddp.py")
    assert not again.changed and again.code == result.code and "nothing to change" in again.message


def test_the_plain_digits_script_becomes_the_ddpkit_idioms():
    code = _port("digits").code
    assert "    with ddpkit.init(seed=args.seed) as ctx:\n        " + ALIKE + "        device = ctx.device\n" in code
    assert "args = parse_args(argv)\n    with ddpkit.init" in code  # argument parsing stays before init
    assert "train_loader = ddpkit.loader(train_set, ctx, batch_size=args.batch_size // ctx.world_size, " \
           "shuffle=True, drop_last=True)" in code
    assert "# ddpkit port: batch_size is per rank: args.batch_size // world_size keeps the global batch" in code
    assert "test_loader = ddpkit.eval_loader(test_set, ctx, batch_size=256)" in code
    assert "model = ddpkit.wrap(make_model(), ctx)" in code
    assert ".to(device)" not in code  # batches arrive on the device; wrap moves the model
    # sums reduced after the loop, before the division, in the helper that now takes ctx
    assert "def evaluate(model, test_loader, device, *, ctx):" in code
    assert "metrics = evaluate(model, test_loader, device, ctx=ctx)" in code
    loop_end = code.index("count += len(y)")
    reduced = code.index("correct = ddpkit.collectives.all_reduce_number(ctx, correct)")
    assert loop_end < reduced < code.index('return {"test_loss": loss_sum / count')
    assert "loss_sum = ddpkit.all_reduce_sum(ctx, loss_sum).item()" in code
    assert "logits = ddpkit.unwrap(model)(x)" in code  # eval shards differ in length: no DDP forward
    assert "ddpkit.print0(ctx, json.dumps(result))" in code
    assert "if ctx.is_main:\n                torch.save(ddpkit.unwrap(model).state_dict(), args.save)" in code


def test_comments_and_layout_outside_the_edits_are_kept():
    source = _path("digits").read_text()
    code = port_source(source).code
    for line in source.splitlines():
        if line.strip().startswith(("#", '"""')):
            assert line.strip() in code
    untouched = source[source.index("def parse_args"):source.index("def evaluate")]
    assert untouched in code  # helpers the entry point does not need ctx in are byte-identical
    assert code.startswith(source.split("import argparse")[0])


def test_a_top_level_script_keeps_its_indentation_and_sums_are_reduced():
    source = _path("toplevel_script").read_text()
    code = _port("toplevel_script").code
    assert "\nctx = ddpkit.init(seed=0)\n" + ALIKE + "device = str(ctx.device)\n" in code
    assert code.endswith("ctx.close()  # every rank leaves the process group together\n")
    assert "\nmodel = ddpkit.wrap(nn.Sequential(" in code and "model.to(device)" not in code
    assert "total = int(ddpkit.all_reduce_sum(ctx, total).item())" in code
    assert "shuffle=False" in code  # the original order is kept
    # a minimal diff: no line of the script is re-indented, the loop bodies stay where they were
    assert "\nfor epoch in range(5):\n    for xb, yb in train_loader:\n" in code
    import difflib
    changed = [d for d in difflib.ndiff(source.splitlines(), code.splitlines()) if d[:1] in "+-"]
    assert len(changed) < 31, changed  # (import ddpkit.collectives for a summed number counts as one)


def test_a_trainer_class_gets_ctx_through_its_methods():
    code = _port("trainer_class").code
    assert "def __init__(self, model, train_loader, val_loader, lr, device, *, ctx):" in code
    assert "self.model = ddpkit.wrap(model, ctx)" in code
    assert "trainer = Trainer(MLP(16, 64, 4), train_loader, val_loader, args.lr, device, ctx=ctx)" in code
    assert "acc = trainer.fit(args.epochs, ctx=ctx)" in code and "self.evaluate(ctx=ctx)" in code
    assert "def __init__(self, d_in, d_hidden, d_out):" in code  # the model class is untouched
    # a mean over batches: every rank's batches count
    assert "avg = total_loss / ddpkit.all_reduce_sum(ctx, len(self.train_loader)).item()" in code


def test_dict_batches_tqdm_and_positional_loader_arguments():
    code = _port("dict_batches").code
    assert "batch = {k: v for k, v in batch.items()}" not in code
    assert "    ctx = ddpkit.init()\n    " + ALIKE + "    ddpkit.print0(ctx, json.dumps(" in code
    tq = _port("tqdm_loops").code
    assert 'pbar = tqdm(train_data, desc=f"epoch {epoch}", disable=not ctx.is_main)' in tq
    # the whole dataset's size after the reduction: the same text works for a training loader too
    assert "correct = ddpkit.collectives.all_reduce_number(ctx, correct)" in tq
    assert "return correct / len(loader.dataset)" in tq
    rl = _port("running_loss").code
    assert "ddpkit.loader(TensorDataset(x[:512], y[:512]), ctx, batch_size=32 // ctx.world_size, shuffle=True)" in rl
    assert "cuda" not in rl.split("ctx = ddpkit.init")[1]  # `if torch.cuda.is_available(): net.cuda()` is gone
    assert "running_loss = ddpkit.all_reduce_sum" not in rl  # reset inside the loop, never read after it


def test_checkpoints_are_written_by_rank_zero_and_loaded_onto_this_device():
    code = _port("checkpoint_resume").code
    assert "def save_checkpoint(path, model, optimizer, epoch, *, ctx):\n    if ctx.is_main:\n        torch.save(" \
           '{"model": ddpkit.unwrap(model).state_dict()' in code
    assert "state = torch.load(args.ckpt, map_location=ctx.device)" in code
    assert 'ddpkit.unwrap(model).load_state_dict(state["model"])' in code


def test_a_load_location_naming_one_gpu_becomes_this_ranks_device():
    src = _path("checkpoint_resume").read_text()
    cases = {
        "torch.load(args.ckpt, map_location='cuda:0' if args.gpu else 'cpu')":
            "torch.load(args.ckpt, map_location=ctx.device if args.gpu else 'cpu')",
        'torch.load(args.ckpt, map_location=torch.device("cuda", 0))': "torch.load(args.ckpt, map_location=ctx.device)",
        "torch.load(args.ckpt, map_location=f'cuda:{args.gpu}')": "torch.load(args.ckpt, map_location=ctx.device)",
        "torch.load(args.ckpt, 'cuda:1')": "torch.load(args.ckpt, ctx.device)",
        # a dict maps stored locations itself, the CPU is every rank's: both stay as written
        "torch.load(args.ckpt, map_location={'cuda:1': 'cuda:0'})": "map_location={'cuda:1': 'cuda:0'})",
        "torch.load(args.ckpt, map_location='cpu')": "torch.load(args.ckpt, map_location='cpu')",
    }
    for load, expected in cases.items():
        script = src.replace('parser.add_argument("--ckpt", default="")',
                             'parser.add_argument("--ckpt", default="")\n    parser.add_argument("--gpu", type=int, '
                             'default=1)').replace("torch.load(args.ckpt)", load)
        result = port_source(script, "resume.py")
        assert expected in result.code, (load, result.code)
        assert result.exit_code == 0, result.todos


def test_training_objects_built_at_module_level_put_the_whole_script_under_init():
    src = ("import argparse\nimport torch\nfrom torch.utils.data import DataLoader\n\n"
           "parser = argparse.ArgumentParser()\nargs = parser.parse_args()\n"
           "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
           "train_loader = DataLoader(ds, batch_size=64, shuffle=True)\nmodel = Net().to(device)\n"
           "opt = torch.optim.Adam(model.parameters())\n\n\ndef train(epoch):\n"
           "    for x, y in train_loader:\n        x = x.to(device)\n        print(model(x).sum())\n\n\n"
           "if __name__ == '__main__':\n    for epoch in range(3):\n        train(epoch)\n")
    code = port_source(src).code
    assert "args = parser.parse_args()\nctx = ddpkit.init()\n" + ALIKE + "device = ctx.device\n" in code
    assert "\nmodel = ddpkit.wrap(Net(), ctx)\n" in code
    assert "\ndef train(epoch):\n    for x, y in train_loader:\n        ddpkit.print0(ctx, " in code
    assert "x.to(device)" not in code  # the module-level loader's batches, inside a function
    assert "\nif __name__ == '__main__':\n    for epoch in range(3):\n" in code


def test_step_counters_are_not_reduced():
    code = _port("charlm").code
    assert "step = int(ddpkit.all_reduce_sum" not in code
    assert "nll = ddpkit.all_reduce_sum(ctx, nll).item()" in code


@pytest.mark.parametrize("name", sorted(TODO))
def test_what_cannot_be_ported_safely_is_left_with_a_todo(name):
    result = _port(name)
    assert result.exit_code == 3
    assert [t.message.split(":")[0] for t in result.todos] == TODO[name]
    source_lines = _path(name).read_text().splitlines()
    for todo in result.todos:
        marker = f"# TODO(ddpkit port): {todo.message}"
        assert marker in result.code
        following = result.code.split(marker, 1)[1].splitlines()[1].strip()
        assert following == source_lines[todo.line - 1].strip()  # the line it names, unchanged
    assert "sampler=sampler" in _port("custom_sampler").code


def test_model_not_found_and_kwargs_loaders_are_todos():
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\ndef main():\n"
           "    params = build()\n    opt = torch.optim.SGD(params, lr=0.1)\n"
           "    kw = loader_options()\n    data = DataLoader(ds, **kw)\n\nif __name__ == '__main__':\n    main()\n")
    result = port_source(src)
    messages = [t.message for t in result.todos]
    assert [t.line for t in result.todos] == [6, 8]
    assert messages[0].startswith("cannot find the model") and "**kwargs" in messages[1]


def test_loader_options_in_a_kwargs_dict_of_literals_are_written_out():
    src = ("import torch\n\ndef main(args):\n    train_kwargs = {'batch_size': args.batch_size}\n"
           "    test_kwargs = {'batch_size': 1000}\n    if torch.cuda.is_available():\n"
           "        cuda_kwargs = {'num_workers': 1, 'pin_memory': True, 'shuffle': True}\n"
           "        train_kwargs.update(cuda_kwargs)\n        test_kwargs.update(cuda_kwargs)\n"
           "    train_loader = torch.utils.data.DataLoader(ds1, **train_kwargs)\n"
           "    test_loader = torch.utils.data.DataLoader(ds2, **test_kwargs)\n"
           "    model = Net()\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "\nif __name__ == '__main__':\n    main(parse())\n")
    result = port_source(src)
    assert result.todos == []
    assert ("train_loader = ddpkit.loader(ds1, ctx, batch_size=args.batch_size // ctx.world_size, shuffle=True, "
            "num_workers=1, persistent_workers=False)") in result.code
    assert "test_loader = ddpkit.eval_loader(ds2, ctx, batch_size=1000, num_workers=1)" in result.code


def test_bad_input_is_refused():
    with pytest.raises(PortError, match=r"x\.py:2:.*cannot parse"):
        port_source("import torch\ndef f(:\n", "x.py")
    ddp = "import torch.distributed as dist\ndist.init_process_group('gloo')\n"
    with pytest.raises(PortError, match=r"already uses torch\.distributed.*`ddpkit lint x\.py`"):
        port_source(ddp, "x.py")
    with pytest.raises(PortError, match=r"no training entry point.*__main__"):
        port_source("import torch\n\ndef train(model):\n    pass\n", "lib.py")
    with pytest.raises(PortError, match="DistributedDataParallel"):
        port_source("from torch.nn.parallel import DistributedDataParallel\n", "x.py")


def test_torch_multiprocessing_refuses_only_a_real_launch():
    body = ("\ndef main():\n    model = torch.nn.Linear(2, 1)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    model(torch.ones(2)).sum().backward()\n    opt.step()\n")
    # an unused import, or a start method chosen for the DataLoader's workers, starts no training process
    for head, tail in (("import torch\nimport torch.multiprocessing as mp\n", "\nif __name__ == '__main__':\n    main()\n"),
                       ("import torch\nimport torch.multiprocessing as mp\n",
                        "\nif __name__ == '__main__':\n    mp.set_start_method('spawn', force=True)\n    main()\n")):
        assert "ddpkit.init()" in port_source(head + body + tail, "x.py").code
    for head, tail in (("import torch\nfrom torch import multiprocessing as tmp\n",
                        "\nif __name__ == '__main__':\n    tmp.spawn(main, nprocs=2)\n"),
                       ("import torch\nfrom torch.multiprocessing import Process\n",
                        "\nif __name__ == '__main__':\n    Process(target=main).start()\n")):
        with pytest.raises(PortError, match=r"already uses torch\.multiprocessing\.(spawn|Process)"):
            port_source(head + body + tail, "x.py")


def test_indentation_mixing_tabs_and_spaces_is_read_as_python_reads_it():
    """Python accepts a block indented `4 spaces, tab, 4 spaces` (12 columns); libcst's tokenizer does not."""
    src = (FIXTURES / "toplevel_script.py").read_text()
    mixed = src.replace("        loss = loss_fn(model(xb), yb)\n",
                        "        with torch.no_grad():\n    \t    scale = 1.0\n\n        loss = loss_fn(model(xb), yb)\n", 1)
    mixed = mixed.replace("import json\n", 'import json\nNOTE = """kept as written:\n\tone tab"""\n', 1)
    assert mixed.count("\t") == 2
    compile(mixed, "mixed.py", "exec")
    result = port_source(mixed, "mixed.py")
    compile(result.code, "ported.py", "exec")
    assert "            scale = 1.0\n" in result.code  # the tab stop is at column 8, as Python counts it
    assert '"""kept as written:\n\tone tab"""' in result.code  # text inside a string is not indentation
    assert "indents with tabs mixed with spaces" in result.message and "ported fully" in result.message
    with pytest.raises(PortError, match=r"y\.py:4:.*cannot parse.*inconsistent use of tabs.*fix the syntax error"):
        port_source("import torch\nif True:\n\tx = 1\n        y = 2\n", "y.py")  # inconsistent: a real error


def test_a_file_this_python_cannot_read_names_the_python():
    """A script written for a newer Python (a 3.12 `type` alias) is not a syntax error there: the refusal says
    which Python read it, so the user knows to run ddpkit under the script's own."""
    python = "%d.%d" % sys.version_info[:2]
    with pytest.raises(PortError, match=rf"cannot parse the file \(.*\) with Python {re.escape(python)}.*newer Python"):
        port_source("import torch\nx = = 1\n", "z.py")
    if sys.version_info < (3, 12):
        with pytest.raises(PortError, match=r"z\.py:2:.*newer Python"):
            port_source("import torch\ntype Row = dict[str, float]\n", "z.py")


def test_cli_writes_diffs_and_exit_codes(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(_path("argparse_main").read_text())
    assert main([str(script), "--diff"]) == 0
    out = capsys.readouterr().out
    assert "+import ddpkit" in out and "-        data, target = data.to(device), target.to(device)" in out
    assert not (tmp_path / "train_ddp.py").exists()  # --diff alone writes nothing
    assert main([str(script)]) == 0
    ported = (tmp_path / "train_ddp.py").read_text()
    assert ported == port_source(script.read_text(), str(script)).code
    assert main([str(tmp_path / "train_ddp.py"), "--in-place"]) == 0
    assert "nothing to change" in capsys.readouterr().out
    assert (tmp_path / "train_ddp.py").read_text() == ported
    other = tmp_path / "out.py"
    todo = tmp_path / "sampler.py"
    todo.write_text(_path("custom_sampler").read_text())
    assert main([str(todo), "-o", str(other)]) == 3
    out = capsys.readouterr().out
    assert f"{todo}:13: TODO custom sampler" in out and other.exists()
    assert main([str(script), "--in-place"]) == 0 and script.read_text() == ported
    assert list(tmp_path.glob(".*.tmp")) == []


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("x = 1\n")
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    ddp = tmp_path / "ddp.py"
    ddp.write_text("import torch.distributed as dist\n")
    for argv, words in (([str(text)], "is not a Python file"), ([str(tmp_path / "nope.py")], "does not exist"),
                        ([str(broken)], "cannot parse"), ([str(ddp)], "ddpkit lint")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ddpkit port: error:") and words in err[0], err
    assert not (tmp_path / "broken_ddp.py").exists() and not (tmp_path / "ddp_ddp.py").exists()


def test_port_is_a_ddpkit_subcommand_and_import_ddpkit_stays_cheap():
    code = ("import sys, ddpkit.cli; "
            "assert 'libcst' not in sys.modules and 'torch' not in sys.modules; "
            "import ddpkit.port; assert 'libcst' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
    from ddpkit.cli import SUBCOMMANDS

    assert SUBCOMMANDS["port"][0] == "ddpkit.port"
