"""DDP006: figures of one rank's shard followed to where they are reported, each beside a trap that stays silent."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ddpkit.lint import lint_source, lint_sources


def _lint(code: str, rule: str = "DDP006") -> list[int]:
    """Lines of `code` where `rule` fires."""
    return [f.line for f in lint_source(textwrap.dedent(code), "train.py") if f.rule == rule]


def _line(code: str, needle: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if needle in line)


def _lint_files(files: dict[str, str], rule: str = "DDP006") -> set[tuple[str, int]]:
    sources = {path: textwrap.dedent(code) for path, code in files.items()}
    return {(f.path, f.line) for f in lint_sources(sources) if f.rule == rule}


# ---- a shard's figure handed to the program's own rank-0 report helper ----------------------------------
RANK0_HELPER = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    def say(text):
        if dist.get_rank() == 0:
            print(text)

    def score(net, batches):
        hits = 0
        for xb, yb in batches:
            hits += (net(xb).argmax(1) == yb).sum().item()
        say(f"hit rate {hits / 500:.3f}")

    def main(net, holdout):
        dist.init_process_group("gloo")
        chunks = DataLoader(holdout, batch_size=10, sampler=DistributedSampler(holdout, drop_last=True))
        score(net, chunks)
        dist.destroy_process_group()
"""


def test_shard_figure_through_a_rank_zero_report_helper():
    assert _lint(RANK0_HELPER) == [_line(RANK0_HELPER, 'say(f"hit rate')]


def test_shard_figure_reduced_before_the_helper_reports_it():
    code = RANK0_HELPER.replace('        say(f"hit rate', '        t = torch.tensor([hits])\n'
                                '        dist.all_reduce(t)\n        hits = t.item()\n        say(f"hit rate')
    assert _lint(code) == []


def test_helper_every_rank_runs_is_not_a_rank_zero_report():
    code = RANK0_HELPER.replace("        if dist.get_rank() == 0:\n            print(text)", "        print(text)")
    assert _lint(code) == []


def test_helper_that_reduces_what_it_shows():
    code = RANK0_HELPER.replace(
        "    def say(text):\n        if dist.get_rank() == 0:\n            print(text)",
        "    def say(value):\n        t = torch.tensor([value])\n        dist.all_reduce(t)\n"
        "        if dist.get_rank() == 0:\n            print(t.item())").replace(
        'say(f"hit rate {hits / 500:.3f}")', "say(hits)")
    assert _lint(code) == []


# ---- padding evaluation samplers written as a conditional or through an alias of the class ----------------
EVAL_CONDITIONAL = """
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    def check(net, val_set, spread):
        picker = DistributedSampler(val_set) if spread else None
        for xb, yb in DataLoader(val_set, batch_size=8, sampler=picker):
            net(xb)

    def main(net, val_set):
        dist.init_process_group("gloo")
        check(net, val_set, True)
        dist.destroy_process_group()
"""


def test_padding_sampler_in_a_conditional_expression():
    assert _lint(EVAL_CONDITIONAL) == [_line(EVAL_CONDITIONAL, "picker = DistributedSampler")]


def test_conditional_sampler_that_drops_the_padding():
    assert _lint(EVAL_CONDITIONAL.replace("DistributedSampler(val_set)",
                                          "DistributedSampler(val_set, drop_last=True)")) == []


EVAL_ALIAS = """
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    def loaders(fit_set, val_set):
        kind = None
        if dist.is_initialized():
            kind = DistributedSampler
        fit = DataLoader(fit_set, batch_size=8, sampler=kind(fit_set) if kind else None)
        holdout = DataLoader(val_set, batch_size=8,
                             sampler=kind(val_set) if kind else None)
        return fit, holdout

    def main(net, fit_set, val_set):
        dist.init_process_group("gloo")
        fit, holdout = loaders(fit_set, val_set)
        for xb, yb in holdout:
            net(xb)
        dist.destroy_process_group()
"""


def test_padding_sampler_through_an_alias_of_the_class():
    assert _lint(EVAL_ALIAS) == [_line(EVAL_ALIAS, "sampler=kind(val_set)")]


def test_alias_of_a_sampler_that_does_not_pad():
    code = EVAL_ALIAS.replace("from torch.utils.data.distributed import DistributedSampler",
                              "from torch.utils.data import SequentialSampler").replace(
        "kind = DistributedSampler", "kind = SequentialSampler")
    assert _lint(code) == []


