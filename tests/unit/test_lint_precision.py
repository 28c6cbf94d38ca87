"""False alarms of `ddpkit lint` on shapes real scripts take, each beside the real mistake it must still report."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ddpkit.lint import lint_source, lint_sources


def _lint(code: str, rule: str) -> list[int]:
    """Lines of `code` where `rule` fires."""
    return [f.line for f in lint_source(textwrap.dedent(code), "train.py") if f.rule == rule]


def _line(code: str, needle: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if needle in line)


def _lint_files(files: dict[str, str], rule: str) -> set[tuple[str, int]]:
    sources = {path: textwrap.dedent(code) for path, code in files.items()}
    return {(f.path, f.line) for f in lint_sources(sources) if f.rule == rule}


# ---- which process runs the code -----------------------------------------------------------------
SPAWN_WITH_FALLBACK = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def train(rank, cfg):
        if cfg.num_gpus > 1:
            dist.init_process_group("nccl", rank=rank, world_size=cfg.num_gpus)
        print("starting epoch")
        dist.destroy_process_group()

    def main(cfg):
        print("preparing the run")
        if cfg.num_gpus > 1:
            mp.spawn(train, nprocs=cfg.num_gpus, args=(cfg,))
        else:
            train(0, cfg)

    if __name__ == "__main__":
        main(None)
"""


def test_spawn_parent_with_single_process_fallback_is_not_a_rank():
    # `else: train(0, cfg)` runs the worker as one process with a fixed rank: main() stays the parent
    lines = _lint(SPAWN_WITH_FALLBACK, "DDP008")
    assert _line(SPAWN_WITH_FALLBACK, "preparing the run") not in lines
    assert lines == [_line(SPAWN_WITH_FALLBACK, "starting epoch")]  # the worker's own print still counts


def test_worker_called_with_a_rank_variable_still_makes_the_caller_a_rank():
    # the ImageNet example's two modes: `main_worker(args.gpu, ...)` is what torchrun runs on every rank (the
    # worker starts its group on a flag of its own, not on the test that chose mp.spawn)
    code = SPAWN_WITH_FALLBACK.replace("train(0, cfg)", "train(cfg.gpu, cfg)").replace(
        "        if cfg.num_gpus > 1:\n            dist.init", "        if cfg.distributed:\n            dist.init")
    assert "cfg.distributed" in code
    assert _line(code, "preparing the run") in _lint(code, "DDP008")


def test_package_put_on_sys_path_is_followed_from_the_entry_script():
    # tools/train.py imports lib/core/function.py as `core.function` (lib/ is put on sys.path at run time):
    # function.py belongs to train.py's program, so its test() that nothing calls is code no rank runs
    files = {
        "proj/tools/train.py": """
            import _init_paths
            import torch.distributed as dist
            from core.function import train

            def main():
                dist.init_process_group("gloo")
                train()
                dist.destroy_process_group()

            if __name__ == "__main__":
                main()
        """,
        "proj/lib/core/function.py": """
            def train():
                print("training")

            def test():
                print("testing")
        """,
    }
    assert _lint_files(files, "DDP008") == {("proj/lib/core/function.py", 3)}


# ---- messages that explain why a process stops ----------------------------------------------------
BAD_HEADER = """
    import sys
    import torch.distributed as dist
    import logging

    logging.basicConfig(level=logging.INFO)
    dist.init_process_group("gloo")

    def check_header(header):
        if header[0] != 7:
            print("ERROR: bad magic number in the data file")
            print("HINT: regenerate the data")
            sys.exit(1)
        if header[1] != 1:
            logging.info("unsupported version")
            quit()
        print("header ok")

    check_header([7, 1])
    dist.destroy_process_group()
"""


def test_a_run_of_messages_before_exit_is_not_repeated_output():
    # every rank that finds the bad file says why it stops; that is no duplicated progress line
    assert _lint(BAD_HEADER, "DDP008") == [_line(BAD_HEADER, "header ok")]


NAN_CHECK = """
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")

    def attend(q, k):
        scores = q @ k.T
        if torch.isnan(scores).any():
            print("DEBUG: NaN in the attention scores")
            import sys

            sys.exit(1)
        if torch.isinf(scores).any():
            print("DEBUG: inf in the attention scores")
            pass
            raise FloatingPointError("inf")
        print("attention ok")
        return scores

    attend(torch.ones(2, 2), torch.ones(2, 2))
    dist.destroy_process_group()
"""


def test_an_import_between_the_message_and_the_exit_keeps_it_a_reason_to_stop():
    # `print(...); import sys; sys.exit(1)`: the import writes nothing, the message still says why the rank stops
    assert _lint(NAN_CHECK, "DDP008") == [_line(NAN_CHECK, "attention ok")]


