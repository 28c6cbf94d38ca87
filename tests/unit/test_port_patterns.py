"""`ddpkit port` on the shapes that made it claim success on wrong training: each port is correct or says why not."""

from __future__ import annotations

import ast
from pathlib import Path

from ddpkit.port import main, port_source

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


def _port(name: str):
    path = FIXTURES / f"{name}.py"
    return port_source(path.read_text(), str(path))


def _todo_lines(result) -> dict[int, str]:
    return {t.line: t.message for t in result.todos}


def test_counts_over_an_inline_test_loader_are_reduced_and_keep_their_type():
    result = _port("digits_plain")
    code = result.code
    assert result.exit_code == 0, result.todos
    ast.parse(code)
    assert "for xb, yb in ddpkit.eval_loader(test, ctx, batch_size=100):" in code  # inline, still an eval loader
    # a tensor counter stays a tensor (the script calls .float() on it), reduced after the loop
    loop = code.index("correct += (ddpkit.unwrap(model)(xb).argmax(1) == yb).sum()")
    reduced = code.index("correct = ddpkit.all_reduce_sum(ctx, correct).to(correct.dtype)")
    assert loop < reduced < code.index("correct.float().item() / len(test)")
    # a loss summed over batches, divided by every rank's batches
    assert "loss_sum = ddpkit.all_reduce_sum(ctx, loss_sum).item()" in code
    assert '"train_loss": loss_sum / ddpkit.all_reduce_sum(ctx, len(train_loader)).item()' in code


def test_split_device_flag_argument_parsing_and_files_of_a_plain_script():
    code = _port("digits_plain").code
    # the split is made after ddpkit.init's per-rank seeds: a fixed generator gives every rank the same split
    assert "random_split(data, [len(data) - n_test, n_test], generator=torch.Generator().manual_seed(0))" in code
    assert "args = get_args()\n    with ddpkit.init(" in code  # argument parsing stays outside init
    # the script's own seed after init is kept (splits and init agree) and flagged: augmentation is alike per rank
    assert "# ddpkit port: this seeds every rank alike after ddpkit.init" in code.split("torch.manual_seed(0)")[0]
    assert "args.device" not in code.split("with ddpkit.init")[1]
    assert "os.makedirs(args.out, exist_ok=True)" in code
    write = code.index('        if ctx.is_main:\n            with open(os.path.join(args.out, "history.csv"), "w"')
    barrier = code.index("ddpkit.barrier(ctx)", write)
    assert barrier < code.index('with open(os.path.join(args.out, "history.csv")) as f:')


def test_model_methods_in_the_training_step_are_todos_and_a_second_module_is_wrapped():
    result = _port("model_methods")
    todos = _todo_lines(result)
    assert result.exit_code == 3 and set(todos) == {31, 33}, todos
    assert "head = ddpkit.wrap(nn.Linear(4, 3), ctx)" in result.code  # in the same optimizer: wrapped too
    for line in (31, 33):
        assert "not its forward" in todos[line] and "own copy" in todos[line]
    assert result.code.count("# TODO(ddpkit port): `model.encode(...)` trains through a method") == 1
    assert "sample = ddpkit.unwrap(model).decode(" in result.code  # no gradients: no DDP synchronisation needed


def test_downloads_files_trackers_and_a_load_after_a_rank_zero_save():
    result = _port("side_effects")
    code = result.code
    assert result.exit_code == 0, result.todos
    first = ("        if not ctx.is_main:  # rank 0 downloads first; the others then read its files\n"
             "            ddpkit.barrier(ctx)\n"
             '        train_set = datasets.MNIST("data", train=True, download=True, transform=transforms.ToTensor())\n'
             "        if ctx.is_main:\n            ddpkit.barrier(ctx)\n")
    assert first in code
    assert '            os.makedirs("out", exist_ok=True)' in code
    assert '        if ctx.is_main:\n            writer = SummaryWriter("out/tb")' in code
    assert "                if ctx.is_main:\n                    writer.add_scalar(" in code
    assert '        if ctx.is_main:\n            plt.savefig("out/acc.png")' in code
    assert '        if ctx.is_main:\n            np.save("out/acc.npy"' in code
    assert ("        ddpkit.barrier(ctx)  # rank 0 may have just written what this reads\n"
            '        ddpkit.unwrap(model).load_state_dict(torch.load("out/best.pt", map_location=ctx.device))') in code


def test_per_rank_decisions_and_peeks_are_todos_and_collected_predictions_are_joined():
    result = _port("per_rank_state")
    todos = _todo_lines(result)
    assert result.exit_code == 3 and set(todos) == {18, 31, 32}, todos
    assert todos[18].startswith("next(iter(...)) on the training loader")
    assert todos[31].startswith("ReduceLROnPlateau") and "early stopping" in todos[32]
    # filled over the evaluation shard, used after the loop: joined across ranks there, on every rank
    joined = ("                labels.extend(yb.tolist())\n            preds = ddpkit.gather_list(ctx, preds)  # every "
              "rank's entries, joined in rank order\n            labels = ddpkit.gather_list(ctx, labels)")
    assert joined in result.code
    # the validation loader built in a helper stays an evaluation loader
    assert "    return ddpkit.eval_loader(dataset, ctx, batch_size=64)" in result.code