# ---- a loss reduced by a helper and converted on the way (`reduce(t).item()`) ----------------------------
REDUCED_THEN_CONVERTED = """
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter

    def average(t):
        dist.all_reduce(t)
        return t / dist.get_world_size()

    def log_step(board, step_loss, step):
        board.add_scalar("train/loss", step_loss, step)

    def main(net, batches, opt):
        dist.init_process_group("gloo")
        board = SummaryWriter() if dist.get_rank() == 0 else None
        for step, (xb, yb) in enumerate(batches):
            loss = net(xb, yb)
            loss.backward()
            opt.step()
            step_loss = average(loss.detach()).item()
            if dist.get_rank() == 0:
                log_step(board, step_loss, step)
        dist.destroy_process_group()
"""


def test_loss_reduced_then_converted_is_reduced():
    assert _lint(REDUCED_THEN_CONVERTED) == []


def test_loss_converted_without_reduction_is_rank_zeros_own():
    code = REDUCED_THEN_CONVERTED.replace("average(loss.detach()).item()", "loss.detach().item()")
    # (reported at the one call that hands rank 0's loss to the helper, which has no rank check of its own)
    assert _lint(code) == [_line(code, "  log_step(board, step_loss, step)")]


# ---- an accumulator of a class not linted, told the run is distributed ------------------------------------
TOLD_DISTRIBUTED = """
    import argparse
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler
    from scorekit import Tally

    def main():
        cli = argparse.ArgumentParser()
        cli.add_argument("--distributed", action="store_true")
        args = cli.parse_args()
        dist.init_process_group("gloo")
        net = torch.nn.Linear(4, 2)
        val_set = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
        val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set, drop_last=True))
        tally = Tally(2, args.distributed)
        with torch.no_grad():
            for xb, yb in val_loader:
                tally.update(net(xb), yb)
        hit_rate = tally.get()
        if dist.get_rank() == 0:
            print(f"hit rate {hit_rate:.3f}")
        dist.destroy_process_group()
"""


def test_accumulator_told_the_run_is_distributed_is_not_followed():
    assert _lint(TOLD_DISTRIBUTED) == []


def test_accumulator_not_told_is_followed():
    code = TOLD_DISTRIBUTED.replace("Tally(2, args.distributed)", "Tally(2)")
    assert _lint(code) == [_line(code, 'print(f"hit rate')]


# ---- a function the entry script calls under another name (`from worker import run as start`) -------------
ALIASED_ENTRY = {
    "launch.py": """
        from worker import run as start_training

        if __name__ == "__main__":
            start_training(3)
    """,
    "worker.py": """
        import math
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        def run(epochs):
            dist.init_process_group("gloo")
            net = DDP(torch.nn.Linear(4, 1))
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for _ in range(epochs):
                loss = net(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                assert not math.isnan(loss.item()), "diverged"
            dist.destroy_process_group()
    """,
}


def test_function_called_through_an_import_alias_runs():
    assert _lint_files(ALIASED_ENTRY, "DDP010") == {("worker.py", 16)}


def test_function_imported_under_an_alias_but_never_called_does_not_run():
    files = dict(ALIASED_ENTRY, **{"launch.py": ALIASED_ENTRY["launch.py"].replace("start_training(3)", "pass")})
    assert _lint_files(files, "DDP010") == set()


# ---- one finding for a run of report statements of rank 0's own losses -----------------------------------
LOSS_BLOCK = """
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter

    def main(gen, disc, batches, opt):
        dist.init_process_group("gloo")
        board = SummaryWriter()
        for step, (xb, yb) in enumerate(batches):
            g_loss = gen(xb, yb)
            d_loss = disc(xb, yb)
            (g_loss + d_loss).backward()
            opt.step()
            if dist.get_rank() == 0:
                board.add_scalar("lr", opt.param_groups[0]["lr"], step)
                board.add_scalar("gen", g_loss.item(), step)
                board.add_scalar("disc", d_loss.item(), step)
                board.add_scalar("sum", (g_loss + d_loss).item(), step)
        dist.destroy_process_group()
"""


