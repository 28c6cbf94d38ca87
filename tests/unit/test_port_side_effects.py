"""`ddpkit port`: side effects every rank would run (a library that downloads on first use, a file a library opens
for writing) and the script's own device values (a device string chosen before ddpkit.init)."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import runpy
import sys
import textwrap
from pathlib import Path

from ddpkit.port import port_source

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


def _port(name: str, source: str | None = None):
    path = FIXTURES / name
    return port_source(source if source is not None else path.read_text(), str(path))


def _guarded(code: str) -> list[str]:
    """The source of every statement inside an `if ctx.is_main:` block of the ported code."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "ctx.is_main":
            found.extend(ast.unparse(s) for s in node.body)
    return found


def test_a_device_string_chosen_before_init_is_compared_as_a_string_and_the_port_runs(tmp_path, monkeypatch):
    result = _port("string_device.py")
    assert result.exit_code == 0, [t.message for t in result.todos]
    lines = [line.strip() for line in result.code.splitlines()]
    # module level, above the inline entry point's ddpkit.init: the name stays a str, so its comparison does too
    assert "device = 'cuda' if torch.cuda.is_available() else 'cpu'" in lines
    assert "if device == 'cuda':" in lines and "if device.type == 'cuda':" not in lines
    # a parameter of that name may be handed the string or a torch.device: torch.device(...) reads both
    assert 'if torch.device(device).type == "cuda":' in lines
    # a string choice inside the ddpkit.init block becomes this rank's device as a string ("cuda:1"): its
    # comparison with "cuda" reads the device's type
    assert "run_device = str(ctx.device)" in lines and 'if torch.device(run_device).type == "cuda":' in lines
    path = tmp_path / "string_device_ddp.py"
    path.write_text(result.code)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "argv", [str(path)])
    with contextlib.redirect_stdout(io.StringIO()):
        runpy.run_path(str(path), run_name="__main__")  # `'cuda'.type` raised AttributeError here


def test_a_device_string_chosen_in_the_entry_point_stays_a_string_the_script_can_write_as_json(tmp_path, monkeypatch):
    result = _port("device_in_config.py")
    assert result.exit_code == 0, [t.message for t in result.todos]
    assert "device = str(ctx.device)" in [line.strip() for line in result.code.splitlines()]
    path = tmp_path / "device_in_config_ddp.py"
    path.write_text(result.code)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(path)])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(path), run_name="__main__")  # json.dump of a torch.device raised TypeError here
    assert json.loads(out.getvalue().strip().splitlines()[-1])["device"] == "cpu"
    assert json.loads((tmp_path / "run" / "config.json").read_text())["device"] == "cpu"


def test_a_run_started_on_rank_0_only_names_the_logging_calls_of_the_projects_functions_on_every_rank():
    result = _port("rank0_tracker/train.py")
    assert result.exit_code == 3 and "ported fully" not in result.message
    assert "if ctx.is_main:\n    wandb.init(" in result.code
    [todo] = [t.message for t in result.todos if "loop.py" in t.message]
    # `import wandb as wb` in the project's module: its log and finish need the run rank 0 alone has; wb.Image not
    assert "loop.py:13 `wb.log(...)` uses the W&B run the port starts on rank 0 only" in todo
    assert "loop.py:14 `wb.finish(...)`" in todo and "wb.Image" not in todo


def test_libraries_that_download_on_first_use_and_shell_fetches_run_on_rank_0_first():
    result = _port("fetch_on_construction.py")
    lines = result.code.splitlines()

    def first(text: str) -> bool:
        [i] = [i for i, line in enumerate(lines) if line.startswith(text)]
        return lines[i - 2].startswith("if not ctx.is_main:") and lines[i - 1].strip() == "ddpkit.barrier(ctx)" \
            and lines[i + 1] == "if ctx.is_main:" and lines[i + 2].strip() == "ddpkit.barrier(ctx)"

    for text in ('os.system("wget', 'subprocess.run(["unzip"', "torch.hub.download_url_to_file(", "dataset = Planetoid(", "arxiv = PygNodePropPredDataset(",
                 "news = text_sets.AG_NEWS(", "(x_train, y_train), _ = mnist.load_data()"):
        assert first(text), text
    for text in ("evaluator = Evaluator(", 'local = datasets.MNIST("data", train=True)',
                 "pairs = text_sets.TranslationDataset("):  # no download: local files
        assert not first(text), text
    ast.parse(result.code)