def test_a_decision_on_reduced_values_is_not_a_todo():
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n\ndef validate(model, val_loader):\n"
           "    total = 0.0\n    n = 0\n    with torch.no_grad():\n        for x, y in val_loader:\n"
           "            total += model(x).sum().item()\n            n += 1\n    return total / n\n\n\n"
           "def main():\n    train_loader = DataLoader(train_ds, batch_size=8, shuffle=True)\n"
           "    val_loader = DataLoader(val_ds, batch_size=8)\n    model = Net()\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)\n    for epoch in range(9):\n"
           "        for x, y in train_loader:\n            model(x).sum().backward()\n"
           "        val_loss = validate(model, val_loader)\n        sched.step(val_loss)\n"
           "        if val_loss < 0.1:\n            break\n\n\nif __name__ == '__main__':\n    main()\n")
    result = port_source(src)
    assert result.todos == []
    # the batch counter divides a reduced sum: it counts every rank's batches too
    assert "    n = int(ddpkit.all_reduce_sum(ctx, n).item())" in result.code


def test_a_library_dataloader_is_kept_with_a_todo():
    result = _port("library_loader")
    todos = _todo_lines(result)
    assert result.exit_code == 3 and "torch_geometric.loader" in todos[20], todos
    assert "train_loader = DataLoader(dataset[:150], batch_size=32, shuffle=True)" in result.code
    names_device = "device" in (FIXTURES / "library_loader.py").read_text()
    assert ("batches stay on the CPU while ddpkit.wrap puts the model on ctx.device" in todos[20]) is not names_device


def test_a_kept_library_loader_in_a_script_that_names_no_device_says_its_batches_stay_on_the_cpu():
    src = ("import torch\nfrom torch_geometric.loader import DataLoader\nfrom torch_geometric.datasets import TUDataset\n\n"
           "data = TUDataset(root='graphs', name='MUTAG')\nloader = DataLoader(data, batch_size=16, shuffle=True)\n"
           "model = torch.nn.Linear(7, 2)\nopt = torch.optim.Adam(model.parameters())\n"
           "for epoch in range(3):\n    for batch in loader:\n        loss = model(batch.x).sum()\n"
           "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n")
    result = port_source(src, "graphs.py")
    (todo,) = [t for t in result.todos if "torch_geometric.loader" in t.message]
    assert "batches stay on the CPU while ddpkit.wrap puts the model on ctx.device" in todo.message
    moved = src.replace("for batch in loader:\n", "for batch in loader:\n        batch = batch.to('cuda')\n")
    (todo,) = [t for t in port_source(moved, "graphs.py").todos if "torch_geometric.loader" in t.message]
    assert "stay on the CPU" not in todo.message  # the script moves its batches itself


def test_device_flags_and_comparisons_follow_ctx_device():
    src = ("import argparse\nimport torch\nfrom torch.utils.data import DataLoader\n\n\ndef main():\n"
           "    p = argparse.ArgumentParser()\n    p.add_argument('--device', default='cpu')\n    args = p.parse_args()\n"
           "    device = args.device\n    if device == 'cuda':\n        torch.backends.cudnn.benchmark = True\n"
           "    noise = torch.randn(4, device=args.device)\n"
           "    loader = DataLoader(ds, batch_size=8, shuffle=True)\n    model = Net().to(device)\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\n\nif __name__ == '__main__':\n    main()\n")
    code = port_source(src).code
    assert "        device = ctx.device\n        if device.type == 'cuda':\n" in code
    assert "noise = torch.randn(4, device=ctx.device)" in code


def test_top_level_argument_parsing_after_constants_stays_before_init():
    src = ("import argparse\nimport torch\nfrom torch.utils.data import DataLoader\n\nEPOCHS = 3\n"
           "parser = argparse.ArgumentParser()\nparser.add_argument('--lr', type=float, default=0.1)\n"
           "args = parser.parse_args()\nloader = DataLoader(ds, batch_size=8, shuffle=True)\nmodel = Net()\n"
           "opt = torch.optim.SGD(model.parameters(), lr=args.lr)\n")
    code = port_source(src).code
    assert "args = parser.parse_args()\nctx = ddpkit.init()\n" in code
    assert code.endswith("ctx.close()  # every rank leaves the process group together\n")


