"""`ddpkit port`: decisions one rank takes on its own values around the DDP step (skips, stops, learning rates)."""

from __future__ import annotations

from pathlib import Path

from ddpkit.port import port_source

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"
SOURCE = (FIXTURES / "per_rank_steps.py").read_text()
SKIP = "            if loss.item() > 100.0:\n                continue\n"
STOP = ("        val_loss = evaluate(model, val_loader)\n        if val_loss < best:\n            best = val_loss\n"
        "            patience = 0\n        else:\n            patience += 1\n            if patience > 3:\n"
        "                break\n")


def _variant(old: str, new: str, source: str = SOURCE) -> str:
    assert old in source
    return source.replace(old, new)


def _line(source: str, text: str) -> int:
    return next(i for i, s in enumerate(source.splitlines(), 1) if text in s)


def _todos(source: str) -> dict[int, str]:
    result = port_source(source, "per_rank_steps.py")
    assert result.exit_code == (3 if result.todos else 0) and ("ported fully" in result.message) is not bool(
        result.todos), result.message
    return {t.line: t.message for t in result.todos}


def test_a_training_step_skipped_on_this_ranks_loss_is_a_todo_and_a_reduced_early_stop_is_not():
    todos = _todos(SOURCE)
    # patience counts epochs on the validation loss, which the port reduces over ranks: every rank stops alike
    assert list(todos) == [_line(SOURCE, "if loss.item() > 100.0")], todos
    assert "`continue` past a training step" in todos[_line(SOURCE, "if loss.item() > 100.0")]
    # a skip after the step (a log line skipped) changes no collective
    after = _variant(SKIP, "").replace("            optimizer.step()\n",
                                       "            optimizer.step()\n" + SKIP + "            print(loss.item())\n")
    assert _todos(after) == {}


def test_patience_counted_on_a_per_rank_figure_stops_ranks_at_different_epochs():
    source = _variant("val_loss = evaluate(model, val_loader)", "val_loss = loss.item()", _variant(SKIP, ""))
    todos = _todos(source)
    # `patience > 3` reads only a counter, but the counter moves on `val_loss < best`, this rank's last batch loss
    assert list(todos) == [_line(source, "if val_loss < best")], todos
    assert "`break` out of a loop that trains (early stopping" in todos[_line(source, "if val_loss < best")]


def test_a_learning_rate_changed_on_a_per_rank_figure_is_a_todo():
    halve = ("        last = loss.item()\n        if last > best:\n            for g in optimizer.param_groups:\n"
             "                g[\"lr\"] *= 0.5\n        best = min(best, last)\n")
    source = _variant(STOP, halve, _variant(SKIP, ""))
    todos = _todos(source)
    assert list(todos) == [_line(source, "if last > best")], todos
    assert "changes its learning rate (`g[\"lr\"] *= 0.5`)" in todos[_line(source, "if last > best")]
    # the same change on the reduced validation loss is alike on every rank
    reduced = halve.replace("last = loss.item()", "last = evaluate(model, val_loader)")
    assert _todos(_variant(STOP, reduced, _variant(SKIP, ""))) == {}
    # a learning rate the script holds in a name and hands to its param groups
    named = ("        if loss.item() > best:\n            lr = lr * 0.5\n        for g in optimizer.param_groups:\n"
             "            g[\"lr\"] = lr\n")
    source = _variant(STOP, named, _variant(SKIP, "")).replace("    best = float", "    lr = 0.1\n    best = float")
    todos = _todos(source)
    assert list(todos) == [_line(source, "if loss.item() > best")], todos
    # handed to a function of the script that writes it into the param groups
    helper = ("        if loss.item() > best:\n            lr = lr * 0.5\n            adjust_lr(optimizer, lr)\n")
    source = _variant(STOP, helper, _variant(SKIP, "")).replace("    best = float", "    lr = 0.1\n    best = float")
    source = source.replace("def main():", "def adjust_lr(optimizer, lr):\n    for g in optimizer.param_groups:\n"
                            "        g[\"lr\"] = lr\n\n\ndef main():")
    todos = _todos(source)
    assert list(todos) == [_line(source, "if loss.item() > best")], todos