def test_a_file_a_library_opens_for_writing_is_opened_written_and_closed_on_rank_0():
    result = _port("write_handles.py")
    assert result.exit_code == 0, [t.message for t in result.todos]
    guarded = _guarded(result.code)
    for text in ("hf = h5py.File(os.path.join(args.out, 'logs.h5'), 'w')", "hf.create_dataset('weights', data=weights)",
                 "hf.close()", "table = open(os.path.join(args.out, 'loss.csv'), mode='w', newline='')",
                 "rows = csv.writer(table)", "rows.writerow(['loss', total])", "table.close()",
                 "archive = zipfile.ZipFile(os.path.join(args.out, 'run.zip'), 'w')", "archive.close()",
                 "blob = open(os.path.join(args.out, 'weights.pkl'), 'wb')", "pickle.dump(weights, blob)",
                 "blob.close()", "scipy.io.savemat(os.path.join(args.out, 'weights.mat'), {'w': weights})"):
        assert text in guarded, text
    lines = [line.strip() for line in result.code.splitlines()]
    at = lines.index('with h5py.File(os.path.join(args.out, "logs.h5"), "r") as back:')
    assert lines[at - 1].startswith("ddpkit.barrier(ctx)")  # the file read back waits for rank 0's write


def test_a_write_handle_used_in_a_way_the_port_cannot_guard_is_a_todo():
    source = (FIXTURES / "write_handles.py").read_text().replace(
        "    hf.close()\n", "    print(hf.filename)\n    hf.close()\n")
    result = _port("write_handles.py", source)
    assert result.exit_code == 3
    lines = result.code.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.strip().startswith("hf = h5py.File(")]
    assert "every rank opens this file for writing" in lines[at - 1] and "`hf`" in lines[at - 1]
    assert "hf = h5py.File(os.path.join(args.out, 'logs.h5'), 'w')" not in _guarded(result.code)


def test_a_gpu_index_chosen_at_module_level_becomes_the_current_gpu_or_a_todo():
    result = _port("indexed_device.py")
    assert result.exit_code == 0, [t.message for t in result.todos]
    lines = [line.strip() for line in result.code.splitlines()]
    # read by every rank inside ddpkit.init's block: "cuda" is the GPU ddpkit.init made each rank's current one
    assert 'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")' in lines
    assert 'noise_device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")' in lines
    assert "DEV = 'cuda' if torch.cuda.is_available() else 'cpu'" in lines and "if DEV != 'cpu':" in lines
    assert not any("cuda:0" in line for line in lines)
    source = (FIXTURES / "indexed_device.py").read_text().replace(
        "DEV = 'cuda:0' if torch.cuda.is_available() else 'cpu'", "import sys\nDEV = f'cuda:{sys.argv[1]}'")
    result = _port("indexed_device.py", source)
    assert result.exit_code == 3
    lines = result.code.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.startswith("DEV = f'cuda:")]
    assert "`DEV` names one GPU by an index computed here" in lines[at - 1]


def test_a_folder_named_per_rank_that_rank_0_writes_into_and_every_rank_reads_from_under_another_name_is_named():
    result = _port("per_rank_dir.py")
    assert result.exit_code == 3
    # the save writes through `save_dir` (a parameter of train), the load reads `best_path`: one per-rank value
    [todo] = [t for t in result.todos if "differs on every rank" in t.message]
    assert todo.line == 22 and todo.message.startswith("`stamp` is built from `datetime.now()`")
    assert "line 31 read on every rank goes through `best_path`" in todo.message


def test_a_device_name_bound_to_a_string_and_to_ctx_device_is_compared_through_torch_device(tmp_path, monkeypatch):
    result = _port("string_device_rebound.py")
    lines = [line.strip() for line in result.code.splitlines()]
    assert "device = 'cpu'" in lines and "device = str(ctx.device)" in lines  # a str stays a str ("cuda:1")
    assert "if torch.device(device).type == 'cuda':" in lines
    path = tmp_path / "string_device_rebound_ddp.py"
    path.write_text(result.code)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "argv", [str(path)])
    runpy.run_path(str(path), run_name="__main__")  # describe() before ddpkit.init: `'cpu'.type` raised here


def test_a_handle_name_bound_to_two_files_stays_a_todo_at_each_open():
    source = (FIXTURES / "write_handles.py").read_text().replace(
        "    hf.close()\n", "    hf.close()\n    hf = h5py.File(os.path.join(args.out, 'more.h5'), 'w')\n    hf.close()\n")
    result = _port("write_handles.py", source)
    assert result.exit_code == 3
    lines = result.code.splitlines()
    opens = [i for i, line in enumerate(lines) if line.strip().startswith("hf = h5py.File(")]
    assert len(opens) == 2 and all("every rank writes this file" in lines[i - 1] for i in opens)
    assert not any(text.startswith("hf") for text in _guarded(result.code))