VALIDATION_INSIDE_TRAINING = """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler


    class Metric:
        def __init__(self):
            self.steps = 0
            self.value = 0

        def update(self, value):
            self.steps += 1
            self.value += (value - self.value) / self.steps


    def main(rank, root):
        dist.init_process_group("nccl")
        torch.cuda.set_device(rank)
        model = DDP(torch.nn.Linear(4, 4).to(rank), device_ids=[rank])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        train_set = TensorDataset(torch.load(root, map_location="cpu"))
        val_set = TensorDataset(torch.load(root, map_location="cpu"))
        train_loader = DataLoader(train_set, batch_size=8, sampler=DistributedSampler(train_set, drop_last=True))
        val_loader = DataLoader(val_set, batch_size=1, shuffle=False)
        val_loss = Metric()
        train_loss = Metric()
        for epoch in range(10):
            train_loader.sampler.set_epoch(epoch)
            for x, lengths, y in train_loader:
                loss = F.l1_loss(model(x.to(rank)), y.to(rank)) / lengths.to(rank).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
                train_loss.update(loss.item())
                if rank == 0:
                    print(f"train loss {train_loss.value:.4f}")
                for i, (x, y) in enumerate(val_loader):
                    with torch.no_grad():
                        out = model(x.to(rank))
                        loss = F.l1_loss(out, y.to(rank))
                    val_loss.update(loss.item())
                if rank == 0:
                    print(f"valid loss {val_loss.value:.4f}")
        dist.destroy_process_group()
"""


def test_a_loss_name_set_anew_in_a_loop_over_whole_data_is_that_loops_figure():
    # the validation loop (nested in the training loop, over a loader with no sampler) reassigns `loss` from its own
    # batches before `val_loss.update(loss.item())`: the training loop's `loss` (built from the shard) is not the one
    # fed there, so val_loss is every rank's whole-set figure; the training line stays reported
    assert _lint(VALIDATION_INSIDE_TRAINING, "DDP006") == [_line(VALIDATION_INSIDE_TRAINING, 'f"train loss')]


def test_a_loss_built_through_names_the_validation_loop_moves_anew_is_that_loops_figure():
    # `x, y = x.to(rank), y.to(rank)` rebinds the loop's own batch, `out = model(x)` then `loss = ...(out, y)`: a chain
    # of names the training loop also binds (there from a tuple that holds its shard's `lengths` too)
    code = VALIDATION_INSIDE_TRAINING.replace(
        "loss = F.l1_loss(model(x.to(rank)), y.to(rank)) / lengths.to(rank).sum()",
        "x, lengths = x.to(rank), lengths.to(rank)\n"
        "                out = model(x)\n"
        "                loss = F.l1_loss(out, y.to(rank)) / lengths.sum()").replace(
        "                    with torch.no_grad():\n                        out = model(x.to(rank))",
        "                    x, y = x.to(rank), y.to(rank)\n"
        "                    with torch.no_grad():\n                        out = model(x)")
    assert "x, y = x.to(rank), y.to(rank)" in code and "x, lengths = " in code
    assert _lint(code, "DDP006") == [_line(code, 'f"train loss')]


# ---- which assignment a use sees --------------------------------------------------------------------
PLATFORMS = """
    import os
    import torch
    import torch.distributed as dist

    def setup(platform):
        if platform == "single_node":
            dist.init_process_group("nccl")
            gpu = dist.get_rank()
            torch.cuda.set_device(gpu)
        elif platform == "mpi":
            gpu = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
            torch.cuda.set_device(gpu)
            dist.init_process_group("nccl")
        else:
            gpu = dist.get_rank()
            gpu = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(gpu)
        return gpu

    setup(os.environ.get("PLATFORM", "mpi"))
    dist.destroy_process_group()
"""


def test_gpu_index_follows_the_assignment_that_reaches_it():
    # `gpu` is the global rank in one branch only: the other branches' set_device(gpu) use a local rank
    lines = [line for line in _lint(PLATFORMS, "DDP012")]
    assert lines == [_line(PLATFORMS, "torch.cuda.set_device(gpu)")]  # the first branch's is still reported


# ---- files that are no shared checkpoint ------------------------------------------------------------
FEATURE_CACHE = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import Dataset

    class Sounds(Dataset):
        def __init__(self, paths):
            self.paths = paths

        def __getitem__(self, index):
            return self.features(self.paths[index])

        def features(self, wav_path):
            cache = wav_path.replace(".wav", ".mel")
            mel = torch.randn(80, 100)
            torch.save(mel, cache)
            return mel

        def export(self, path):
            torch.save(self.paths, path)

    dist.init_process_group("gloo")
    data = Sounds(["a.wav"])
    data.export("paths.pt")
    dist.destroy_process_group()