def test_porting_a_file_with_todos_again_exits_3_and_lists_them(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text((FIXTURES / "per_rank_state.py").read_text())
    assert main([str(script)]) == 3
    ported = tmp_path / "train_ddp.py"
    text = ported.read_text()
    assert text.count("# TODO(ddpkit port): ") == 3
    capsys.readouterr()
    assert main([str(ported), "--in-place"]) == 3
    out = capsys.readouterr().out
    assert "nothing to change" not in out and "3 `TODO(ddpkit port)` comment(s) remain" in out
    assert f"{ported}:" in out and "TODO next(iter(...))" in out
    assert ported.read_text() == text
    done = text.replace("# TODO(ddpkit port): ", "# fixed: ")
    ported.write_text(done)
    assert main([str(ported)]) == 0 and "nothing to change" in capsys.readouterr().out


def test_throughput_ema_copies_and_attribute_checks():
    src = ("import copy\nimport time\nimport torch\nfrom torch.utils.data import DataLoader\n\n\ndef main():\n"
           "    loader = DataLoader(ds, batch_size=8, shuffle=True)\n    model = Net()\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    ema = copy.deepcopy(model)\n"
           "    for x, y in loader:\n        t0 = time.time()\n        loss = model(x).sum()\n"
           "        if hasattr(model, 'aux_loss'):\n            loss = loss + model.aux_loss\n"
           "        loss.backward()\n        tokens_per_sec = x.numel() / (time.time() - t0)\n"
           "        print(tokens_per_sec)\n\n\nif __name__ == '__main__':\n    main()\n")
    result = port_source(src)
    assert result.todos == []
    assert "tokens_per_sec = (x.numel() / (time.time() - t0)) * ctx.world_size" in result.code
    assert "ema = copy.deepcopy(ddpkit.unwrap(model))" in result.code
    assert "if hasattr(ddpkit.unwrap(model), 'aux_loss'):" in result.code


def test_a_per_rank_batch_of_zero_names_the_port():
    import pytest
    import torch
    from torch.utils.data import TensorDataset

    import ddpkit

    with pytest.raises(ValueError, match=r"batch_size=0 .*`ddpkit port`.*B // ctx.world_size.*at most B ranks"):
        ddpkit.loader(TensorDataset(torch.zeros(4)), None, batch_size=8 // 16)


def test_torch_dataloader_under_a_module_alias_is_not_a_library_loader():
    src = ("import torch\nimport torch.utils.data as Data\n\n\ndef main():\n"
           "    loader = Data.DataLoader(ds, batch_size=8, shuffle=True)\n    model = Net()\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\n\nif __name__ == '__main__':\n    main()\n")
    result = port_source(src)
    assert result.todos == [] and "ddpkit.loader(ds, ctx, batch_size=8 // ctx.world_size" in result.code


def test_a_forward_that_never_reaches_backward_and_an_input_made_on_the_cpu():
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n"
           "test_x = torch.unsqueeze(test_data.data, dim=1).type(torch.FloatTensor)[:2000] / 255.\n"
           "train_data = MNIST('./mnist', train=True, download=DOWNLOAD_MNIST)\n"
           "loader = DataLoader(train_data, batch_size=50, shuffle=True)\ncnn = CNN()\n"
           "opt = torch.optim.Adam(cnn.parameters(), lr=0.01)\nfor epoch in range(2):\n"
           "    running = 0.0\n"
           "    for step, (b_x, b_y) in enumerate(loader):\n        loss = loss_func(cnn(b_x)[0], b_y)\n"
           "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n        running += loss.item()\n"
           "        if step % 50 == 0:\n            test_output, last_layer = cnn(test_x)\n"
           "            print(running / (step + 1))\n")
    result = port_source(src)
    code = result.code
    assert "loss = loss_func(cnn(b_x)[0], b_y)" in code  # the training forward stays on the DDP module
    assert "test_output, last_layer = ddpkit.unwrap(cnn)(test_x)" in code  # no backward: never through DDP
    # a new tensor made on the CPU and given to the model: made on ctx.device where it is assigned
    assert result.todos == [] and "test_x = (torch.unsqueeze(test_data.data, dim=1).type(torch.FloatTensor)[:2000] " \
        "/ 255.).to(ctx.device)\n" in code
    assert "if not ctx.is_main:  # rank 0 downloads first" in code  # download=<a variable> may download
    # a running loss printed inside the loop: the mean over ranks, reduced where it is read
    assert "ddpkit.print0(ctx, (ddpkit.all_reduce_sum(ctx, running).item() / ctx.world_size) / (step + 1))" in code


def test_default_device_parameters_batch_of_one_and_datasets_on_the_device():
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n\n"
           "def train(n_epoch=3, device='cuda:0'):\n    ds = SoundDataset(ANNOTATIONS, device)\n"
           "    loader = DataLoader(ds, batch_size=1, shuffle=True)\n    model = Net()\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for x, y in loader:\n"
           "        model(x).sum().backward()\n    print(model.sample(4, device))\n\n\n"
           "if __name__ == '__main__':\n    train()\n")
    result = port_source(src)
    todos = _todo_lines(result)
    assert ("    with ddpkit.init() as ctx:\n        ddpkit.rng.seed_everything(ctx.seed)  # one seed on every rank "
            "until training: data shuffled or split before it agrees\n        device = ctx.device\n") in result.code
    assert 7 in todos and 6 not in todos, todos  # the dataset on ctx.device: its loader does not pin
    assert todos[7].startswith("the batch size is 1") and "shuffle=True, pin_memory=False)" in result.code
    workers = port_source(src.replace("batch_size=1,", "batch_size=8, num_workers=2,"))
    assert _todo_lines(workers)[6].startswith("the dataset is given the device")  # CUDA in forked workers


def test_a_loop_that_draws_with_next_and_logs_a_running_sum_kept_in_a_dict():
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n\ndef main():\n"
           "    loader = DataLoader(ds, batch_size=8, shuffle=True)\n    model = Net()\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    state = {'running_loss': 0}\n"
           "    batches = iter(loader)\n    for i in range(len(loader)):\n        batch = next(batches)\n"
           "        loss = model(batch).sum()\n        loss.backward()\n"
           "        state['running_loss'] += loss.item()\n        if i % 10 == 0:\n"
           "            info = {'loss': state['running_loss'] / 10}\n            LOGGER.info(info)\n"
           "            state['running_loss'] = 0\n\n\nif __name__ == '__main__':\n    main()\n")
    result = port_source(src)
    assert result.todos == []
    assert ("info = {'loss': (ddpkit.all_reduce_sum(ctx, state['running_loss']).item() / ctx.world_size) / 10}"
            in result.code)