def test_an_experiment_trackers_run_object_and_an_onnx_export_are_rank_0s():
    from ddpkit.port import port_source

    source = (
        "import torch\nfrom hyperdash import Experiment as Run\nimport comet_ml\n"
        "from torch.utils.data import DataLoader, TensorDataset\n\n"
        "run = Run('digits')\nboard = comet_ml.Experiment(project_name='digits')\n"
        "data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
        "loader = DataLoader(data, batch_size=8, shuffle=True)\n"
        "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(2):\n"
        "    for xb, yb in loader:\n"
        "        loss = torch.nn.functional.mse_loss(model(xb), yb)\n"
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
        "    run.metric('loss', loss.item())\n"
        "torch.onnx.export(model, torch.randn(1, 4), 'net.onnx')\n"
        "run.end()\n"
    )
    code = port_source(source, "tracked.py").code
    assert "if ctx.is_main:\n    run = Run('digits')" in code
    assert "if ctx.is_main:\n    board = comet_ml.Experiment(project_name='digits')" in code
    assert "    if ctx.is_main:\n        run.metric('loss', loss.item())" in code
    assert "if ctx.is_main:\n    torch.onnx.export(ddpkit.unwrap(model), torch.randn(1, 4, device=ctx.device), 'net.onnx')" \
        in code
    # a class of the script's own named like a tracker's is the script's, judged where it is defined
    own = source.replace("from hyperdash import Experiment as Run\n", "").replace(
        "run = Run('digits')", "class Run:\n    def __init__(self, name): self.name = name\n    "
        "def metric(self, k, v): pass\n    def end(self): pass\n\n\nrun = Run('digits')")
    assert "if ctx.is_main:\n    run = Run('digits')" not in port_source(own, "own.py").code


def test_processes_and_the_projects_own_writing_helpers_run_on_rank_0_and_a_file_argparse_opens_is_named():
    result = _port("every_rank_effects/train.py")
    assert result.exit_code == 3
    guarded = _guarded(result.code)
    # a process per rank would run the same plot or evaluation script and write the same files; a method or a
    # function of the project's own module that only writes (savefig, open(..., "w")) is a report of rank 0's
    for text in ("os.system('python plot.py --dir %s' % args.out)",
                 "subprocess.run(['python', 'evaluate.py', args.out], check=True)", "plotter.flush()", "table.save()",
                 "report(os.path.join(args.out, 'report.txt'), str(epoch))"):
        assert text in guarded, text
    # what every rank needs stays on every rank: the helpers' objects and their bookkeeping, a query of git whose
    # output the script prints, and a helper that also changes the list its caller hands it (a TODO instead)
    for text in ("plotter = Plotter(args.out)", "plotter.add(total)", "table.log(epoch=epoch, loss=total)",
                 "commit = subprocess.check_output(['git', 'rev-parse', 'HEAD'])", "remember(history, total)",
                 "snapshots.dump(args.out)"):  # its object holds the model: on rank 0 alone a forward could hang
        assert text not in guarded and text in ast.unparse(ast.parse(result.code)), text
    # a folder every rank needs: rank 0 makes it first, the others after the barrier (mkdir -p is idempotent)
    lines = [line.strip() for line in result.code.splitlines()]
    at = lines.index('os.system("mkdir -p %s" % args.out)')
    assert lines[at - 2].startswith("if not ctx.is_main:  # rank 0 creates first") and lines[at + 1] == "if ctx.is_main:"
    for text in ("exp = Experiment('toy')", "exp.param('epochs', args.epochs)", "exp.metric('loss', total)",
                 "exp.end()"):  # a tracker's run made inside the entry function, as at module level
        assert text in guarded, text
    messages = [t.message for t in result.todos]
    assert any(m.startswith("`--log` is an `argparse.FileType(\"w\")`") for m in messages), messages
    assert any(m.startswith("not checked: `remember` in plotting.py") for m in messages), messages
    assert any(m.startswith("not checked: `Snapshots` in plotting.py (read, not ported) gets the model") for m in messages)
    assert len(messages) == 3, messages  # the classes are judged by the methods called, not by their constructors