"""


def test_cache_file_written_by_a_helper_of_getitem_is_per_sample():
    # features() runs once per sample (only __getitem__ calls it): each rank caches its own samples
    assert _lint(FEATURE_CACHE, "DDP004") == [_line(FEATURE_CACHE, "torch.save(self.paths, path)")]


SNAPSHOTS = """
    import io
    import torch
    import torch.distributed as dist

    class State:
        def __init__(self, model):
            self.model = model

        def save(self, f):
            torch.save(self.model.state_dict(), f)

    def share(state, src):
        with io.BytesIO() as f:
            torch.save(state.model.state_dict(), f)
            blob = torch.frombuffer(bytearray(f.getvalue()), dtype=torch.uint8)
        dist.broadcast(blob, src=src)

    def main():
        dist.init_process_group("gloo")
        state = State(torch.nn.Linear(2, 2))
        share(state, 0)
        torch.save(state.model.state_dict(), "last.pt")
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
"""


def test_in_memory_file_of_a_with_block_and_a_method_nothing_calls():
    # `with io.BytesIO() as f` writes no file; State.save is never called (torch.save names no method of ours)
    assert _lint(SNAPSHOTS, "DDP004") == [_line(SNAPSHOTS, 'torch.save(state.model.state_dict(), "last.pt")')]


def test_a_project_method_called_on_an_object_stays_live():
    code = SNAPSHOTS.replace("share(state, 0)", "state.save('state.pt')")
    assert _line(code, "torch.save(self.model.state_dict(), f)") in _lint(code, "DDP004")


# ---- seeds ----------------------------------------------------------------------------------------------
SEED_HELPER_ELSEWHERE = """
    import os
    import torch
    import torch.distributed as dist
    from helpers.general import init_seeds

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    init_seeds(1 + rank)
    model = torch.nn.Linear(4, 2)
    dist.destroy_process_group()
"""


def test_seed_helper_from_a_module_not_linted_is_no_missing_seed():
    # init_seeds comes from a file not given to the linter: "nothing seeds" would be a guess
    assert _lint(SEED_HELPER_ELSEWHERE, "DDP014") == []


def test_no_seed_at_all_is_not_a_finding():
    # repeatability, not a difference between the ranks: unseeded generators already differ per rank and DDP
    # broadcasts rank 0's initial weights; what seeds the program may also lie outside the files linted
    unseeded = SEED_HELPER_ELSEWHERE.replace("init_seeds(1 + rank)", "augment = RandomCrop(32)").replace(
        "from helpers.general import init_seeds", "from torchvision.transforms import RandomCrop")
    assert _lint(unseeded, "DDP014") == []
    # the same seed on every rank, with the augmentation, is still reported
    alike = unseeded.replace("augment = RandomCrop(32)", "augment = RandomCrop(32)\n    torch.manual_seed(0)")
    assert _lint(alike, "DDP014") == [_line(alike, "torch.manual_seed")]


SEED_HASHED_WITH_RANK = """
    import torch
    import torch.distributed as dist
    from torchvision import transforms

    def set_random_seed(*args):
        seed = hash(args) % (1 << 31)
        torch.manual_seed(seed)

    def training_loop(seed=0):
        dist.init_process_group("gloo")
        set_random_seed(seed, dist.get_rank())
        augment = transforms.RandomHorizontalFlip()
        dist.destroy_process_group()
        return augment

    training_loop()
"""


def test_a_seed_built_from_a_helpers_extra_arguments_follows_the_rank_given_there():
    # `*args` collects dist.get_rank(), and the seed is built from args inside the helper: it differs per rank
    assert _lint(SEED_HASHED_WITH_RANK, "DDP014") == []
    alike = SEED_HASHED_WITH_RANK.replace("set_random_seed(seed, dist.get_rank())", "set_random_seed(seed, 7)")
    # reported where the same seed is chosen, the helper's call, not inside the helper
    assert _lint(alike, "DDP014") == [_line(alike, "set_random_seed(seed, 7)")]
    # followed through a local assignment from a named parameter too
    named = SEED_HASHED_WITH_RANK.replace("def set_random_seed(*args):", "def set_random_seed(base, offset):") \
        .replace("hash(args)", "(base * 1000 + offset)")
    assert _lint(named, "DDP014") == []


SEED_FROM_SEEDED_GENERATOR = """
    import numpy as np
    import torch
    import torch.distributed as dist
    from torchvision import transforms

    dist.init_process_group("gloo")
    augment = transforms.RandomHorizontalFlip()
    np.random.seed(1000 * 7 + dist.get_rank())
    torch.manual_seed(np.random.randint(1 << 31))
    dist.destroy_process_group()
"""


def test_seed_drawn_from_a_generator_seeded_per_rank_differs_per_rank():
    assert _lint(SEED_FROM_SEEDED_GENERATOR, "DDP014") == []
    alike = SEED_FROM_SEEDED_GENERATOR.replace("1000 * 7 + dist.get_rank()", "1000 * 7")
    assert _lint(alike, "DDP014") == [_line(alike, "torch.manual_seed")]


# ---- hangs ------------------------------------------------------------------------------------------------
def test_rank_check_on_a_local_rank_that_is_only_non_negative_is_a_mode_check():
    code = """
        import torch
        import torch.distributed as dist

        def main(args, resume):
            distributed = args.local_rank >= 0
            if distributed:
                dist.init_process_group("gloo")
            if resume:
                if distributed:
                    dist.barrier()
            if args.local_rank <= 0:
                dist.barrier()
            dist.destroy_process_group()

        main(None, True)
    """
    # `local_rank >= 0` holds on every rank of a distributed run; `local_rank <= 0` picks rank 0
    assert _lint(code, "DDP010") == [_line(code, "if args.local_rank <= 0:") + 1]


NONFINITE_SCAN = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(2, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10):
        loss = model(torch.randn(4, 2)).sum()
        loss.backward()
        bad = False
        for p in model.parameters():
            if not torch.isfinite(p.grad).all():
                bad = True
                break
        if not bad:
            opt.step()
    dist.destroy_process_group()
"""