def test_a_return_before_the_next_step_on_a_per_rank_value_is_a_todo_and_a_break_of_a_loop_that_trains_nothing_is_not():
    source = _variant(SKIP, "            if loss.item() > 1e3:\n                return\n")
    todos = _todos(source)
    assert list(todos) == [_line(source, "if loss.item() > 1e3")] and "`return`" in todos[_line(source, "1e3")]
    # a search over this rank's predictions that stops early runs no collective
    scan = ("            for p in model(xb).flatten().tolist():\n                if p > 1.0:\n"
            "                    break\n")
    assert _todos(_variant(SKIP, scan)) == {}


def test_a_search_library_handed_a_training_function_is_a_todo():
    path = FIXTURES / "search_optuna.py"
    source = path.read_text()
    result = port_source(source, str(path))
    (todo,) = [t for t in result.todos if "hyperparameter search" in t.message]
    assert todo.line == _line(source, "study.optimize(objective") and "`objective`" in todo.message
    assert result.exit_code == 3 and "ported fully" not in result.message
    # handed through a lambda: the same search
    wrapped = source.replace("study.optimize(objective,", "study.optimize(lambda t: objective(t),")
    assert any("hyperparameter search" in t.message for t in port_source(wrapped, str(path)).todos)
    # a trial function that reads its settings from a config the library hands it (ray.tune's shape)
    tuned = source.replace('lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)', 'lr = trial["lr"]')
    assert tuned != source and any("hyperparameter search" in t.message for t in port_source(tuned, str(path)).todos)
    # a runner handed the script's entry point passes plain values: no search
    fire = (FIXTURES / "per_rank_steps.py").read_text().replace(SKIP, "").replace(
        "import argparse\n", "import argparse\nimport fire\n").replace("    main()\n", "    fire.Fire(main)\n")
    assert "fire.Fire(main)" in fire
    assert not any("hyperparameter search" in t.message for t in port_source(fire, "runner.py").todos)


def test_a_setting_drawn_per_rank_around_training_is_a_todo_and_a_fixed_grid_or_a_seeded_draw_is_not():
    source = (FIXTURES / "search_random.py").read_text()
    todos = _todos(source)
    line = _line(source, "lr = 10 ** random.uniform")
    assert list(todos) == [line] and "random search per rank" in todos[line] and "`train(...)`" in todos[line]
    grid = source.replace("    for trial in range(10):\n        lr = 10 ** random.uniform(-4, -2)\n",
                          "    for lr in [1e-4, 1e-3, 1e-2]:\n")
    assert grid != source and _todos(grid) == {}
    # seeded before training starts, every rank draws the same settings (the port keeps the script's streams)
    seeded = source.replace("\n\ndef train(", "\nrandom.seed(0)\n\n\ndef train(")
    assert seeded != source and _todos(seeded) == {}
    # seeded after ddpkit.init only, each rank is reseeded on its own before the loop: the draw differs again
    late = source.replace("def main():\n", "def main():\n    random.seed(0)\n")
    assert list(_todos(late)) == [line + 1]


def test_settings_read_back_from_a_checkpoint_are_alike_on_every_rank_however_far_they_come_from():
    source = (FIXTURES / "resumed_settings.py").read_text()
    # width2 <- read_shape(args.encoder) <- run_encoder <- read_run(run_path) <- find_run(args): files and arguments
    assert port_source(source, "resumed_settings.py").todos == []
    # the same chain, two steps longer, from this rank's loss: per-rank however many assignments lie between
    probe = _variant("    run, run_path = find_run(args)\n",
                     "    run, run_path = find_run(args)\n"
                     "    probe = nn.functional.mse_loss(torch.randn(4), torch.zeros(4)).item()\n"
                     "    run_path = run_path + str(probe)\n", source)
    todos = {t.line: t.message for t in port_source(probe, "resumed_settings.py").todos}
    # `args.encoder = run_encoder` makes the outer test per-rank too: its TODO holds the exit below it
    assert list(todos) == [_line(probe, "if args.encoder:")], todos
    assert "takes `sys.exit()` before a training step" in todos[_line(probe, "if args.encoder:")], todos