def test_no_collective_inside_an_evaluation_loop():
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n\ndef evaluate(model, test_loader):\n"
           "    correct = 0\n    with torch.no_grad():\n        for i, (x, y) in enumerate(test_loader):\n"
           "            correct += (model(x).argmax(1) == y).sum().item()\n            if i % 10 == 0:\n"
           "                print(correct)\n    return correct\n\n\ndef main():\n"
           "    train_loader = DataLoader(train_ds, batch_size=8, shuffle=True)\n"
           "    test_loader = DataLoader(test_ds, batch_size=8)\n    model = Net()\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    print(evaluate(model, test_loader))\n\n\n"
           "if __name__ == '__main__':\n    main()\n")
    code = port_source(src).code
    assert "ddpkit.print0(ctx, correct)\n" in code  # shards differ by a batch: a collective here could hang
    assert code.count("ddpkit.collectives.all_reduce_number(ctx, correct)") == 1  # once, after the loop


def test_a_download_behind_a_check_of_the_disk_is_a_todo():
    src = ("import os\nimport urllib.request\nimport torch\nfrom torch.utils.data import DataLoader\n\n\n"
           "def main():\n    if not os.path.exists('data.npz'):\n"
           "        urllib.request.urlretrieve(URL, 'data.npz')\n    if DOWNLOAD:\n"
           "        urllib.request.urlretrieve(URL, 'more.npz')\n"
           "    loader = DataLoader(ds, batch_size=8, shuffle=True)\n    model = Net()\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\n\nif __name__ == '__main__':\n    main()\n")
    result = port_source(src)
    todos = _todo_lines(result)
    # rank 1 may find the file rank 0 has just written and skip the branch: a barrier there would hang
    assert set(todos) == {9} and todos[9].startswith("a download inside a branch"), todos
    assert "    if not ctx.is_main:  # rank 0 downloads first" in result.code  # the constant-flag branch is fine


def test_an_averaging_meter_of_this_file_is_reduced_and_file_side_effects_run_on_rank_0():
    result = _port("meter_eval")
    code = result.code
    assert result.exit_code == 0, result.todos
    ast.parse(code)
    # the meter's sum and count are summed over ranks after the loop, its average recomputed the class's way
    loop = code.index("hits.update(acc, xb.size(0))")
    total = code.index("hits.sum = ddpkit.all_reduce_sum(ctx, hits.sum)")
    count = code.index("hits.count = ddpkit.all_reduce_sum(ctx, hits.count)")
    avg = code.index("hits.avg = hits.sum / hits.count")
    assert loop < total < count < avg < code.index("return hits.avg, hits.count")
    # copies, removals and the script's own logger object: one rank
    assert "if ctx.is_main:\n                    shutil.copyfile(" in code
    assert "if ctx.is_main:\n            os.remove(" in code
    assert "if ctx.is_main:\n            logger = LineLogger(" in code
    assert "if ctx.is_main:\n                logger.log(" in code


def test_figures_of_one_rank_the_port_cannot_follow_are_named_not_claimed():
    result = _port("shard_figures")
    assert result.exit_code == 3
    messages = [t.message for t in result.todos]
    assert all(m.startswith("not checked: ") for m in messages), messages
    todos = _todo_lines(result)
    # a loss sum over ranks divided by this rank's own last batch index
    assert any("`loss_total / batch_no`" in t.message and t.line == 35 for t in result.todos)
    # an accuracy computed inside the loop from this rank's counts, then printed after it
    assert any("`train_acc`" in t.message and t.line == 35 for t in result.todos)
    assert "`per_class`" in todos[43]  # per-class counts in a dict
    assert "`score_loader(...)`" in todos[44] and "`test_loader`" in todos[44]  # a helper from another file
    assert len(result.todos) == 4


def test_a_run_time_typed_sum_keeps_a_numpy_scalar_a_numpy_scalar():
    import types

    import numpy as np
    import torch

    from ddpkit.port.sums import reduce_statement

    fake = types.SimpleNamespace(all_reduce_sum=lambda ctx, value: torch.as_tensor(value) * 2,
                                 collectives=types.SimpleNamespace(all_reduce_number=lambda ctx, value: value * 2))
    for value, expected in ((np.int64(5), np.int64(10)), (torch.tensor(3, dtype=torch.int32), 6), (2.5, 5.0)):
        scope = {"ddpkit": fake, "ctx": None, "total": value}
        exec(reduce_statement("total", "any"), scope)  # noqa: S102 - the generated line, as the port writes it
        assert scope["total"] == expected and type(scope["total"]) is type(value)
        if isinstance(value, torch.Tensor):
            assert scope["total"].dtype == torch.int32


def test_a_sum_read_inside_the_with_around_its_loop_and_library_log_lines():
    source = (
        "import logging\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom tqdm import tqdm\n"
        "from tensorboard_logger import configure, log_value\n\n\n"
        "def main(board):\n"
        "    if board: configure('runs/x')\n"
        "    logging.getLogger().addHandler(logging.FileHandler('train.log'))\n"
        "    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))\n"
        "    loader = DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = torch.nn.Linear(3, 1)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(2):\n"
        "        seen = 0\n"
        "        with tqdm(total=len(loader)) as bar:\n"
        "            for x, y in loader:\n"
        "                opt.zero_grad()\n"
        "                torch.nn.functional.mse_loss(model(x), y).backward()\n"
        "                opt.step()\n"
        "                seen += x.size(0)\n"
        "            log_value('seen', seen, epoch)\n"
        "        tqdm.write(f'epoch {epoch}')\n\n\n"
        "if __name__ == '__main__':\n    main(True)\n")
    result = port_source(source, "with_loop.py")
    code = result.code
    ast.parse(code)
    # the sum is read inside the `with`: it is reduced right after its loop, not after the `with`
    reduced = code.index("seen = int(ddpkit.all_reduce_sum(ctx, seen).item())")
    assert code.index("seen += x.size(0)") < reduced < code.index("log_value('seen', seen, epoch)")
    assert "if ctx.is_main:\n                    log_value('seen', seen, epoch)" in code
    assert "if ctx.is_main:\n                tqdm.write(" in code
    assert "if ctx.is_main:\n            if board: configure('runs/x')" in code
    # a log file every rank appends to: named, not claimed
    assert [t.line for t in result.todos] == [10] and "FileHandler" in result.todos[0].message
    assert result.exit_code == 3