def test_break_out_of_a_scan_over_parameters_is_no_rank_leaving_the_loop():
    assert _lint(NONFINITE_SCAN, "DDP010") == []
    # the same check breaking out of the training loop leaves the other ranks waiting in backward()
    leaves = NONFINITE_SCAN.replace("        bad = False\n        for p in model.parameters():\n"
                                    "            if not torch.isfinite(p.grad).all():\n"
                                    "                bad = True\n                break\n",
                                    "        if not torch.isfinite(loss):\n            break\n")
    assert _lint(leaves, "DDP010") == [_line(leaves, "break")]


# ---- samplers -------------------------------------------------------------------------------------------
def test_sampler_built_in_a_helper_called_only_when_distributed():
    files = {
        "p/train.py": """
            import torch.distributed as dist
            from data import make_sampler

            def main(args, dataset):
                if args.distributed:
                    dist.init_process_group("gloo")
                    sampler = make_sampler(dataset)
                else:
                    sampler = None
                for epoch in range(10):
                    if args.distributed:
                        sampler.set_epoch(epoch)
                    for batch in dataset:
                        pass
                dist.destroy_process_group()

            if __name__ == "__main__":
                main(None, [])
        """,
        "p/data.py": """
            from torch.utils.data import DistributedSampler

            def make_sampler(dataset):
                return DistributedSampler(dataset, shuffle=True)
        """,
    }
    assert _lint_files(files, "DDP001") == set()
    # built on every path (the helper called outside the mode check): every distributed run sets the flag and
    # reshuffles; the flag-off run is one process, where a repeated order is no DDP mistake
    everywhere = dict(files, **{"p/train.py": files["p/train.py"].replace(
        "                else:\n                    sampler = None\n",
        "                sampler = make_sampler(dataset)\n")})
    assert _lint_files(everywhere, "DDP001") == set()


SAMPLER_WRAPPED = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    from mysamplers import IterationBasedBatchSampler

    dist.init_process_group("gloo")
    data = list(range(100))
    sampler = DistributedSampler(data)
    batches = torch.utils.data.BatchSampler(sampler, batch_size=4, drop_last=False)
    batches = IterationBasedBatchSampler(batches, num_iterations=1000)
    loader = DataLoader(data, batch_sampler=batches)
    for epoch in range(3):
        for batch in loader:
            pass
    dist.destroy_process_group()
"""


def test_sampler_handed_to_a_batch_sampler_from_a_file_not_linted():
    # the wrapper's code is not visible and may call sampler.set_epoch itself (iteration-based training does)
    assert _lint(SAMPLER_WRAPPED, "DDP001") == []
    plain = SAMPLER_WRAPPED.replace("    batches = IterationBasedBatchSampler(batches, num_iterations=1000)\n", "")
    assert _lint(plain, "DDP001") == [_line(plain, "sampler = DistributedSampler(data)")]


def test_code_after_an_assert_of_one_process_is_single_process():
    code = """
        import torch.distributed as dist

        def main(args):
            if args.local_rank != -1:
                dist.init_process_group("gloo")
            if not args.evolve:
                print("training")
            else:
                assert args.local_rank == -1, "DDP mode not implemented for --evolve"
                print("evolving")
            dist.destroy_process_group()

        main(None)
    """
    assert _lint(code, "DDP008") == [_line(code, 'print("training")')]


# ---- guards at the call sites that reach the code -------------------------------------------------------
def test_save_branch_of_a_helper_gets_the_guard_of_the_calls_that_pass_a_model():
    files = {
        "q/train.py": """
            import torch
            import torch.distributed as dist
            from ckpt import checkpoint

            def main():
                dist.init_process_group("gloo")
                model = torch.nn.Linear(2, 2)
                state = checkpoint("run")
                for step in range(10):
                    if step % 5 == 0 and dist.get_rank() == 0:
                        checkpoint("run", model=model)
                dist.destroy_process_group()

            if __name__ == "__main__":
                main()
        """,
        "q/ckpt.py": """
            import torch

            def checkpoint(name, model=None):
                if model is not None:
                    torch.save(model.state_dict(), name + ".pt")
                else:
                    return torch.load(name + ".pt", map_location="cpu")
        """,
    }
    # only the rank-0 call passes a model: the save branch runs on rank 0 only
    assert _lint_files(files, "DDP004") == set()
    every_rank = dict(files, **{"q/train.py": files["q/train.py"].replace(
        'state = checkpoint("run")', 'state = checkpoint("run", model)')})
    assert _lint_files(every_rank, "DDP004") == {("q/ckpt.py", 6)}


def test_optional_parameter_guard_within_one_file():
    code = """
        import torch
        import torch.distributed as dist

        def checkpoint(name, model=None):
            if model is None:
                return torch.load(name, map_location="cpu")
            torch.save(model.state_dict(), name)

        def main():
            dist.init_process_group("gloo")
            model = torch.nn.Linear(2, 2)
            checkpoint("a.pt")
            if dist.get_rank() == 0:
                checkpoint("a.pt", model)
            dist.destroy_process_group()

        main()
    """
    assert _lint(code, "DDP004") == []
    unguarded = code.replace('checkpoint("a.pt")\n', 'checkpoint("a.pt", model=model)\n')
    assert _lint(unguarded, "DDP004") == [_line(unguarded, "torch.save")]


BLOCKS = """
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    class Basic(nn.Module):
        def __init__(self):
            super().__init__()
            print("basic block")

    class Bottleneck(nn.Module):
        def __init__(self):
            super(Bottleneck, self).__init__()
            print("bottleneck block")

    def small():
        return Basic()

    def large():
        return Bottleneck()

    dist.init_process_group("gloo")
    model = small()
    dist.destroy_process_group()