def test_a_block_of_loss_reports_is_one_finding():
    assert _lint(LOSS_BLOCK) == [_line(LOSS_BLOCK, 'add_scalar("gen"')]


def test_reports_apart_are_findings_apart():
    code = LOSS_BLOCK.replace('                board.add_scalar("disc"',
                              '                step_time = step * 2\n                board.add_scalar("disc"')
    assert _lint(code) == [_line(code, 'add_scalar("gen"'), _line(code, 'add_scalar("disc"')]


# ---- rank 0's own losses kept on an object, sent to the sink a setting picks ------------------------------
METER_TRAINER = """
    import torch
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter

    def sync_weights(model):
        for p in model.parameters():
            dist.all_reduce(p.data)

    class Runner:
        def __init__(self, model, opt, batches, sink):
            self.model, self.opt, self.batches, self.sink = model, opt, batches, sink
            self.rank = dist.get_rank()
            self.board = SummaryWriter()
            self.tallies = {}

        def step(self, xb, yb):
            parts = self.model(xb, yb)
            parts["total_loss"].backward()
            self.opt.step()
            self.tallies = {k: v.item() for k, v in parts.items()}

        def fit(self):
            for i, (xb, yb) in enumerate(self.batches):
                self.step(xb, yb)
                loss_tallies = dict(self.tallies)
                if self.rank == 0:
                    if self.sink == "board":
                        self.board.add_scalars("train", {name: value for name, value in loss_tallies.items()}, i)
                    if self.sink == "text":
                        print({name: value for name, value in loss_tallies.items()})
            sync_weights(self.model)

    def main(model, opt, batches):
        dist.init_process_group("gloo")
        Runner(model, opt, batches, "board").fit()
        dist.destroy_process_group()
"""


def test_own_losses_on_an_object_reported_once_for_sinks_one_setting_picks():
    assert _lint(METER_TRAINER) == [_line(METER_TRAINER, 'self.board.add_scalars("train"')]


def test_reports_of_one_value_both_of_which_run_are_two():
    code = METER_TRAINER.replace('                    if self.sink == "text":',
                                 '                    seen = i\n                    if seen % 100 == 0:')
    assert _lint(code) == [_line(code, 'self.board.add_scalars("train"'), _line(code, "print({name: value")]


def test_reduced_attribute_vouches_for_itself():
    code = METER_TRAINER.replace("                loss_tallies = dict(self.tallies)",
                                 "                dist.all_reduce(self.tallies)\n"
                                 "                loss_tallies = dict(self.tallies)")
    assert _lint(code) == []


# ---- a value only rank 0 holds (None on the others), tested later, also in the function it is handed to ----
ONLY_RANK0_BOARD = """
    import torch
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter


    def fit(net, batches, opt, board):
        for step, (xb, yb) in enumerate(batches):
            loss = net(xb, yb)
            loss.backward()
            opt.step()
            if board is not None:
                board.add_scalar("loss", loss.item(), step)


    def main(net, batches, opt):
        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            board = SummaryWriter()
        else:
            board = None
        fit(net, batches, opt, board)
        dist.destroy_process_group()
"""


def test_value_only_rank_zero_holds_tested_against_none_in_a_callee():
    assert _lint(ONLY_RANK0_BOARD) == [_line(ONLY_RANK0_BOARD, 'board.add_scalar("loss"')]


def test_value_only_rank_zero_holds_skipped_with_continue():
    code = ONLY_RANK0_BOARD.replace("            if board is not None:\n",
                                    "            if board is None:\n                continue\n"
                                    "            if step % 10 == 0:\n")
    assert _lint(code) == [_line(code, 'board.add_scalar("loss"')]


def test_value_every_rank_holds_tested_against_none_is_no_rank_check():
    code = ONLY_RANK0_BOARD.replace("        if dist.get_rank() == 0:\n            board = SummaryWriter()\n"
                                    "        else:\n            board = None\n", "        board = SummaryWriter()\n")
    assert "board = None" not in code and _lint(code) == []


def test_rank_tested_against_none_still_asks_whether_the_run_is_distributed():
    code = """
        import torch.distributed as dist

        def main():
            dist.init_process_group("gloo")
            rank = dist.get_rank() if dist.is_initialized() else None
            if rank is not None:
                print("joined")
    """
    assert _lint(code, "DDP008") == [_line(code, 'print("joined")')]