def test_a_running_sum_logged_on_rank_0_is_summed_by_every_rank_before_the_rank_0_line():
    result = _port("tracker_running_sum")
    code = result.code
    ast.parse(code)
    # a collective inside `if ctx.is_main:` would wait forever for the other ranks: every rank sums first
    before, guarded = code.split("if ctx.is_main:\n            writer.add_scalar(")
    assert "all_reduce_sum" not in guarded.split("\n")[0]
    assert "running_all_ranks = ddpkit.all_reduce_sum(ctx, running)" in before.rsplit("\n", 2)[-2]
    assert "(running_all_ranks / ctx.world_size) / 4" in guarded.split("\n")[0]
    assert result.exit_code == 0, result.todos


def test_a_per_rank_count_bound_to_a_name_is_followed_or_named():
    result = _port("count_by_name")
    code = result.code
    ast.parse(code)
    # `train_steps = len(train_loader)`, bound once: the mean divides by every rank's batches
    assert "running_loss / ddpkit.all_reduce_sum(ctx, train_steps).item()" in code
    assert "train_steps = len(train_loader)" in code
    # `steps = i + 1` of the loop's counter: not followed, so not claimed
    assert result.exit_code == 3
    todos = _todo_lines(result)
    assert len(todos) == 1
    message = next(iter(todos.values()))
    assert message.startswith("not checked: `total_loss / steps`")
    lines = [s.strip() for s in code.splitlines()]
    assert lines[lines.index("return total_loss / steps") - 1].startswith("# TODO(ddpkit port): not checked:")


def test_a_checkpoint_dict_built_in_a_variable_saves_the_unwrapped_model():
    result = _port("checkpoint_in_variable")
    code = result.code
    assert result.exit_code == 0, result.todos
    ast.parse(code)
    assert 'state = {"epoch": epoch, "model": ddpkit.unwrap(model), "optimizer": optimizer.state_dict()}' in code
    assert 'final = {"weights": ddpkit.unwrap(model).state_dict(), "epochs": 2}' in code
    assert '"model": model' not in code


def test_a_module_level_count_name_is_followed_and_a_rebound_one_is_named():
    src = ("import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
           "x = torch.randn(64, 8)\ny = (x.sum(1) > 0).long()\n"
           "loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)\n"
           "model = nn.Linear(8, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nn = len(loader)\n"
           "for epoch in range(2):\n    total = 0.0\n    for a, b in loader:\n"
           "        loss = nn.functional.cross_entropy(model(a), b)\n        opt.zero_grad()\n"
           "        loss.backward()\n        opt.step()\n        total += loss.item()\n    print(total / n)\n")
    once = port_source(src, "once.py")
    assert once.exit_code == 0, once.todos
    assert "total / ddpkit.all_reduce_sum(ctx, n).item()" in once.code
    rebound = port_source(src + "    n = len(loader) - 1\n", "rebound.py")
    assert rebound.exit_code == 3
    assert [t.message.split("`")[1] for t in rebound.todos] == ["total / n"]
    assert "all_reduce_sum(ctx, n)" not in rebound.code.replace("# TODO", "#").split("print0")[1].split("\n")[0]


def test_a_reduced_loss_read_through_item_stays_a_tensor_until_item():
    # `loss.item()` in a report: the reduced value is read with the script's own `.item()`, once
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n"
           "loader = DataLoader(ds, batch_size=32, shuffle=True)\nnet = Net()\n"
           "opt = torch.optim.Adam(net.parameters(), lr=0.01)\nfor epoch in range(2):\n"
           "    for i, (x, y) in enumerate(loader):\n        loss = loss_fn(net(x), y)\n"
           "        loss += 0.001 * penalty(net)\n"
           "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
           "        print('[%d: %d] train loss: %f' % (epoch, i, loss.item()))\n")
    code = port_source(src).code
    assert ".item()).item()" not in code and ".item() / ctx.world_size).item()" not in code
    assert "(ddpkit.all_reduce_sum(ctx, loss) / ctx.world_size).item()" in code


def test_lists_and_text_grown_in_a_training_loop_are_never_summed_over_ranks():
    # all_reduce_sum takes numbers: a label list or a report string read in a report inside the loop is not one
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n"
           "loader = DataLoader(ds, batch_size=32, shuffle=True)\nnet = Net()\n"
           "opt = torch.optim.Adam(net.parameters(), lr=0.01)\nfor epoch in range(2):\n"
           "    y_true = []\n"
           "    for i, (x, y) in enumerate(loader):\n        out = net(x)\n        loss = loss_fn(out, y)\n"
           "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
           "        y_true += y.cpu().numpy().tolist()\n"
           "        if i % 100 == 0:\n"
           "            line = 'seen: '\n            line += f'{len(y_true)} |'\n"
           "            print(line, y_true[-1])\n")
    code = port_source(src).code
    assert "all_reduce_sum(ctx, y_true)" not in code and "all_reduce_sum(ctx, line)" not in code