"""


def test_dunder_of_a_class_nothing_live_names_is_dead():
    # large() is never called, so nothing builds a Bottleneck (its own super() call does not count)
    assert _lint(BLOCKS, "DDP008") == [_line(BLOCKS, 'print("basic block")')]
    chosen = BLOCKS.replace("model = small()", "model = globals()['large']()")
    assert _line(chosen, 'print("bottleneck block")') in _lint(chosen, "DDP008")  # picked by a string


def test_sampler_given_to_a_loader_wrapper_from_a_library_is_still_reported():
    code = SAMPLER_WRAPPED.replace("from mysamplers import IterationBasedBatchSampler",
                                   "from timm.data import MultiEpochsDataLoader").replace(
        "    batches = IterationBasedBatchSampler(batches, num_iterations=1000)\n", "").replace(
        "loader = DataLoader(data, batch_sampler=batches)", "loader = MultiEpochsDataLoader(data, sampler=sampler)")
    assert _lint(code, "DDP001") == [_line(code, "sampler = DistributedSampler(data)")]


def test_function_reached_through_a_package_whose_init_is_not_linted_stays_live():
    files = {
        "r/train.py": """
            import torch
            import torch.distributed as dist
            import mypkg.ckpt

            dist.init_process_group("gloo")
            mypkg.ckpt.save(torch.nn.Linear(2, 2))
            dist.destroy_process_group()
        """,
        "r/mypkg/ckpt.py": """
            import torch

            def save(model):
                torch.save(model.state_dict(), "model.pt")
        """,
    }
    assert _lint_files(files, "DDP004") == {("r/mypkg/ckpt.py", 5)}


# ---- nothing random, nothing to seed -------------------------------------------------------------
JOIN_AND_PRINT = """
    import os
    import torch
    import torch.distributed as dist

    def main():
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()}")
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
"""


def test_a_program_that_draws_nothing_random_has_no_missing_seed_note():
    # it joins the group and prints: no model, no data, no draw, so there is nothing to seed
    assert _lint(JOIN_AND_PRINT, "DDP014") == []
    # nor once it builds a model: no seed at all is not reported (see test_no_seed_at_all_is_not_a_finding)
    modelled = JOIN_AND_PRINT.replace("        print(f\"rank", "        model = torch.nn.Linear(8, 2)\n        print(f\"rank")
    assert _lint(modelled, "DDP014") == []


# ---- a base-class method every subclass overrides ------------------------------------------------
OVERRIDDEN_BASE = {
    "framework.py": """
        class Trainer:
            def __init__(self, model):
                self.model = model

            def train(self, epochs):
                for epoch in range(epochs):
                    print("epoch", epoch)
    """,
    "ddp_framework.py": """
        import os
        import torch.distributed as dist
        from framework import Trainer

        class DistributedTrainer(Trainer):
            def train(self, epochs):
                rank = dist.get_rank()
                for epoch in range(epochs):
                    if rank == 0:
                        print("epoch", epoch)
    """,
    "main.py": """
        import torch
        import torch.distributed as dist
        from ddp_framework import DistributedTrainer

        dist.init_process_group("gloo")
        torch.manual_seed(0)
        DistributedTrainer(torch.nn.Linear(2, 2)).train(3)
        dist.destroy_process_group()
    """,
}


def test_a_base_method_every_subclass_overrides_does_not_run():
    # only DistributedTrainer is built: `.train(3)` runs its override, never Trainer.train's unguarded print
    assert _lint_files(OVERRIDDEN_BASE, "DDP008") == set()
    # built directly, the base's train runs and prints on every rank
    built = dict(OVERRIDDEN_BASE, **{"main.py": OVERRIDDEN_BASE["main.py"].replace(
        "DistributedTrainer(torch.nn.Linear(2, 2)).train(3)",
        "DistributedTrainer(torch.nn.Linear(2, 2)).train(3)\n        Trainer(torch.nn.Linear(2, 2)).train(1)").replace(
        "from ddp_framework import DistributedTrainer", "from ddp_framework import DistributedTrainer\n        from framework import Trainer")})
    assert _lint_files(built, "DDP008") == {("framework.py", 8)}
    # called through super(), the base's train runs as well
    chained = dict(OVERRIDDEN_BASE, **{"ddp_framework.py": OVERRIDDEN_BASE["ddp_framework.py"].replace(
        "rank = dist.get_rank()", "rank = dist.get_rank()\n                super().train(epochs)")})
    assert _lint_files(chained, "DDP008") == {("framework.py", 8)}


# ---- a module-level name and a function's own name of the same spelling -------------------------
MODULE_LOCAL_RANK = """
    import os
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])

    def setup():
        dist.init_process_group("nccl")
        local_rank = dist.get_rank()
        return local_rank

    def main():
        setup()
        torch.manual_seed(0)
        torch.cuda.set_device(local_rank)

    main()