# ---- rank 0's per-step progress line, in a program that reduces the figures it reports as the run's -------
PROGRESS_LINE = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    def share(t):
        dist.all_reduce(t)
        return t / dist.get_world_size()

    def fit(net, fit_loader, opt, crit):
        for i, (xb, yb) in enumerate(fit_loader):
            out = net(xb)
            loss = crit(out, yb)
            acc = (out.argmax(1) == yb).float().mean()
            loss.backward()
            opt.step()
            if dist.get_rank() == 0 and i % 50 == 0:
                print(f"step {i} loss {loss.item():.3f} acc {acc.item():.3f}")

    def score(net, val_loader, crit):
        with torch.no_grad():
            for xb, yb in val_loader:
                out = net(xb)
                loss = crit(out, yb)
                val_loss = share(loss)
                val_acc = share((out.argmax(1) == yb).float().mean())
        return val_loss, val_acc

    def main(net, fit_set, val_set, opt, crit):
        dist.init_process_group("gloo")
        fit_loader = DataLoader(fit_set, batch_size=8, sampler=DistributedSampler(fit_set))
        val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set, drop_last=True))
        fit(net, fit_loader, opt, crit)
        val_loss, val_acc = score(net, val_loader, crit)
        if dist.get_rank() == 0:
            print(val_loss.item(), val_acc.item())
        dist.destroy_process_group()
"""


def test_per_step_progress_line_beside_reduced_figures():
    assert _lint(PROGRESS_LINE) == []


def test_per_step_line_in_a_program_that_reduces_no_accuracy():
    code = PROGRESS_LINE.replace("val_acc = share((out.argmax(1) == yb).float().mean())",
                                 "val_acc = (out.argmax(1) == yb).float().mean()").replace("val_loss", "held_cost")
    assert _line(code, 'print(f"step {i}') in _lint(code)


# ---- DDP010: a rank leaving the shared loop on a figure of its own batch ----------------------------------
OWN_STOP = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def main(cap):
        dist.init_process_group("gloo")
        net = DDP(torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for rounds in range(10):
            for _ in range(4):
                scores = net(torch.randn(8, 4)).log_softmax(-1)
                drift = (scores.exp() * scores).sum(-1).mean()
                loss = -scores[:, 0].mean() + 0.1 * drift
                opt.zero_grad()
                loss.backward()
                opt.step()
            if drift.item() > cap:
                break
        dist.destroy_process_group()
"""


def test_stop_on_a_figure_of_this_ranks_own_batch():
    assert _lint(OWN_STOP, "DDP010") == [_line(OWN_STOP, "break")]


def test_stop_on_a_figure_reduced_first():
    code = OWN_STOP.replace("                opt.step()\n",
                            "                opt.step()\n                dist.all_reduce(drift)\n")
    assert _lint(code, "DDP010") == []


def test_stop_on_a_counter_or_a_setting():
    code = OWN_STOP.replace("if drift.item() > cap:", "if rounds > cap:")
    assert _lint(code, "DDP010") == []


def test_stop_on_a_figure_of_another_forward():
    code = OWN_STOP.replace("            if drift.item() > cap:",
                            "            probe = net.module(torch.ones(1, 4)).sum()\n            if probe.item() > cap:")
    assert _lint(code, "DDP010") == []


def test_stop_on_a_count_of_the_batches_seen():
    code = OWN_STOP.replace("                opt.step()\n", "                opt.step()\n"
                            "                seen = scores.size(0) + scores.numel()\n").replace(
        "if drift.item() > cap:", "if seen > cap:")
    assert _lint(code, "DDP010") == []


def test_a_line_printed_then_written_to_a_log_file_is_one_finding():
    code = LOSS_BLOCK.replace('                board.add_scalar("disc", d_loss.item(), step)\n',
                              '                with open("log.txt", "a") as log:\n'
                              '                    log.write(f"disc {d_loss.item()}")\n')
    assert _lint(code) == [_line(code, 'add_scalar("gen"')]


# ---- a report of a loop's values: the values of a dict's items, not its keys -------------------------------
LOOPED_PARTS = """
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter

    def main(net, batches, opt):
        dist.init_process_group("gloo")
        board = SummaryWriter()
        for step, (xb, yb) in enumerate(batches):
            loss_parts = net(xb, yb)
            sum(loss_parts.values()).backward()
            opt.step()
            if dist.get_rank() == 0:
                for name, part in loss_parts.items():
                    board.add_scalar(name, part.item(), step)
        dist.destroy_process_group()
"""