def test_a_tracker_made_inside_the_entry_function_and_handed_to_a_training_function_logs_from_rank_0(monkeypatch):
    import types

    import test_port_placement as placement

    source = (
        "import hyperdash\nimport torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\n"
        "def train(model, loader, optimizer, run):\n"
        "    for x, y in loader:\n"
        "        loss = nn.functional.cross_entropy(model(x), y)\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n"
        "        run.metric('loss', loss.item())\n\n\n"
        "def main():\n"
        "    exp = hyperdash.Experiment('toy')\n"
        "    exp.param('lr', 0.1)\n"
        "    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=16)\n"
        "    model = nn.Linear(8, 2)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(2):\n"
        "        train(model, loader, optimizer, exp)\n"
        "    exp.end()\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    result = port_source(source, "tracked_in_main.py")
    assert result.exit_code == 0, [t.message for t in result.todos]
    assert "        if ctx.is_main:\n            exp = hyperdash.Experiment('toy')\n        else:\n            exp = None\n" \
        in result.code
    assert "        if ctx.is_main:\n            run.metric('loss', loss.item())" in result.code
    assert "train(model, loader, optimizer, exp, ctx=ctx)" in result.code
    # on a rank other than 0 the run is None and nothing logs through it (an AttributeError if a call were left)
    monkeypatch.setitem(sys.modules, "hyperdash", types.SimpleNamespace(Experiment=None))
    monkeypatch.setattr(placement._MetaContext, "is_main", False)
    placement._run_on_meta(result.code, [], monkeypatch)
    # a value read from the run (`lr = exp.param(...)`) exists on rank 0 only: still a TODO
    read = port_source(source.replace("    exp.param('lr', 0.1)\n", "    lr = exp.param('lr', 0.1)\n"), "reads.py")
    assert read.exit_code == 3 and any("`exp` is used in ways" in t.message for t in read.todos)


_FIRST_DOWNLOAD = '''import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification

model = AutoModelForSequenceClassification.from_pretrained("some-model")
data = [{"x": torch.zeros(4, dtype=torch.long), "y": 0}] * 16
loader = DataLoader(data, batch_size=8, shuffle=True)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
model.to(device)
for batch in loader:
    optimizer.zero_grad()
    model(batch["x"].to(device), labels=batch["y"].to(device)).loss.backward()
    optimizer.step()
model.save_pretrained("./out")
model.push_to_hub("someone/some-model")
'''


def test_the_download_rank_0_runs_first_holds_no_wrap_and_the_model_is_saved_by_rank_0():
    result = port_source(_FIRST_DOWNLOAD, "first_download.py")
    tree = ast.parse(result.code)
    body = [ast.unparse(s) for s in tree.body]
    load = body.index("model = AutoModelForSequenceClassification.from_pretrained('some-model')")
    # between the barriers only the download: DDP's constructor is a collective rank 0 would enter alone (a hang)
    assert body[load - 1].startswith("if not ctx.is_main:") and body[load + 1].startswith("if ctx.is_main:")
    assert any(s.startswith("model = ddpkit.wrap(model, ctx") for s in body[load + 2:])
    assert not any("ddpkit.wrap(" in s for s in body[:load + 2])
    guarded = _guarded(result.code)
    assert "ddpkit.unwrap(model).save_pretrained('./out')" in guarded
    assert "ddpkit.unwrap(model).push_to_hub('someone/some-model')" in guarded


def _downloads_on_rank_0_first(lines: list[str], at: int) -> bool:
    """The statement at `at` (of the stripped lines of a port) runs on rank 0 first, the others after a barrier."""
    return lines[at - 2:at] == ["if not ctx.is_main:  # rank 0 downloads first; the others then read its files",
                                "ddpkit.barrier(ctx)"] and lines[at + 1:at + 3] == ["if ctx.is_main:", "ddpkit.barrier(ctx)"]


def test_a_project_function_that_downloads_runs_on_rank_0_first(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sets.py").write_text(
        "from torchvision import datasets\n\n\ndef mnist(root):\n    return datasets.MNIST(root, download=True)\n")
    (tmp_path / "loaders.py").write_text(
        "from torch.utils.data import DataLoader\n\nfrom pkg import sets\n\n\n"
        "def train_loader(root, batch_size):\n    return DataLoader(sets.mnist(root), batch_size=batch_size)\n\n\n"
        "def local_loader(root, batch_size):\n    return DataLoader(list(range(8)), batch_size=batch_size)\n\n\n"
        "def warm_start(model, opt, root):\n    for x, y in train_loader(root, 8):\n"
        "        model(x).sum().backward()\n        opt.step()\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom loaders import local_loader, train_loader, warm_start\n\n\ndef main():\n"
        "    model = torch.nn.Linear(784, 10)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    loader = train_loader('data', 64)\n    other = local_loader('data', 64)\n    warm_start(model, opt, 'data')\n"
        "    for x, y in loader:\n        opt.zero_grad()\n        model(x).sum().backward()\n        opt.step()\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    result = port_source(script.read_text(), str(script))
    lines = [line.strip() for line in result.code.splitlines()]
    at = lines.index("loader = train_loader('data', 64)")
    # followed through loaders.py into pkg/sets.py: MNIST(download=True) runs on rank 0 first, the others wait
    assert _downloads_on_rank_0_first(lines, at)
    assert lines[at + 3] == "other = local_loader('data', 64)"  # no download there: left as it was
    # a helper that downloads and also trains: rank 0 cannot run it alone while the others wait (a hang)
    [todo] = [t for t in result.todos if t.line == 10]
    assert "pkg/sets.py:5" in todo.message and "rank 0 cannot run it first" in todo.message
    assert lines[lines.index("warm_start(model, opt, 'data')") - 1] != "ddpkit.barrier(ctx)"


def test_a_project_factory_that_picks_a_downloading_builder_from_a_table_runs_on_rank_0_first(tmp_path):
    (tmp_path / "kit" / "data").mkdir(parents=True)
    (tmp_path / "kit" / "__init__.py").write_text("")
    (tmp_path / "kit" / "data" / "images.py").write_text(
        "from torchvision import datasets\n\n\ndef digits(cfg):\n"
        "    return datasets.__dict__[cfg['name']]('data', train=cfg['train'], download=True)\n")
    (tmp_path / "kit" / "data" / "__init__.py").write_text(
        "from .images import digits\n\n_builders = {'mnist': digits}\n\n\ndef make_set(cfg):\n"
        "    return _builders[cfg['name']](cfg)\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom kit.data import make_set\n\n\ndef main():\n"
        "    model = torch.nn.Linear(784, 10)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    train_set = make_set(dict(name='mnist', train=True))\n"
        "    loader = torch.utils.data.DataLoader(train_set, batch_size=64, shuffle=True)\n"
        "    for x, y in loader:\n        opt.zero_grad()\n        model(x).sum().backward()\n        opt.step()\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    result = port_source(script.read_text(), str(script))
    lines = [line.strip() for line in result.code.splitlines()]
    at = lines.index("train_set = make_set(dict(name='mnist', train=True))")
    # the table's builder may be the one called, and it downloads: every rank would download into 'data' at once
    assert _downloads_on_rank_0_first(lines, at)


def test_a_project_call_that_reaches_training_through_its_helpers_is_never_put_on_rank_0_alone():
    result = _port("trains_in_helpers/train.py")
    guarded = _guarded(result.code)
    # `fit` writes a log, but trains through the project's own functions (a step two calls down, an optimizer built
    # by a helper): on rank 0 alone the other ranks would wait for it at their next collective until the timeout
    assert "fit(net, 3, 'log.txt')" not in guarded and "fit(net, 3, \"log.txt\")" in result.code
    assert "report('report.txt', 'trained')" in guarded  # a helper of the same module that only writes
    assert result.exit_code == 3  # the writes fit makes on every rank are named


_TRAINS = ("opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor epoch in range(3):\n    opt.zero_grad()\n"
           "    model(torch.randn(8, 4)).sum().backward()\n    opt.step()\n")
"""A training loop over `model` at the top level of a script."""


def _ported_in(folder: Path, files: dict[str, str], source: str) -> str:
    """The port of `source`, a script train.py in `folder` beside the project modules `files` (name -> text)."""
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "train.py").write_text(source)
    return port_source(source, str(folder / "train.py")).code


def _before(code: str, text: str) -> str:
    lines = [line.strip() for line in code.splitlines()]
    return lines[next(i for i, line in enumerate(lines) if text in line) - 1]


def test_a_file_rank_0_saves_is_read_after_a_barrier_in_a_function_called_later_or_through_a_helper(tmp_path):
    (tmp_path / "helpers.py").write_text(
        "import torch\n\n\ndef save_checkpoint(path, model):\n    torch.save(model.state_dict(), path)\n\n\n"
        "def load_checkpoint(path, model):\n    model.load_state_dict(torch.load(path))\n")
    source = (
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "from helpers import save_checkpoint, load_checkpoint\n\nBEST = 'out/best.pt'\n\n\n"
        "def test(model):\n    model.load_state_dict(torch.load('out/last.pt'))\n    print(model.weight)\n\n\n"
        "def train(model, optimizer, loader):\n    best = 1e9\n"
        "    for epoch in range(3):\n        total = 0.0\n"
        "        for xb, yb in loader:\n            optimizer.zero_grad()\n"
        "            loss = torch.nn.functional.mse_loss(model(xb), yb)\n            loss.backward()\n"
        "            optimizer.step()\n            total += loss.item()\n"
        "        torch.save(model.state_dict(), 'out/last.pt')\n"
        "        if epoch == 2:\n            save_checkpoint(BEST, model)\n"
        "    test(model)\n    load_checkpoint(BEST, model)\n\n\n"
        "if __name__ == '__main__':\n"
        "    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)\n"
        "    net = torch.nn.Linear(4, 1)\n    train(net, torch.optim.SGD(net.parameters(), lr=0.1), loader)\n")
    script = tmp_path / "train.py"
    script.write_text(source)
    code = port_source(source, str(script)).code
    # test() runs after train() saved on rank 0: every rank waits for the file before it reads it
    assert _before(code, "torch.load('out/last.pt'").startswith("ddpkit.barrier(ctx)")
    # the project's load helper is handed the path the project's save helper wrote (rank 0 only)
    assert "save_checkpoint(BEST, ddpkit.unwrap(model))" in _guarded(code)
    assert _before(code, "load_checkpoint(BEST,").startswith("ddpkit.barrier(ctx)")
    assert code.count("ddpkit.barrier(ctx)") == 2


def test_a_script_in_a_subfolder_importing_its_project_from_the_folder_above_has_its_downloads_found(tmp_path):
    # run from the project's root (`python -m net.train`): `net/` holds a `net.py`, but `net.net` is net/net.py seen
    # from the root, so the root is where `data.loading` is read from too
    for folder in ("net", "data"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "net" / "net.py").write_text("import torch\n\n\nclass Net(torch.nn.Linear):\n    pass\n")
    (tmp_path / "data" / "loading.py").write_text(
        "from torchvision import datasets, transforms\n\n\ndef get_data():\n"
        "    return datasets.MNIST('data', train=True, download=True, transform=transforms.ToTensor())\n")
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\nfrom net.net import Net\n"
        "from data.loading import get_data\n\n"
        "data = get_data()\nloader = DataLoader(data, batch_size=8, shuffle=True)\nmodel = Net(784, 10)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor xb, yb in loader:\n    opt.zero_grad()\n"
        "    torch.nn.functional.cross_entropy(model(xb.flatten(1)), yb).backward()\n    opt.step()\n")
    script = tmp_path / "net" / "train.py"
    script.write_text(source)
    code = port_source(source, str(script)).code
    assert _before(code, "data = get_data()") == "ddpkit.barrier(ctx)"  # the others wait for rank 0's download
    assert "if not ctx.is_main:  # rank 0 downloads first" in code


def test_a_graph_dataset_a_project_helper_builds_downloads_on_rank_0_first(tmp_path):
    # no `download=` anywhere: dgl's dataset classes fetch when they are made, here inside the project's helper
    (tmp_path / "graphs.py").write_text(
        "from dgl.data import CoraGraphDataset\n\n\ndef load_graph():\n    data = CoraGraphDataset()\n"
        "    return data[0]\n")
    source = (
        "import torch\nfrom graphs import load_graph\n\ngraph = load_graph()\nmodel = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor epoch in range(3):\n    opt.zero_grad()\n"
        "    model(torch.randn(8, 4)).sum().backward()\n    opt.step()\n")
    script = tmp_path / "train.py"
    script.write_text(source)
    code = port_source(source, str(script)).code
    assert _before(code, "graph = load_graph()") == "ddpkit.barrier(ctx)"
    assert "if not ctx.is_main:  # rank 0 downloads first" in code


def test_word_vectors_a_project_function_fetches_download_on_rank_0_first_and_an_embedding_copy_does_not(tmp_path):
    # GloVe(name='6B') and torchtext's (experimental) datasets fetch into .vector_cache/.data on first use;
    # nn.Embedding.from_pretrained(vectors) only copies the tensor it is handed: no barrier around the model
    code = _ported_in(tmp_path, {
        "setup.py": "import torchtext\nfrom torchtext.experimental.datasets import IMDB\n\n\ndef init(config):\n"
                    "    vocab = IMDB(data_select='train')[0].get_vocab()\n"
                    "    config['vectors'] = torchtext.vocab.GloVe(name='6B')\n",
        "net.py": "import torch.nn as nn\n\n\nclass Net(nn.Linear):\n    def __init__(self, vectors):\n"
                  "        super().__init__(4, 1)\n        self.embedding = nn.Embedding.from_pretrained(vectors)\n"},
        "import torch\nfrom setup import init\nfrom net import Net\n\nconfig = {}\ninit(config)\n"
        "model = Net(config['vectors'])\n" + _TRAINS)
    assert _before(code, "init(config)") == "ddpkit.barrier(ctx)"  # the others wait for rank 0's download
    assert code.count("if not ctx.is_main:  # rank 0 downloads first") == 1  # around init only, not around Net(...)


def test_a_function_handed_the_settings_naming_a_file_rank_0_wrote_reads_it_after_a_barrier(tmp_path):
    # every rank scores the prediction file rank 0 just wrote: evaluate.main(args) opens args.prediction_file
    code = _ported_in(tmp_path, {
        "evaluate.py": "import json\n\n\ndef main(args):\n    with open(args.prediction_file) as f:\n"
                       "        return json.load(f)\n"},
        "import argparse\nimport json\nimport torch\nimport evaluate\n\n\ndef test(model, args):\n"
        "    answers = {'a': float(model(torch.randn(1, 4)).sum())}\n"
        "    with open(args.prediction_file, 'w') as f:\n        json.dump(answers, f)\n"
        "    return evaluate.main(args)\n\n\n"
        "parser = argparse.ArgumentParser()\nparser.add_argument('--prediction-file', default='prediction.out')\n"
        "args = parser.parse_args()\nmodel = torch.nn.Linear(4, 1)\n" + _TRAINS + "    print(test(model, args))\n")
    assert any(line.startswith("with open(args.prediction_file") for line in _guarded(code)), code
    assert _before(code, "return evaluate.main(args)").startswith("ddpkit.barrier(ctx)")


def test_a_download_at_import_before_init_is_a_todo_naming_it():
    # module level, before ddpkit.init: no ctx exists there to let rank 0 go first
    # (at the top of a script whose training is its top-level code it runs after ddpkit.init: rank 0 goes first)
    source = "import nltk\nimport torch\nnltk.download('punkt')\n\nif __name__ == '__main__':\n" + textwrap.indent(
        "model = torch.nn.Linear(4, 1)\n" + _TRAINS, "    ")
    result = port_source(source, "train.py")
    assert result.exit_code == 3
    assert any(t.line == 3 and "`nltk.download(...)` downloads on every rank at once, before ddpkit.init" in t.message
               for t in result.todos), [(t.line, t.message) for t in result.todos]


def test_a_project_helper_that_fetches_again_wherever_it_runs_is_a_todo_not_rank_0_first(tmp_path):
    helper = (
        "import os\nimport requests\n\n\nclass Ratings:\n    def __init__(self, root):\n        self.root = root\n"
        "        self.fetch()\n\n    def fetch(self):\n        target = os.path.join(self.root, 'r.zip')\n"
        "        req = requests.get('http://example.org/r.zip')\n"
        "        with open(target, 'wb') as out:\n            out.write(req.content)\n")
    source = (
        "import torch\nfrom ratings import Ratings\n\ndata = Ratings('data')\nmodel = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor epoch in range(3):\n    opt.zero_grad()\n"
        "    model(torch.randn(8, 4)).sum().backward()\n    opt.step()\n")
    script = tmp_path / "train.py"
    script.write_text(source)
    (tmp_path / "ratings.py").write_text(helper)
    result = port_source(source, str(script))
    # after rank 0's download the others would fetch and write the same zip again while their peers read it
    assert not any(line.strip().startswith("ddpkit.barrier") for line in result.code.splitlines())
    assert any("ratings.py:12 `requests.get(...)`), and fetches again wherever it runs" in t.message
               for t in result.todos)
    # behind a check for the file, the others find rank 0's file and fetch nothing: rank 0 first is right
    (tmp_path / "ratings.py").write_text(helper.replace(
        "        req = requests.get", "        if os.path.exists(target):\n            return\n        req = requests.get"))
    code = port_source(source, str(script)).code
    assert _before(code, "data = Ratings('data')") == "ddpkit.barrier(ctx)"


def test_a_file_the_projects_helper_makes_when_it_is_missing_is_made_on_rank_0_and_every_rank_waits_after(tmp_path):
    (tmp_path / "cache.py").write_text(
        "import os\nimport numpy as np\n\n\ndef build_cache(folder):\n"
        "    np.savez_compressed(os.path.join(folder, 'cache.npz'), x=np.zeros(4))\n")
    source = (
        "import os\nimport torch\nfrom cache import build_cache\n\n"
        "if not os.path.isfile('data/cache.npz'):\n    build_cache('data')\n"
        "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(3):\n    opt.zero_grad()\n    model(torch.randn(8, 4)).sum().backward()\n    opt.step()\n")
    script = tmp_path / "train.py"
    script.write_text(source)
    code = port_source(source, str(script)).code
    # one writer; the file may be read later by code the port does not see, so every rank waits where all pass
    assert "build_cache('data')" in _guarded(code)
    lines = [line for line in code.splitlines() if line.strip()]
    at = next(i for i, line in enumerate(lines) if "build_cache('data')" in line)
    assert lines[at + 1].startswith("ddpkit.barrier(ctx)")


def test_a_read_at_the_top_of_the_entry_function_gets_no_barrier_from_a_save_later_in_it():
    source = (
        "import numpy as np\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\n"
        "def main(path):\n    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        "    table = np.loadtxt(path)\n"
        "    loader = DataLoader(TensorDataset(torch.tensor(table[:, :4]).float(), torch.tensor(table[:, 4:]).float()),"
        " batch_size=8, shuffle=True)\n"
        "    model = torch.nn.Linear(4, 1)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for xb, yb in loader:\n        opt.zero_grad()\n"
        "        torch.nn.functional.mse_loss(model(xb), yb).backward()\n        opt.step()\n"
        "    torch.save(model.state_dict(), 'best.pt')\n    model.load_state_dict(torch.load('best.pt'))\n\n\n"
        "if __name__ == '__main__':\n    import argparse\n    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--table', default='table.txt')\n    args = parser.parse_args()\n"
        "    main(args.table)\n")
    code = port_source(source, "entry_reads.py").code
    # main is called once, from the block that holds it: its own save comes after this read
    assert not _before(code, "table = np.loadtxt(path)").startswith("ddpkit.barrier")
    assert _before(code, "torch.load('best.pt'").startswith("ddpkit.barrier(ctx)")


def test_a_log_file_or_a_write_left_before_ddpkit_init_is_a_todo_not_ported_fully():
    """The port keeps the argument parsing before ddpkit.init, and with it the lines above it: a log file every rank
    opens there (`filemode="w"`: each truncates it) or a file every rank copies there has no ctx to guard it."""
    source = '''import argparse
import logging
import shutil
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

logging.basicConfig(filename="train.log", filemode="w", level=logging.INFO)
shutil.copy("config.yaml", "runs/config.yaml")
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

model = nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(args.epochs):
    for xb, yb in DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=8):
        loss = ((model(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    logging.info("epoch %d", epoch)
'''
    result = port_source(source, "train.py")
    assert result.exit_code == 3 and "ported fully" not in result.message
    before = {t.line: t.message for t in result.todos if "before ddpkit.init" in t.message}
    assert sorted(before) == [8, 9], result.todos
    assert "`logging.basicConfig(...)`" in before[8] and "`shutil.copy(...)`" in before[9]
    lines = result.code.splitlines()
    assert lines.index('parser = argparse.ArgumentParser()') < lines.index("ctx = ddpkit.init()")  # parsing stays first
def test_a_file_a_function_of_the_script_writes_to_the_path_it_is_given_is_read_after_a_barrier():
    code = _port("handed_path/train.py").code
    lines = [line.strip() for line in code.splitlines()]
    # rank 0 writes the file the function is handed the path of; the project's dataset handed that path reads it
    at = lines.index("data = Rows(rows_path)")
    assert lines[at - 1].startswith("ddpkit.barrier(ctx)"), code
    assert lines.index("write_rows(list(range(64)), rows_path, ctx=ctx)") < at - 1


_PLOTS_AFTER = '''
import matplotlib.pyplot as plt
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def training_plots(losses, save_path="curves.png"):
    plt.plot(losses)
    plt.savefig(save_path)
    plt.show()


def summary(losses):
    return min(losses)


def train():
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    losses = train()
    best = summary(losses)
    training_plots(losses)
'''


def test_a_plot_the_main_block_draws_after_the_entry_returns_is_named():
    # `training_plots` runs after the entry function returned (its ddpkit context closed), on every rank: every
    # rank saves the same PNG and opens a window; `summary` only computes
    result = port_source(_PLOTS_AFTER, "train.py")
    todos = {t.line: t.message for t in result.todos}
    assert set(todos) == {36}, todos
    assert "`training_plots(losses)`" in todos[36] and "line 10 `plt.savefig" in todos[36] \
        and "plt.show" in todos[36] and "every rank" in todos[36], todos[36]