"""


def test_a_function_reads_the_module_name_not_another_functions_local():
    # main() never binds local_rank: it reads the module's LOCAL_RANK, not setup()'s own get_rank()
    assert _lint(MODULE_LOCAL_RANK, "DDP012") == []
    # the module-level name itself from the global rank is the mistake
    wrong = MODULE_LOCAL_RANK.replace('int(os.environ["LOCAL_RANK"])', 'int(os.environ["RANK"])')
    assert _lint(wrong, "DDP012") == [_line(wrong, 'os.environ["RANK"]')]  # reported where it is bound


# ---- mp.spawn through the project's own launch helper ---------------------------------------------
LAUNCH_HELPER = {
    "launcher/__init__.py": """
        from .spawning import launch
    """,
    "launcher/spawning.py": """
        import torch.multiprocessing as mp

        def _worker(rank, fn, world_size):
            fn(rank, world_size)

        def launch(fn, world_size):
            mp.spawn(_worker, args=(fn, world_size), nprocs=world_size)
    """,
    "train.py": """
        import sys
        import torch
        import torch.distributed as dist
        import launcher

        print("importing")

        def work(rank, world_size):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            torch.manual_seed(rank)
            print("step done")
            dist.destroy_process_group()

        if __name__ == "__main__":
            world_size = int(sys.argv[1])
            print("starting", world_size, "ranks")
            launcher.launch(work, world_size)
    """,
}


def test_the_main_block_that_spawns_through_a_helper_is_the_parent():
    # launcher.launch (re-exported by the package) calls mp.spawn on a wrapper that runs `work`: the
    # `__main__` block is the parent process, so its print runs once; the worker's print runs on every rank
    # (the module-level print outside it runs again in each rank, which imports the file as __mp_main__)
    assert _lint_files(LAUNCH_HELPER, "DDP008") == {("train.py", 7), ("train.py", 12)}
    # the same block calling the worker itself (no spawn) is every rank's code under torchrun
    direct = dict(LAUNCH_HELPER, **{"train.py": LAUNCH_HELPER["train.py"].replace(
        "launcher.launch(work, world_size)", "work(int(sys.argv[2]), world_size)")})
    assert _lint_files(direct, "DDP008") == {("train.py", 7), ("train.py", 12), ("train.py", 17)}


# ---- placements in code nothing runs ----------------------------------------------------------------
DEAD_PLACEMENT = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Runner:
        def __init__(self, model):
            self.gpu = int(os.environ["LOCAL_RANK"])
            self.model = DDP(model.to(self.gpu), device_ids=[self.gpu])

        def fit(self, x):
            return self.model(x.to(self.gpu))

        def predict(self, x):
            return self.model(x.to("cuda"))

    dist.init_process_group("nccl")
    torch.manual_seed(0)
    Runner(torch.nn.Linear(4, 2)).fit(torch.ones(1, 4))
"""


def test_a_placement_in_a_method_nothing_calls_needs_no_current_device():
    # every live placement names the local rank; predict() with its plain "cuda" is never called
    assert _lint(DEAD_PLACEMENT, "DDP012") == []
    called = DEAD_PLACEMENT.replace(".fit(torch.ones(1, 4))", ".predict(torch.ones(1, 4))")
    assert _lint(called, "DDP012") == [_line(called, "dist.init_process_group")]


# ---- a loss unpacked from the evaluation's results -------------------------------------------------
EVAL_TUPLE = """
    import torch
    import torch.distributed as dist

    def validate(model, loader):
        total, count = 0.0, 0
        with torch.no_grad():
            for x, y in loader:
                total += torch.nn.functional.mse_loss(model(x), y).item()
                count += 1
        return total / count, count

    def main(model, train_loader, val_loader, optimizer):
        dist.init_process_group("gloo")
        torch.manual_seed(dist.get_rank())
        rank = dist.get_rank()
        for epoch in range(3):
            for x, y in train_loader:
                train_loss = torch.nn.functional.mse_loss(model(x), y)
                train_loss.backward()
                optimizer.step()
            if rank == 0:
                total_loss, seen = validate(model, val_loader)
                print(f"epoch {epoch} loss {total_loss:.3f} over {seen}")
"""