def test_values_of_a_loss_dict_reported_in_a_loop():
    assert _lint(LOOPED_PARTS) == [_line(LOOPED_PARTS, "board.add_scalar(name, part.item(), step)")]


def test_keys_of_a_loss_dict_reported_in_a_loop():
    code = LOOPED_PARTS.replace("board.add_scalar(name, part.item(), step)", 'print("term", name)')
    assert _lint(code) == []


def test_values_of_zipped_loss_parts_reported_in_a_loop():
    code = LOOPED_PARTS.replace("for name, part in loss_parts.items():",
                                "for name, part in zip(['a', 'b'], list(loss_parts.values())):")
    assert _lint(code) == [_line(code, "board.add_scalar(name, part.item(), step)")]



# ---- a padding sampler over held-out data, however it reaches its loader ---------------------------------
HELD_OUT_THROUGH_KWARGS = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    from torchvision import datasets

    dist.init_process_group("gloo")
    first = datasets.MNIST("data", train=True)
    second = datasets.MNIST("data", train=False)
    sampler1 = DistributedSampler(first)
    sampler2 = DistributedSampler(second, shuffle=False)
    kwargs2 = {"batch_size": 64, "sampler": sampler2}
    loader1 = DataLoader(first, sampler=sampler1)
    loader2 = DataLoader(second, **kwargs2)
    for x, y in loader1:
        pass
    for x, y in loader2:
        pass
    dist.destroy_process_group()
"""


def test_padding_sampler_of_a_held_out_dataset_through_a_keyword_dict():
    # `train=False` marks the data held out, and the sampler reaches the loader through `**kwargs2`
    assert _lint(HELD_OUT_THROUGH_KWARGS) == [_line(HELD_OUT_THROUGH_KWARGS, "sampler2 = DistributedSampler")]
    # the same through a loader named for evaluation, the dataset's own name saying nothing
    named = HELD_OUT_THROUGH_KWARGS.replace('train=False', 'train=True').replace("loader2", "test_loader")
    assert _lint(named) == [_line(named, "sampler2 = DistributedSampler")]
    # the trap: the training set's sampler, and a held-out sampler that drops the remainder
    dropped = HELD_OUT_THROUGH_KWARGS.replace("shuffle=False)", "shuffle=False, drop_last=True)")
    assert _lint(dropped) == []


def test_a_syncing_metric_object_does_not_clear_padding():
    # torchmetrics syncs its state across ranks, padded duplicates included
    code = HELD_OUT_THROUGH_KWARGS.replace("from torchvision import datasets",
                                           "import torchmetrics\n    from torchvision import datasets")
    assert _lint(code) == [_line(code, "sampler2 = DistributedSampler")]


# ---- a per-rank line that names its rank ------------------------------------------------------------------
def test_every_rank_metric_line_naming_its_rank_through_format_is_no_figure():
    code = """
        import os
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler

        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("gloo")
        valid_set = torch.utils.data.TensorDataset(torch.randn(100, 4))
        valid_loader = DataLoader(valid_set, sampler=DistributedSampler(valid_set, drop_last=True))
        valid_acc = 0.0
        for (x,) in valid_loader:
            valid_acc += x.sum().item()
        print("Valid_local_rank: {} Valid_acc: {:.2f}".format(local_rank, valid_acc))
        dist.destroy_process_group()
    """
    assert _lint(code) == []
    unnamed = code.replace('"Valid_local_rank: {} Valid_acc: {:.2f}".format(local_rank, valid_acc)',
                           '"Valid_acc: {:.2f}".format(valid_acc)')
    assert _lint(unnamed) == [_line(unnamed, 'print("Valid_acc')]


# ---- a reduction nothing runs, and one value shown twice under one rank check -----------------------------
def _fixture(name: str) -> str:
    return (Path(__file__).resolve().parents[1] / "fixtures" / "lint" / name).read_text()


def test_a_reduction_helper_nothing_calls_reduces_nothing():
    code = _fixture("bad_ddp006_uncalled_reduce_helper.py")
    assert _lint(code) == [_line(code, "writer.add_scalar(key")]
    # the trap: once the helper is called, the losses rank 0 shows are the run's
    called = code.replace("    # losses = reduce_loss_dict(", "    losses = reduce_loss_dict(")
    assert _lint(called) == []



_RANK_HEADED_REPORT = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    def train(model, data, opt, rank):
        loader = DataLoader(data, sampler=DistributedSampler(data))
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0:
                print("#### RANK {} step {} ####".format(rank, i))
                print("loss :", loss.item())
"""