def test_a_mkdir_helper_of_the_scripts_own_module_runs_on_rank_0_first_and_keeps_its_signature():
    # `utils.mkdir(path)` is the script's own function, not os/pathlib: no exist_ok keyword it may not take
    src = ("import os\nimport torch\nimport utils\nfrom torch.utils.data import DataLoader\n\n"
           "utils.mkdir('checkpoints')\nos.makedirs('logs')\n"
           "loader = DataLoader(ds, batch_size=32, shuffle=True)\nnet = Net()\n"
           "opt = torch.optim.Adam(net.parameters(), lr=0.01)\nfor epoch in range(2):\n"
           "    for x, y in loader:\n        loss = loss_fn(net(x), y)\n"
           "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n")
    result = port_source(src)
    code = result.code
    assert "utils.mkdir('checkpoints')\n" in code and "exist_ok" not in code.split("utils.mkdir")[1].split("\n")[0]
    assert "if not ctx.is_main:  # rank 0 creates first; the others then read its files\n    ddpkit.barrier(ctx)\n" \
        "utils.mkdir('checkpoints')\nif ctx.is_main:\n    ddpkit.barrier(ctx)\n" in code
    assert "os.makedirs('logs', exist_ok=True)" in code


def test_a_forward_run_for_the_loss_it_stores_on_the_model_goes_through_the_wrapper():
    # `model(x)` then `loss = model.loss; loss.backward()`: the forward is the training step's own; calling the
    # unwrapped model there would leave DDP's gradient averaging out (each rank trains its own copy)
    code = _port("loss_on_the_model").code
    ast.parse(code)
    assert "ddpkit.unwrap(model)(x)" not in code
    step = code.index("            model(x)\n")
    assert step < code.index("loss = ddpkit.unwrap(model).loss") < code.index("loss.backward()")


def test_a_training_loader_with_workers_keeps_starting_them_each_epoch():
    # the script changes its dataset between epochs (`loader.dataset.resample()`); DataLoader's workers start anew
    # each epoch and see it, ddpkit.loader's persist by default and would keep the first epoch's draw
    result = _port("resampled_each_epoch")
    ast.parse(result.code)
    assert ("ddpkit.loader(data, ctx, batch_size=32 // ctx.world_size, shuffle=True, num_workers=2, "
            "persistent_workers=False)") in result.code


def test_a_main_that_parses_and_returns_an_exit_status_is_the_entry_point_not_a_parser():
    # `exit(main())` where main() parses its arguments, hands the model to a trainer of another module and returns
    # 0: the port took main() for an argument parser, found no entry point and refused the script
    src = ("import argparse\nimport torch\nfrom trainer import fit\n\n\ndef main():\n"
           "    parser = argparse.ArgumentParser()\n    parser.add_argument('--epochs', type=int, default=1)\n"
           "    args = parser.parse_args()\n    model = torch.nn.Linear(2, 1)\n    fit(model, args.epochs)\n"
           "    return 0\n\n\nif __name__ == '__main__':\n    exit(main())\n")
    result = port_source(src, "train.py")
    body = result.code[result.code.index("def main():"):]
    assert body.index("args = parser.parse_args()") < body.index("with ddpkit.init() as ctx:") < body.index("fit(")
    assert result.exit_code == 3 and result.todos  # the trainer in another module is not ported: said, not claimed


def test_a_module_docstring_naming_a_dataloader_builds_nothing_at_module_level():
    # the words of a docstring are not code: the port put ddpkit.init() at module level, outside main(), and its
    # ctx.close() after `exit(main())` never ran
    code = _port("resampled_each_epoch").code
    body = code[code.index("def main():"):code.index("if __name__")]
    assert "with ddpkit.init() as ctx:" in body and "ctx = ddpkit.init()" not in code


def test_a_compiled_models_orig_mod_becomes_the_unwrapped_model():
    # ddpkit.unwrap strips torch.compile as well as DDP: `ddpkit.unwrap(model)._orig_mod` raised AttributeError at
    # the first save
    src = ("import torch\nimport torch.nn as nn\n\n\ndef main():\n    model = torch.compile(nn.Linear(4, 1))\n"
           "    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
           "    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
           "    for x, y in torch.utils.data.DataLoader(data, batch_size=16, shuffle=True):\n"
           "        loss = nn.functional.mse_loss(model(x), y)\n        opt.zero_grad()\n        loss.backward()\n"
           "        opt.step()\n    torch.save({'model': model._orig_mod.state_dict()}, 'ckpt.pt')\n\n\n"
           "if __name__ == '__main__':\n    main()\n")
    code = port_source(src, "train.py").code
    assert "_orig_mod" not in code
    assert "torch.save({'model': ddpkit.unwrap(model).state_dict()}, 'ckpt.pt')" in code