def test_a_loss_unpacked_from_the_evaluation_is_not_the_training_loss():
    # rank 0 validates the whole validation set itself: total_loss is its figure, not its shard's training loss
    assert _lint(EVAL_TUPLE, "DDP006") == []
    # the training loss printed the same way is rank 0's own
    trained = EVAL_TUPLE.replace('print(f"epoch {epoch} loss {total_loss:.3f} over {seen}")',
                                 'print(f"epoch {epoch} loss {train_loss.item():.3f} over {seen}")')
    assert _lint(trained, "DDP006") == [_line(trained, 'print(f"epoch')]
    # every rank evaluating its own loader, rank 0 printing its figure: that is rank 0's shard
    everywhere = EVAL_TUPLE.replace("""            if rank == 0:
                total_loss, seen = validate(model, val_loader)""", """            total_loss, seen = validate(model, train_loader)
            if rank == 0:""")
    assert _lint(everywhere, "DDP006") == [_line(everywhere, 'print(f"epoch')]


# ---- an evaluation sampler found by how its loader is used ----------------------------------------
LOADER_METHODS = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    class Data:
        def __init__(self, items):
            self.items = items

        def batches_a(self, size):
            return DataLoader(self.items, batch_size=size, sampler=DistributedSampler(self.items))

        def batches_b(self, size):
            return DataLoader(self.items, batch_size=size, sampler=DistributedSampler(self.items))

    def run(model, optimizer, data):
        dist.init_process_group("gloo")
        torch.manual_seed(dist.get_rank())
        for epoch in range(3):
            for x, y in data.batches_a(8):
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                for x, y in data.batches_b(8):
                    model(x)
"""


def test_a_sampler_whose_loader_only_evaluates_needs_no_set_epoch():
    # batches_b's loader is only looped over without backward(): its order does not matter
    assert _lint(LOADER_METHODS, "DDP001") == [_line(LOADER_METHODS, "def batches_a") + 1]
    # once it also trains, it needs set_epoch too
    trains = LOADER_METHODS.replace("                    model(x)", "                    model(x).sum().backward()")
    assert _lint(trains, "DDP001") == [_line(trains, "def batches_a") + 1, _line(trains, "def batches_b") + 1]


# ---- what a reducing helper does not reduce -----------------------------------------------------------
HELPER_GATHERS = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    def accuracy(model, loader, device):
        model.eval()
        hits = torch.zeros(2, device=device)
        with torch.no_grad():
            for x, y in loader:
                hits += torch.tensor([(model(x.to(device)).argmax(1) == y.to(device)).sum(), len(y)], device=device)
        dist.all_reduce(hits)
        return (hits[0] / hits[1]).item()

    def fit(model, data, test_loader, optimizer, device):
        rank = dist.get_rank()
        sampler = DistributedSampler(data)
        train_loader = DataLoader(data, batch_size=8, sampler=sampler)
        for epoch in range(3):
            total_loss = 0.0
            sampler.set_epoch(epoch)
            for step, batch in enumerate(train_loader):
                inputs, labels = batch
                output = model(**inputs, labels=labels)
                loss = output[0]
                loss.backward()
                optimizer.step()
                total_loss += loss.item()
            acc = accuracy(model, test_loader, device)
            if rank == 0:
                print(f"epoch {epoch} loss {total_loss:.3f} acc {acc:.3f}")

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        torch.manual_seed(dist.get_rank())
        fit(torch.nn.Linear(4, 2), [], [], None, "cpu")
"""


def test_a_helper_that_reduces_a_metric_does_not_reduce_the_model_nor_the_loss():
    # accuracy() all-reduces its own hits; the model, loader and device it is handed are not reduced, nor is
    # the training loss computed with that model
    assert _lint(HELPER_GATHERS, "DDP006") == [_line(HELPER_GATHERS, 'print(f"epoch')]
    # a plain `train` function that reduces: `model.train()` is the module's method, not that function
    renamed = HELPER_GATHERS.replace("def fit(", "def train(").replace("    fit(torch", "    train(torch").replace(
        "        for epoch in range(3):", "        for epoch in range(3):\n            model.train()")
    assert _lint(renamed, "DDP006") == [_line(renamed, 'print(f"epoch')]
    # the loss reduced before the print is the run's
    reduced = HELPER_GATHERS.replace("            acc = accuracy(", "            total_loss = torch.tensor(total_loss)\n"
                                     "            dist.all_reduce(total_loss)\n            acc = accuracy(")
    assert _lint(reduced, "DDP006") == []