def test_a_figure_under_a_header_line_naming_the_rank_is_not_ddp006():
    code = textwrap.dedent(_RANK_HEADED_REPORT)
    assert [f.line for f in lint_source(code, "train.py") if f.rule == "DDP006"] == []
    unheaded = code.replace('print("#### RANK {} step {} ####".format(rank, i))', 'print("#### step", i)')
    assert [f.line for f in lint_source(unheaded, "train.py") if f.rule == "DDP006"] == [15]


_RANK_HEADED_VALIDATION = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    def validate(model, data, rank):
        loader = DataLoader(data, sampler=DistributedSampler(data, shuffle=False))
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for x, y in loader:
                total += torch.nn.functional.mse_loss(model(x), y).item()
                count += 1
        if rank == 0:
            print("#### RANK {} validation ####".format(rank))
            print("val error :", total / count)
"""


def test_a_total_over_a_pass_of_the_shard_under_a_rank_header_still_claims_the_set():
    code = textwrap.dedent(_RANK_HEADED_VALIDATION)
    assert [f.line for f in lint_source(code, "train.py") if f.rule == "DDP006"] == [16]


_SELF_REDUCING_METER = {
    "meters.py": """
        import torch
        import torch.distributed as dist

        class Meter:
            def __init__(self, name):
                self.name, self.sum, self.cnt, self.avg = name, 0.0, 0, 0.0

            def add(self, value):
                self.sum += value
                self.cnt += 1
                self.avg = self.sum / self.cnt

            def settle(self, device):
                infos = torch.tensor([self.sum, self.cnt], device=device)
                dist.all_reduce(infos)
                self.sum, self.cnt = infos.tolist()
                self.avg = self.sum / self.cnt

            def value(self):
                return self.avg

        class Meters:
            def __init__(self, meters):
                self.meters = meters

            def settle_all(self, device):
                for idx in range(len(self.meters)):
                    self.meters[idx].settle(device)

            def values(self):
                return {m.name: m.value() for m in self.meters}
    """,
    "train.py": """
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler
        from meters import Meter, Meters

        def train(model, data, opt, device):
            loader = DataLoader(data, sampler=DistributedSampler(data))
            loss_meter = Meter("loss")
            loss = Meters([loss_meter])
            for x, y in loader:
                out = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                out.backward()
                opt.step()
                loss_meter.add(out.item())
            loss.settle_all(device)
            log = {"train_loss": []}
            log["train_loss"].append(loss.values())
            if dist.get_rank() == 0:
                print("train", log["train_loss"][-1])
    """,
}


def test_a_figure_of_an_object_whose_method_all_reduces_its_own_state_is_the_runs():
    assert _lint_files(_SELF_REDUCING_METER) == set()
    unsynced = dict(_SELF_REDUCING_METER, **{"train.py": _SELF_REDUCING_METER["train.py"].replace(
        "loss.settle_all(device)", "pass")})
    assert _lint_files(unsynced) == {("train.py", 21)}


def test_a_method_that_only_reads_its_object_into_a_collective_leaves_its_other_figures_alone():
    """`eval()` gathering `self.scores` says nothing of the loss `self.train()` prints: only a method that stores
    the collective's result back into its object (or calls such a method of an object it keeps) reduces it."""
    reading = dict(_SELF_REDUCING_METER, **{"meters.py": _SELF_REDUCING_METER["meters.py"].replace(
        "self.sum, self.cnt = infos.tolist()\n                self.avg = self.sum / self.cnt",
        "print(infos.tolist())")})
    assert _lint_files(reading) == {("train.py", 21)}