def test_a_best_model_saved_on_this_ranks_own_loss_is_a_todo_and_one_saved_on_the_reduced_loss_is_not():
    save = ("        last = loss.item()\n        if last < best:\n            best = last\n"
            "            torch.save(model.state_dict(), \"best.pt\")\n")
    source = _variant(STOP, save, _variant(SKIP, ""))
    todos = _todos(source)
    # rank 0 alone saves, but which model it keeps is chosen by its own last batch: a per-rank value
    assert list(todos) == [_line(source, "if last < best")], todos
    assert "rank 0 saves (`torch.save(...)`) the model it judges best by its own shard's value" in todos[
        _line(source, "if last < best")]
    assert _todos(save.replace("last = loss.item()", "last = evaluate(model, val_loader)").join(
        source.split(save))) == {}


def test_a_stop_on_values_this_rank_appended_to_a_list_is_a_todo_and_the_lists_length_is_a_count():
    stop = ("        rewards.append(model(xb).sum().item())\n        if len(rewards) >= 2:\n"
            "            average = sum(rewards[-2:]) / len(rewards[-2:])\n            if average > 195:\n"
            "                break\n")
    source = _variant(STOP, stop, _variant(SKIP, "")).replace("    patience = 0\n", "    rewards = []\n", 1)
    todos = _todos(source)
    # the list grows alike on every rank (its length is a count), but what it holds is this rank's own
    assert list(todos) == [_line(source, "if average > 195")], todos
    assert "`break` out of a loop that trains" in todos[_line(source, "if average > 195")]


def test_an_episode_whose_length_each_rank_draws_around_a_training_step_is_a_todo_naming_the_draw():
    source = (FIXTURES / "episode_steps.py").read_text()
    todos = _todos(source)
    line = _line(source, "while not done:")
    # `done` comes from the walk stepped with `action`, which `self.choose` takes from `self.env.random_move()`,
    # a draw of a generator the walk made without a seed: episodes end at different steps on different ranks
    assert line in todos, todos
    assert "`action` comes from `self.choose(...)`" in todos[line] and "`self.rng`, a generator seeded from the " \
        "operating system on each rank" in todos[line] and "runs a training step" in todos[line]
    # `.sample()` of an object another library made (an environment handed in) draws from that library's generator
    space = _variant("        return int(self.rng.integers(2))\n", "        return self.space.sample()\n", source)
    space = _variant("        self.rng = np.random.default_rng()\n", "        self.space = make_space(2)\n", space)
    space = _variant("import numpy as np\n", "import numpy as np\nfrom spaces import make_space\n", space)
    assert "a generator of another library" in _todos(space)[_line(space, "while not done:")]
    # the process-wide generator, seeded alike on every rank (the script seeds before ddpkit.init and the port does
    # not reseed per rank here): every rank draws the same actions and ends its episodes alike
    alike = _variant("        return int(self.rng.integers(2))\n", "        return random.randint(0, 1)\n", source)
    assert line not in _todos(alike)
    # a generator seeded alike on every rank draws alike too
    assert line not in _todos(_variant("np.random.default_rng()", "np.random.default_rng(0)", source))


def test_a_skip_on_the_length_of_a_buffer_each_rank_fills_with_games_of_drawn_length_is_a_todo():
    source = (FIXTURES / "selfplay_buffer.py").read_text()
    todos = _todos(source)
    line = _line(source, "if len(buffer) < 32:")
    # `play` appends one item per position of a walk whose moves are drawn (`walk.move(step)` changes the walk the
    # loop tests): the games, and so the buffer, grow to a different length on each rank
    assert line in todos, todos
    assert "`len(buffer)` comes from `play(...)`" in todos[line] and "np.random.choice" in todos[line]
    assert "takes `continue` past a training step" in todos[line]
    # a walk that moves alike on every rank grows the buffer alike: nothing to agree on
    fixed = _variant("int(np.random.choice([-1, 1]))", "1", source)
    assert _line(fixed, "if len(buffer) < 32:") not in _todos(fixed)