def test_a_device_option_of_gpu_numbers_is_named_not_replaced_by_ctx_device():
    # `--device 0,1` parsed into ints: `int(ctx.device)` raised TypeError at startup on every rank
    src = ("import argparse\nimport torch\n\n\ndef main():\n    parser = argparse.ArgumentParser()\n"
           "    parser.add_argument('--device', default='0', type=str)\n    args = parser.parse_args()\n"
           "    args.device = [int(d) for d in args.device.split(',')]\n"
           "    model = torch.nn.Linear(4, 1).cuda(args.device[0])\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
           "    for x, y in torch.utils.data.DataLoader(data, batch_size=16, shuffle=True):\n"
           "        loss = torch.nn.functional.mse_loss(model(x), y)\n        opt.zero_grad()\n"
           "        loss.backward()\n        opt.step()\n\n\nif __name__ == '__main__':\n    main()\n")
    result = port_source(src, "train.py")
    assert "ctx.device.split" not in result.code and "int(ctx.device)" not in result.code
    assert any("holds GPU numbers (default '0')" in t.message for t in result.todos)
    assert result.exit_code == 3


def test_a_file_the_projects_code_writes_on_rank_0_is_whole_before_any_rank_reads_on():
    # `make_data.write_series(...)` then `make_data.read_series(...)`: the port put the write on rank 0 and the
    # other ranks read the file before (or while) it was written; the paths are the project's, not the script's
    code = _port("project_writes_data/train").code
    ast.parse(code)
    write = code.index('            make_data.write_series()')
    wait = code.index("        ddpkit.barrier(ctx)", write)
    assert write < wait < code.index("make_data.read_series(") and code.count("ddpkit.barrier(ctx)") == 1


def test_sampler_none_is_no_sampler():
    # `DataLoader(..., sampler=None)` spells DataLoader's default: the port took it for a custom sampler, kept the
    # loader and left every rank training on all of the data
    src = (
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\ndef main():\n"
        "    train = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
        "    loader = DataLoader(train, batch_size=16, shuffle=True, sampler=None)\n"
        "    model = torch.nn.Linear(4, 1)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x, y in loader:\n        loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    result = port_source(src, "train.py")
    assert "loader = ddpkit.loader(train, ctx, batch_size=16 // ctx.world_size, shuffle=True)" in result.code
    assert result.exit_code == 0, result.todos


def test_a_gpu_device_under_any_name_becomes_the_ranks_device():
    # `dev = th.device('cuda:%d' % args.gpu)`: every rank put its batches on the same GPU while ddpkit.wrap put the
    # model on the rank's own, and the port said "ported fully"
    for value in ("th.device('cuda:%d' % args.gpu)", "th.device('cpu') if args.gpu < 0 else th.device('cuda:%d' % args.gpu)",
                  "f'cuda:{args.gpu}'"):
        src = ("import argparse\nimport torch as th\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\n"
               "def main():\n    parser = argparse.ArgumentParser()\n    parser.add_argument('--gpu', type=int, default=0)\n"
               f"    args = parser.parse_args()\n    dev = {value}\n"
               "    train = TensorDataset(th.randn(64, 4), th.randn(64, 1))\n"
               "    model = th.nn.Linear(4, 1).to(dev)\n    opt = th.optim.SGD(model.parameters(), lr=0.1)\n"
               "    for x, y in DataLoader(train, batch_size=16, shuffle=True):\n"
               "        loss = th.nn.functional.mse_loss(model(x.to(dev)), y.to(dev))\n        opt.zero_grad()\n"
               "        loss.backward()\n        opt.step()\n\n\nif __name__ == '__main__':\n    main()\n")
        code = port_source(src, "train.py").code
        assert "args.gpu)" not in code.split("dev = ", 1)[1].split("\n", 1)[0], value
        assert "        dev = ctx.device\n" in code or "        dev = str(ctx.device)\n" in code, value
    # a test of a GPU is no device: `use_gpu = th.cuda.is_available()` stays
    src = src.replace(f"    dev = {value}\n", f"    dev = {value}\n    use_gpu = th.cuda.is_available()\n")
    assert "use_gpu = th.cuda.is_available()" in port_source(src, "train.py").code


def test_a_question_asked_on_the_terminal_is_named():
    # `if input("train more? ") == "y": train(...)` after training: every rank asks, one answer at most reaches a
    # rank, and the rank that trains alone waits for the others in its first backward()
    src = ("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\n"
           "def train(model, opt, data):\n    for x, y in DataLoader(data, batch_size=16, shuffle=True):\n"
           "        loss = torch.nn.functional.mse_loss(model(x), y)\n        opt.zero_grad()\n"
           "        loss.backward()\n        opt.step()\n\n\ndef main():\n"
           "    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n    model = torch.nn.Linear(4, 1)\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    train(model, opt, data)\n"
           "    answer = input('train more? ')\n    if answer == 'y':\n        train(model, opt, data)\n\n\n"
           "if __name__ == '__main__':\n    main()\n")
    result = port_source(src, "train.py")
    assert result.exit_code == 3
    assert any("`input(...)` asks on every rank" in t.message for t in result.todos)


def test_an_option_added_to_a_call_that_closes_on_its_own_line_keeps_the_layout():
    # `DataLoader(\n    data, ..., num_workers=2\n)`: the added `persistent_workers=False` went after the line break
    src = ("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\ndef main():\n"
           "    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n    loader = DataLoader(\n"
           "        data, batch_size=16, shuffle=True, num_workers=2\n    )\n    model = torch.nn.Linear(4, 1)\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for x, y in loader:\n"
           "        loss = torch.nn.functional.mse_loss(model(x), y)\n        opt.zero_grad()\n"
           "        loss.backward()\n        opt.step()\n\n\nif __name__ == '__main__':\n    main()\n")
    code = port_source(src, "train.py").code
    assert ("        loader = ddpkit.loader(\n            data, ctx, batch_size=16 // ctx.world_size, shuffle=True, "
            "num_workers=2, persistent_workers=False\n        )\n") in code


def test_a_sum_read_in_the_loop_and_reset_by_a_tuple_assignment_stays_a_target():
    # `total, count = 0, 0` after an interval print: the names it assigns are targets, never reduced reads (the
    # port once wrote `(ddpkit.all_reduce_sum(ctx, total).item() / ctx.world_size), count = 0, 0`, not Python)
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n"
           "loader = DataLoader(ds, batch_size=32, shuffle=True)\nmodel = Net()\n"
           "opt = torch.optim.Adam(model.parameters())\nfor epoch in range(2):\n"
           "    total, count = 0, 0\n"
           "    for i, (x, y) in enumerate(loader):\n        out = model(x)\n        loss = crit(out, y)\n"
           "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
           "        total += psnr(out, y)\n        count += 1\n"
           "        if i % 50 == 0:\n            print('psnr', total / count)\n            total, count = 0, 0\n")
    code = port_source(src).code
    compile(code, "<port>", "exec")
    assert "            total, count = 0, 0\n" in code
    assert "print0(ctx, 'psnr', (ddpkit.all_reduce_sum(ctx, total).item() / ctx.world_size) / count)" in code