# ---- a sampler stored under a key nothing picks -------------------------------------------------------
KEYED_SAMPLERS = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    dist.init_process_group("gloo")
    sets = {"train": list(range(64))}
    sets["extra"] = sets["train"]
    samplers = {"train": DistributedSampler(sets["train"]), "extra": DistributedSampler(sets["extra"])}
    loaders = {k: DataLoader(sets[k], sampler=samplers[k]) for k in samplers}
    for epoch in range(3):
        for x in loaders["train"]:
            pass
    dist.destroy_process_group()
"""


def test_a_sampler_under_a_key_nothing_picks_is_not_reported():
    # only the "train" loader is iterated: the "extra" sampler's loader never runs
    code = KEYED_SAMPLERS.replace('"extra": DistributedSampler', '\n        "extra": DistributedSampler')
    assert _lint(code, "DDP001") == [_line(code, 'samplers = {"train"')]
    # the trap: once the program names the key where it picks loaders, both count
    picked = code.replace('for x in loaders["train"]:', 'for x in loaders["train"] + loaders["extra"]:')
    assert sorted(_lint(picked, "DDP001")) == [_line(picked, 'samplers = {"train"'), _line(picked, '"extra": Dist')]


# ---- a bare name is its own module's function ---------------------------------------------------------
TWO_MAINS = {
    "tools/val.py": """
        import torch

        def evaluate(model):
            print("evaluating")
            return 0.0

        def main():
            model = torch.nn.Linear(4, 2)
            print("standalone evaluation", evaluate(model))

        if __name__ == "__main__":
            main()
    """,
    "tools/train.py": """
        import torch
        import torch.distributed as dist
        from val import evaluate

        def main():
            dist.init_process_group("gloo")
            model = torch.nn.Linear(4, 2)
            evaluate(model)
            dist.destroy_process_group()

        if __name__ == "__main__":
            main()
    """,
}


def test_a_bare_call_runs_its_own_modules_function_not_an_imported_modules_namesake():
    # train.py's `main()` is train.py's main: val.py's main runs only from val.py's own __main__ block,
    # which is dead when train.py imports val.py; evaluate, which train.py calls, still runs on every rank
    found = _lint_files(TWO_MAINS, "DDP008")
    assert found == {("tools/val.py", 5)}
    # the trap: once train.py calls val.main through the module, it runs
    called = dict(TWO_MAINS, **{"tools/train.py": TWO_MAINS["tools/train.py"].replace(
        "from val import evaluate", "import val\n        from val import evaluate").replace(
        "evaluate(model)\n", "evaluate(model)\n            val.main()\n")})
    assert _lint_files(called, "DDP008") == {("tools/val.py", 5), ("tools/val.py", 10)}


# ---- branches no call turns on ----------------------------------------------------------------------------
def _switched_fixture() -> str:
    return (Path(__file__).resolve().parents[1] / "fixtures" / "lint" / "good_switched_off_branch.py").read_text()


def test_a_branch_on_a_parameter_every_call_gives_false_never_runs():
    code = _switched_fixture()
    assert _lint(code, "DDP008") == []
    # the trap: once the construction passes True (or one call turns verbose on), the branches run
    resumed = code.replace('Trainer(torch.nn.Linear(4, 1), False, "snapshot.pt")',
                           'Trainer(torch.nn.Linear(4, 1), True, "snapshot.pt")')
    assert _lint(resumed, "DDP008") == [_line(resumed, 'print("resuming")'), _line(resumed, 'print("loaded"')]
    chatty = code.replace("size = describe(trainer.model)", "size = describe(trainer.model, verbose=True)")
    assert _lint(chatty, "DDP008") == [_line(chatty, "print(model)")]
    # nor when the function is also handed on as a value (a launcher may call it with other arguments)
    handed = code.replace("size = describe(trainer.model)", "size = describe(trainer.model)\nhook = describe")
    assert _lint(handed, "DDP008") == [_line(handed, "print(model)")]


# ---- a seed drawn from the generator it then seeds --------------------------------------------------
SEED_DRAWN_FROM_ITS_OWN_GENERATOR = """
    import numpy as np
    import torch
    import torch.distributed as dist
    import torchvision.transforms as T
    from torch.nn.parallel import DistributedDataParallel as DDP

    params = {"seed": None}


    def init():
        seed = params["seed"]
        if params["seed"] is None:
            seed = np.random.randint(1, 10000)
        np.random.seed(seed)
        torch.manual_seed(seed)


    def main():
        dist.init_process_group("gloo")
        init()
        augment = T.RandomHorizontalFlip()
        model = DDP(torch.nn.Linear(4, 2))
"""


def test_a_seed_drawn_from_the_generator_it_seeds_is_read_without_endless_recursion():
    # `seed = np.random.randint(...)` then `np.random.seed(seed)`: the linter used to follow the draw to the seed
    # call, whose value is the draw, and so on until RecursionError (and `ddpkit port`, which lints its output,
    # crashed with it). The draw comes before any seed: each rank draws its own, so no same-seed warning.
    assert _lint(SEED_DRAWN_FROM_ITS_OWN_GENERATOR, "DDP014") == []