def test_an_optimizer_step_gated_on_this_ranks_loss_is_a_todo_and_one_gated_on_the_step_count_is_not():
    # `if epoch < 10 or loss.item() > 0.5: optimizer.step()`: one rank steps while another skips, and the copies
    # of the model drift apart with no error (DDP averaged the gradients, but only some ranks apply them)
    gated = _variant("            optimizer.step()\n",
                     "            if epoch < 10 or loss.item() > 0.5:\n                optimizer.step()\n",
                     _variant(SKIP, ""))
    todos = _todos(gated)
    message = todos[_line(gated, "if epoch < 10 or loss.item() > 0.5")]
    assert "`optimizer.step()`" in message and "drift apart" in message
    counted = _variant("if epoch < 10 or loss.item() > 0.5:", "if epoch % 2 == 0:", gated)
    assert _line(counted, "if epoch % 2 == 0") not in _todos(counted)


def test_an_optimizer_step_gated_on_the_counter_of_an_enumerated_progress_bar_is_not_a_todo():
    # `for i, (xb, yb) in bar:` over `bar = tqdm(enumerate(train_loader))`: `i` counts steps, alike on every rank
    accumulated = _variant("        for xb, yb in train_loader:\n",
                           "        bar = tqdm(enumerate(train_loader), total=len(train_loader))\n"
                           "        for i, (xb, yb) in bar:\n", _variant(SKIP, ""))
    accumulated = _variant("            optimizer.step()\n",
                           "            if (i + 1) % 4 == 0 or (i + 1) == len(train_loader):\n"
                           "                optimizer.step()\n", accumulated)
    accumulated = _variant("import torch\n", "import torch\nfrom tqdm import tqdm\n", accumulated)
    assert _line(accumulated, "if (i + 1) % 4 == 0") not in _todos(accumulated)


def test_a_best_loss_reduced_in_a_function_of_a_top_level_script_is_no_todo_though_the_resume_reads_it_from_disk():
    source = '''import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(4, 1)
best_loss = float("inf")
if False:
    checkpoint = torch.load("ckpt.pth")
    model.load_state_dict(checkpoint["net"])
    best_loss = checkpoint["loss"]
trainloader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
testloader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def train():
    for x, y in trainloader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def test():
    global best_loss
    test_loss = 0
    for x, y in testloader:
        test_loss += nn.functional.mse_loss(model(x), y).item()
    test_loss /= len(testloader)
    if test_loss < best_loss:
        torch.save({"net": model.state_dict(), "loss": test_loss}, "ckpt.pth")
        best_loss = test_loss


for epoch in range(3):
    train()
    test()
'''
    result = port_source(source, "script.py")
    assert "all_reduce" in result.code.split("def test", 1)[1].split("if test_loss < best_loss", 1)[0]
    assert not [t for t in result.todos if "test_loss < best_loss" in t.message], result.todos


def test_a_threshold_around_backward_and_the_step_is_a_hang_not_a_drift():
    # `if loss > threshold: loss.backward(); optimizer.step()`: a rank that skips the branch skips backward() too,
    # and its peers wait for it in their gradient all-reduce: a hang, not copies drifting apart
    gated = _variant("            loss.backward()\n            optimizer.step()\n",
                     "            if loss > 0.5:\n                loss.backward()\n                optimizer.step()\n",
                     _variant(SKIP, ""))
    message = _todos(gated)[_line(gated, "if loss > 0.5")]
    assert "backward()" in message and "wait" in message and "drift" not in message, message
    # a branch whose other arm runs backward() too keeps every rank in step: only the optimizer step is per-rank
    both = _variant("                optimizer.step()\n",
                    "                optimizer.step()\n            else:\n                loss.backward()\n", gated)
    assert "drift apart" in _todos(both)[_line(both, "if loss > 0.5")]