def test_a_forward_whose_stored_loss_a_helper_reads_from_the_model_goes_through_the_wrapper():
    # `net(x, y)` then `loss = collect_loss(net)` (a helper that reads net.loss): the forward is the training step's
    # own, as with `loss = net.loss`; through ddpkit.unwrap(net) each rank would train its own copy, unsynced
    for helper in ("from losses import collect_loss\n", "\n\ndef collect_loss(m):\n    return m.loss + m.aux\n"):
        src = ("import torch\nfrom torch.utils.data import DataLoader\n" + helper +
               "\nloader = DataLoader(ds, batch_size=32, shuffle=True)\nnet = Net()\n"
               "opt = torch.optim.SGD(net.parameters(), lr=0.01)\nfor epoch in range(2):\n"
               "    for x, y in loader:\n        net(x, y)\n        loss = collect_loss(net)\n"
               "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n")
        code = port_source(src, "train.py").code
        assert "ddpkit.unwrap(net)(x, y)" not in code
        assert "        net(x, y)\n" in code


def test_a_dropped_forward_beside_a_backward_that_never_hands_over_the_model_is_still_unwrapped():
    # precision: a forward whose output is dropped (a graph for a tracker) while the loss comes from another forward
    # and a helper handed something else than the model stays off the wrapper
    src = ("import torch\nfrom torch.utils.data import DataLoader\nfrom losses import smooth\n\n"
           "loader = DataLoader(ds, batch_size=32, shuffle=True)\nnet = Net()\n"
           "opt = torch.optim.SGD(net.parameters(), lr=0.01)\nfor epoch in range(2):\n"
           "    for x, y in loader:\n        out = net(x)\n        loss = smooth(out, y)\n"
           "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
           "    net(x)\n")
    code = port_source(src, "train.py").code
    assert "    ddpkit.unwrap(net)(x)\n" in code


def test_parameter_names_read_after_the_wrap_are_the_models_own_without_the_module_prefix():
    # an EMA dict keyed by `model.named_parameters()` before the wrap (the model is changed in between, so the port
    # wraps just before the optimizer) and updated from the same call after it: on the wrapper every name has
    # `module.` and `shadow[n]` is a KeyError (also a name compared or matched: `n.startswith("head.")`)
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n"
           "loader = DataLoader(ds, batch_size=32, shuffle=True)\nmodel = Net()\n"
           "shadow = {n: p.detach().clone() for n, p in model.named_parameters()}\nmodel.apply(init_weights)\n"
           "opt = torch.optim.SGD(model.parameters(), lr=0.01)\nfor epoch in range(2):\n"
           "    for x, y in loader:\n        loss = loss_fn(model(x), y)\n"
           "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
           "        for n, p in model.named_parameters():\n            shadow[n].mul_(0.9).add_(p.detach(), alpha=0.1)\n"
           "        for n, b in model.named_buffers():\n            shadow[n] = b.clone()\n")
    code = port_source(src, "train.py").code
    assert code.index("model.apply(init_weights)") < code.index("model = ddpkit.wrap(model, ctx)")
    assert "        for n, p in ddpkit.unwrap(model).named_parameters():\n" in code
    assert "        for n, b in ddpkit.unwrap(model).named_buffers():\n" in code
    assert "    loss = loss_fn(model(x), y)\n" in code


def test_an_averaged_model_made_after_the_wrap_copies_the_model():
    """`AveragedModel(model)` deep-copies what it is given: after the wrap, the DDP wrapper. It copies the model."""
    src = ("import torch\nfrom torch.optim.swa_utils import AveragedModel\nfrom torch.utils.data import DataLoader\n"
           "\n\ndef main():\n    loader = DataLoader(ds, batch_size=8, shuffle=True)\n    model = Net()\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    swa = AveragedModel(model)\n"
           "    for x, y in loader:\n        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n"
           "        swa.update_parameters(model)\n\n\nif __name__ == '__main__':\n    main()\n")
    result = port_source(src)
    assert "swa = AveragedModel(ddpkit.unwrap(model))" in result.code