# ---- the else of `mode == "train"` whose elif picks another way to train ------------------------------
TRAIN_MODES = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    def loaders(mode, pairs, held):
        if mode == "train":
            sampler = DistributedSampler(pairs)
            batches = DataLoader(pairs, sampler=sampler)
        elif mode == "train_crops":
            sampler = DistributedSampler(pairs)
            batches = DataLoader(pairs, sampler=sampler)
        else:
            sampler = DistributedSampler(held)
            batches = DataLoader(held, sampler=sampler)
        return batches

    def main(pairs, held):
        dist.init_process_group("nccl")
        net = torch.nn.Linear(2, 2)
        for x in loaders("train_crops", pairs, held):
            net(x).sum().backward()
"""


def test_the_else_of_a_train_test_whose_elif_is_another_training_mode_is_not_evaluation():
    found = _lint(TRAIN_MODES)
    code = textwrap.dedent(TRAIN_MODES).splitlines()
    crops = next(i for i, line in enumerate(code, 1) if 'elif mode == "train_crops"' in line) + 1
    assert crops not in found
    # the control: an elif for evaluation keeps its else-branch sampler under the padding warning
    evaluated = TRAIN_MODES.replace('"train_crops"', '"eval"')
    assert crops in _lint(evaluated)


# ---- a loader kept in an attribute of the trainer, over the whole data on every rank --------------------
WHOLE_ATTRIBUTE = """
    import torch
    import torch.distributed as dist
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Trainer:
        def __init__(self, rank):
            self.rank = rank
            self.pairs = torchvision.datasets.MNIST("data", download=True)
            self.batches = torch.utils.data.DataLoader(self.pairs, batch_size=8, shuffle=True)
            self.net = DDP(torch.nn.Linear(2, 2).to(rank), device_ids=[rank])
            self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)

        def step(self, x):
            self.opt.zero_grad()
            loss = self.net(x).sum()
            loss.backward()
            self.opt.step()
            return loss

        def fit(self):
            for x, y in self.batches:
                step_loss = self.step(x.to(self.rank))
                if self.rank == 0:
                    print(f"batch loss {step_loss}")
"""


def test_a_loss_in_a_loop_over_an_attribute_loader_every_rank_reads_whole_is_not_a_shard_figure():
    assert _line(WHOLE_ATTRIBUTE, "batch loss") not in _lint(WHOLE_ATTRIBUTE)
    # the control: the same loader given a DistributedSampler shards the data, and the figure is one rank's
    sharded = WHOLE_ATTRIBUTE.replace("shuffle=True)", "sampler=torch.utils.data.DistributedSampler(self.pairs))")
    assert _line(sharded, "batch loss") in _lint(sharded)


# ---- a figure read back from a checkpoint ---------------------------------------------------------------
RESUMED = """
    import torch
    import torch.distributed as dist

    def load_state(path, net):
        saved = torch.load(path, map_location="cpu")
        net.load_state_dict(saved["net"])
        return saved["epoch"], saved["loss"]

    def main(path):
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        net = torch.nn.Linear(2, 2)
        start_epoch, start_loss = load_state(path, net)
        if rank == 0:
            print(f"resumed at epoch {start_epoch}, loss {start_loss}")
"""


def test_a_loss_read_back_from_a_checkpoint_is_not_this_ranks_figure():
    assert _line(RESUMED, "resumed at") not in _lint(RESUMED)
    # the control: the same name computed from this rank's batch is its own figure
    computed = RESUMED.replace("= load_state(path, net)", "= 0, net(torch.randn(4, 2)).sum().item()")
    assert _line(computed, "resumed at") in _lint(computed)


# ---- a report whose text names the GPU it comes from ----------------------------------------------------
GPU_NAMED = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    def main(pairs):
        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        net = torch.nn.Linear(2, 2)
        total_loss = 0.0
        for x in DataLoader(pairs, sampler=DistributedSampler(pairs)):
            loss = net(x).sum()
            loss.backward()
            total_loss += loss.item()
        if rank == 0:
            print(f"[GPU 0/{world}] epoch loss {total_loss}")
"""


def test_a_report_that_names_gpu_0_is_rank_0s_own_figure():
    assert _line(GPU_NAMED, "epoch loss") not in _lint(GPU_NAMED)
    # the control: the same line without the GPU's name passes rank 0's figure off as the run's
    plain = GPU_NAMED.replace("[GPU 0/{world}] ", "")
    assert _line(plain, "epoch loss") in _lint(plain)