_BEST = '''\
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from sklearn.metrics import roc_auc_score

data = TensorDataset(torch.randn(64, 4), (torch.rand(64) > 0.5).long())
train_loader = DataLoader(data, batch_size=16, shuffle=True)
val_loader = DataLoader(data, batch_size=16)


def val(model, loader, scores, epoch):
    model.eval()
    ys, ps = torch.tensor([]).to("cpu"), torch.tensor([]).to("cpu")
    with torch.no_grad():
        for x, y in loader:
            ps = torch.cat((ps, model(x).softmax(1)[:, 1]))
            ys = torch.cat((ys, y.float()))
    auc = roc_auc_score(ys.numpy(), ps.numpy())
    scores.append(auc)
    torch.save(model.state_dict(), "ckpt_%d_auc_%.5f.pth" % (epoch, auc))


model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
val_scores = []
for epoch in range(3):
    model.train()
    for x, y in train_loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    val(model, val_loader, val_scores, epoch)
best = int(np.argmax(val_scores))
path = "ckpt_%d_auc_%.5f.pth" % (best, val_scores[best])
model.load_state_dict(torch.load(path))
'''


def test_a_file_read_back_by_a_path_chosen_on_this_ranks_own_score_is_a_todo():
    # val() appends its own shard's AUC (over lists the port cannot join: they do not start empty) to the list it is
    # handed; the best epoch, and the file name, are per rank
    result = port_source(_BEST, "best.py")
    found = [t for t in result.todos if "reads on every rank a file at a path that may differ" in t.message]
    assert [t.line for t in found] == [_line(_BEST, "torch.load(path)")] and result.exit_code == 3, result.todos
    assert "`path = ddpkit.collectives.broadcast_object(ctx, path)`" in found[0].message


def test_a_file_read_back_by_a_path_every_rank_shares_is_no_todo():
    # scores the port joins over ranks (lists it gathers before the AUC): every rank picks the same epoch
    gathered = _BEST.replace("torch.tensor([]).to(\"cpu\"), torch.tensor([]).to(\"cpu\")", "[], []").replace(
        "ps = torch.cat((ps, model(x).softmax(1)[:, 1]))", "ps.append(model(x).softmax(1)[:, 1])").replace(
        "ys = torch.cat((ys, y.float()))", "ys.append(y.float())").replace(
        "roc_auc_score(ys.numpy(), ps.numpy())", "roc_auc_score(torch.cat(ys).numpy(), torch.cat(ps).numpy())")
    result = port_source(gathered, "best.py")
    assert "ddpkit.gather_list(ctx, ps)" in result.code
    assert not [t for t in result.todos if "path that may differ" in t.message], result.todos
    # the last epoch's file, named by the epoch alone: a counter, alike on every rank (named by its AUC as well, the
    # name still differs between ranks)
    last = _BEST.replace("best = int(np.argmax(val_scores))", "best = 2")
    assert [t for t in port_source(last, "best.py").todos if "path that may differ" in t.message]
    last = last.replace('"ckpt_%d_auc_%.5f.pth" % (best, val_scores[best])', '"ckpt_%d.pth" % best')
    assert not [t for t in port_source(last, "best.py").todos if "path that may differ" in t.message]
    # read only where it exists (`if os.path.isfile(path):`): a cache check, not a choice between files
    checked = _BEST.replace("model.load_state_dict(torch.load(path))", "import os\nif os.path.isfile(path):\n"
                            "    model.load_state_dict(torch.load(path))")
    assert not [t for t in port_source(checked, "best.py").todos if "path that may differ" in t.message]
    # nothing saved in the script: no file of this run to disagree about
    unsaved = _BEST.replace('    torch.save(model.state_dict(), "ckpt_%d_auc_%.5f.pth" % (epoch, auc))\n', "")
    assert not [t for t in port_source(unsaved, "best.py").todos if "path that may differ" in t.message]
