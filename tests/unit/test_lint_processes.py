"""Which process runs which code: the program model `ddpkit lint` builds from how the ranks are started."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_source, lint_sources


def _lint(code: str, rule: str) -> list[int]:
    """Lines of `code` where `rule` fires."""
    return [f.line for f in lint_source(textwrap.dedent(code), "train.py") if f.rule == rule]


def _line(code: str, needle: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if needle in line)


# ---- the worker handed to mp.spawn by keyword, with a one-process path by keyword ------------------
SPAWN_BY_KEYWORD = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def run_rank(rank, cfg):
        dist.init_process_group("nccl", rank=rank, world_size=cfg.gpus)
        print("rank is training")
        dist.destroy_process_group()

    def launch(cfg):
        print("writing the run folder")
        if cfg.gpus == 1:
            run_rank(rank=0, cfg=cfg)
        else:
            mp.spawn(fn=run_rank, args=(cfg,), nprocs=cfg.gpus)

    if __name__ == "__main__":
        launch(None)
"""


def test_worker_passed_as_fn_keyword_leaves_the_launcher_the_parent():
    lines = _lint(SPAWN_BY_KEYWORD, "DDP008")
    assert _line(SPAWN_BY_KEYWORD, "writing the run folder") not in lines
    assert lines == [_line(SPAWN_BY_KEYWORD, "rank is training")]  # the worker's own print still counts


def test_worker_called_with_a_rank_keyword_variable_makes_the_caller_a_rank():
    code = SPAWN_BY_KEYWORD.replace("run_rank(rank=0, cfg=cfg)", "run_rank(rank=cfg.rank, cfg=cfg)")
    assert _line(code, "writing the run folder") in _lint(code, "DDP008")


# ---- a function handed to the worker through the spawn's args ------------------------------------
PROCESS_WITH_FN_PARAMETER = """
    import torch
    import torch.distributed as dist
    from torch.multiprocessing import Process

    def fit(rank, opts):
        torch.manual_seed(opts.seed + rank)
        print("resumed from the checkpoint")
        loss = torch.randn(1)
        if rank == 0:
            print("loss", loss.item())

    def start(rank, size, body, opts):
        dist.init_process_group("gloo", rank=rank, world_size=size)
        body(rank, opts)

    if __name__ == "__main__":
        workers = []
        for r in range(2):
            p = Process(target=start, args=(r, 2, fit, None))
            p.start()
            workers.append(p)
        for p in workers:
            p.join()
"""


def test_function_handed_to_a_process_target_runs_in_the_rank():
    code = PROCESS_WITH_FN_PARAMETER
    assert _line(code, "resumed from the checkpoint") in _lint(code, "DDP008")
    assert _line(code, '"loss"') in _lint(code, "DDP006")
    assert _lint(code, "DDP014") == []  # seeded in the rank with seed + rank, not in the parent


def test_function_passed_but_never_called_by_the_worker_stays_parent_code():
    code = PROCESS_WITH_FN_PARAMETER.replace("body(rank, opts)", "print(body)")
    assert _line(code, "resumed from the checkpoint") not in _lint(code, "DDP008")


# ---- a class a rank builds -------------------------------------------------------------------------
SPAWN_BUILDS_A_CLASS = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    class Graph:
        def __init__(self, path):
            self.path = path
            print("graph loaded from", path)

    class Settings:
        def __init__(self):
            print("parsing the settings")

    def worker(rank, world):
        dist.init_process_group("gloo", rank=rank, world_size=world)
        graph = Graph("edges.txt")
        dist.destroy_process_group()

    if __name__ == "__main__":
        settings = Settings()
        mp.spawn(worker, args=(2,), nprocs=2)
"""


def test_constructor_of_a_class_a_rank_builds_runs_in_the_rank():
    lines = _lint(SPAWN_BUILDS_A_CLASS, "DDP008")
    assert _line(SPAWN_BUILDS_A_CLASS, "graph loaded from") in lines
    assert _line(SPAWN_BUILDS_A_CLASS, "parsing the settings") not in lines  # built by the parent only


# ---- a guard that stops only in one mode -------------------------------------------------------------
ONE_GPU_ASSERTION = """
    import os
    import torch
    import torch.distributed as dist

    def train(rank, n_gpus):
        if n_gpus > 1:
            dist.init_process_group("nccl")
        print("epoch done")

    if __name__ == "__main__":
        rank = int(os.environ["RANK"])
        n_gpus = torch.cuda.device_count()
        if n_gpus == 1 and rank != 0:
            raise RuntimeError("one GPU but rank > 0")
        train(rank, n_gpus)
"""


def test_rank_check_joined_with_another_condition_does_not_guard_the_rest():
    assert _line(ONE_GPU_ASSERTION, "epoch done") in _lint(ONE_GPU_ASSERTION, "DDP008")


def test_plain_rank_check_that_stops_still_guards_the_rest():
    code = ONE_GPU_ASSERTION.replace("n_gpus == 1 and rank != 0", "rank != 0")
    assert _line(code, "epoch done") not in _lint(code, "DDP008")


# ---- a byte-order mark -----------------------------------------------------------------------------------
def test_utf8_byte_order_mark_is_not_a_syntax_error():
    code = "\ufeff" + textwrap.dedent(ONE_GPU_ASSERTION).lstrip()
    rules = [f.rule for f in lint_sources({"train.py": code})]
    assert "DDP000" not in rules and "DDP008" in rules


# ---- a builtins.print swap silences only the prints after it -----------------------------------------
PRINT_SWAP = """
    import builtins
    import os
    import torch.distributed as dist

    def quiet_unless(master):
        original = builtins.print
        def shown(*args, **kwargs):
            if master:
                original(*args, **kwargs)
        builtins.print = shown

    def setup():
        dist.init_process_group("nccl")
        print("waiting at the barrier")
        dist.barrier()
        quiet_unless(int(os.environ["RANK"]) == 0)
        print("group ready")

    def train():
        setup()
        print("epoch done")

    if __name__ == "__main__":
        train()
"""


def test_print_before_the_swap_runs_on_every_rank():
    lines = _lint(PRINT_SWAP, "DDP008")
    assert _line(PRINT_SWAP, "waiting at the barrier") in lines
    assert _line(PRINT_SWAP, "group ready") not in lines  # after the swap: rank 0 alone shows it
    assert _line(PRINT_SWAP, "epoch done") not in lines


# ---- mp reached through `from helper import *` -----------------------------------------------------------
STAR_FILES = {
    "proj/dist_helpers.py": """
        import torch.distributed as dist
        import torch.multiprocessing as mp

        def join(rank, world):
            dist.init_process_group("gloo", rank=rank, world_size=world)
    """,
    "proj/train.py": """
        import argparse
        from dist_helpers import *

        def worker(rank, world):
            join(rank, world)

        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=0)
            opts = parser.parse_args()
            mp.spawn(worker, args=(2,), nprocs=2)
    """,
}


def _lint_files(files: dict[str, str], rule: str) -> set[tuple[str, int]]:
    sources = {path: textwrap.dedent(code) for path, code in files.items()}
    return {(f.path, f.line) for f in lint_sources(sources) if f.rule == rule}


def test_spawn_through_a_star_import_is_seen():
    # DDP007 leaves mp.spawn scripts alone: their ranks never read --local_rank
    assert _lint_files(STAR_FILES, "DDP007") == set()


def test_star_import_brings_only_the_names_in_all():
    files = dict(STAR_FILES)
    files["proj/dist_helpers.py"] = '__all__ = ["join"]\n' + textwrap.dedent(files["proj/dist_helpers.py"])
    files["proj/train.py"] = files["proj/train.py"].replace("from dist_helpers import *",
                                                             "from dist_helpers import *\n        import mp")
    assert _lint_files(files, "DDP007") != set()  # this `mp` is some other module: no spawn seen


# ---- the spawn index used as the rank: one node ------------------------------------------------------------
SPAWN_INDEX_RANK = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def connect(local_rank, nprocs):
        dist.init_process_group("nccl", rank=local_rank, world_size=nprocs)

    def worker(local_rank, nprocs):
        connect(local_rank, nprocs)
        model = torch.nn.Linear(2, 2)
        if local_rank == 0:
            torch.save(model.state_dict(), "model.pt")

    if __name__ == "__main__":
        mp.spawn(worker, args=(2,), nprocs=2)
"""


def test_spawn_index_given_as_the_rank_makes_one_node():
    assert _lint(SPAWN_INDEX_RANK, "DDP004") == []


def test_rank_computed_from_the_spawn_index_may_span_nodes():
    code = SPAWN_INDEX_RANK.replace("    connect(local_rank, nprocs)", "    connect(node * nprocs + local_rank, nprocs)") \
        .replace("def worker(local_rank, nprocs):", "def worker(local_rank, nprocs, node=1):")
    assert _lint(code, "DDP004") == [_line(code, "torch.save")]


# ---- a program reached only through code that is not linted ----------------------------------------------
FACTORY_FILES = {
    "proj/train.py": """
        import torch.distributed as dist
        from models.select import build

        def main():
            dist.init_process_group("nccl")
            model = build("plain")
            if dist.get_rank() == 0:
                model.save("last.pt")
            dist.destroy_process_group()

        if __name__ == "__main__":
            main()
    """,
    "proj/models/plain.py": """
        import torch
        from torch.nn.parallel import DistributedDataParallel

        class Plain:
            def __init__(self, net, device):
                self.net = self.wrap(net, device)

            def wrap(self, net, device):
                print("wrapping the network")
                return DistributedDataParallel(net.to(device), device_ids=[device])

            def save(self, path):
                torch.save(self.net.state_dict(), path)
    """,
}


def test_caller_guard_unseen_through_an_unlinted_factory_is_not_guessed():
    # models/select.py (the factory that imports plain.py) is not linted: train.py's rank check around
    # model.save() cannot be connected to Plain.save, so its torch.save is not called unguarded
    assert _lint_files(FACTORY_FILES, "DDP004") == set()


def test_code_every_rank_must_run_is_still_reported_in_an_unlinted_factory_program():
    # a function that wraps the model in DDP runs on every rank, whoever calls it
    lines = _lint_files(FACTORY_FILES, "DDP008")
    assert ("proj/models/plain.py", _line(FACTORY_FILES["proj/models/plain.py"], "wrapping the network")) in lines


def test_a_library_file_linted_on_its_own_is_still_checked():
    files = {"proj/models/plain.py": FACTORY_FILES["proj/models/plain.py"]}
    assert _lint_files(files, "DDP004") == {
        ("proj/models/plain.py", _line(FACTORY_FILES["proj/models/plain.py"], "torch.save"))}


# ---- a branch that makes the run one process -------------------------------------------------------------
FALLBACK_BRANCH = """
    import os
    import torch.distributed as dist

    def main(cfg):
        world_size = int(os.environ.get("WORLD_SIZE", 1))
        if cfg.group == "":
            print("no group given: training on one process")
            world_size = 1
        if world_size > 1:
            dist.init_process_group("nccl")
        print("epoch done")

    if __name__ == "__main__":
        main(None)
"""


def test_branch_that_sets_one_process_is_that_process_alone():
    lines = _lint(FALLBACK_BRANCH, "DDP008")
    assert _line(FALLBACK_BRANCH, "no group given") not in lines
    assert _line(FALLBACK_BRANCH, "epoch done") in lines


def test_one_gpu_per_process_is_not_a_one_process_run():
    code = FALLBACK_BRANCH.replace("world_size = 1\n", "n_gpu = 1\n")
    assert _line(code, "no group given") in _lint(code, "DDP008")


def test_a_count_the_program_gives_as_world_size_sets_one_process_too():
    code = FALLBACK_BRANCH.replace("world_size = 1\n", "n_gpu = 1\n") \
        .replace('dist.init_process_group("nccl")', 'dist.init_process_group("nccl", world_size=n_gpu)')
    lines = _lint(code, "DDP008")
    assert _line(code, "no group given") not in lines and _line(code, "epoch done") in lines


# ---- the worker handed to the spawning function as a parameter ---------------------------------------------
LAUNCH_PARAMETER = """
    import atexit
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def report():
        print("run finished")

    def worker(rank, world):
        dist.init_process_group("gloo", rank=rank, world_size=world)
        print("rank training")
        dist.destroy_process_group()

    def launch(fn, world):
        mp.spawn(fn, args=(world,), nprocs=world)

    if __name__ == "__main__":
        atexit.register(report)
        launch(worker, 2)
"""


def test_worker_passed_through_the_launcher_parameter_is_the_only_worker():
    lines = _lint(LAUNCH_PARAMETER, "DDP008")
    assert _line(LAUNCH_PARAMETER, "rank training") in lines
    assert _line(LAUNCH_PARAMETER, "run finished") not in lines  # a parent callback, not a worker


# ---- a worker calling a method that shares its name with the parent's spawning function -------------
SPAWNER_NAMED_LIKE_A_METHOD = """
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from trainer import Trainer

    def fit(cfg):
        print("starting the workers")
        trainer = Trainer()
        mp.spawn(worker, nprocs=cfg.gpus, args=(trainer, cfg))

    def worker(rank, trainer, cfg):
        dist.init_process_group("nccl", rank=rank, world_size=cfg.gpus)
        for epoch in range(cfg.epochs):
            trainer.fit(cfg, epoch)
        print("rank is done")

    if __name__ == "__main__":
        fit(None)
"""


def test_worker_method_call_does_not_reach_the_parents_function_of_the_same_name():
    lines = _lint(SPAWNER_NAMED_LIKE_A_METHOD, "DDP008")
    assert _line(SPAWNER_NAMED_LIKE_A_METHOD, "starting the workers") not in lines
    assert _line(SPAWNER_NAMED_LIKE_A_METHOD, "rank is done") in lines


# ---- a helper of a helper that only the parent of mp.spawn calls ------------------------------------
PARENT_HELPERS = {
    "options.py": textwrap.dedent("""
        import argparse
        import torch

        def seed_everything(seed):
            print("seeding with", seed)
            torch.manual_seed(seed)

        def get_options():
            args = argparse.ArgumentParser().parse_args()
            seed_everything(args.seed)
            return args
    """),
    "main.py": textwrap.dedent("""
        import torch.distributed as dist
        import torch.multiprocessing as mp
        from options import get_options

        def worker(rank, args):
            dist.init_process_group("nccl", rank=rank, world_size=args.gpus)
            dist.destroy_process_group()

        if __name__ == "__main__":
            args = get_options()
            mp.spawn(worker, args=(args,), nprocs=args.gpus)
    """),
}


def test_a_helper_called_only_from_a_parent_only_helper_runs_in_the_parent():
    found = {(f.path, f.line, f.rule) for f in lint_sources(PARENT_HELPERS)}
    assert not {(p, r) for p, _, r in found if p == "options.py" and r in ("DDP008", "DDP014")}
    rank_side = dict(PARENT_HELPERS, **{"main.py": PARENT_HELPERS["main.py"].replace(
        "dist.destroy_process_group()", "get_options()\n    dist.destroy_process_group()")})
    assert ("options.py", 6, "DDP008") in {(f.path, f.line, f.rule) for f in lint_sources(rank_side)}


# ---- a checkpoint the parent of mp.spawn loads once its workers are done ------------------------------
PARENT_LOADS_AFTER_SPAWN = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def worker(rank, world):
        dist.init_process_group("nccl", rank=rank, world_size=world)
        state = torch.load("resume.pth")
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(2,), nprocs=2)
        final = torch.load("final.pth")
"""


def test_a_load_in_the_parent_of_spawn_is_not_ddp005():
    assert _lint(PARENT_LOADS_AFTER_SPAWN, "DDP005") == [_line(PARENT_LOADS_AFTER_SPAWN, "resume.pth")]


# ---- a classmethod of a helper class that only the parent of mp.spawn calls ---------------------------
PARENT_CLASSMETHODS = {
    "tools.py": textwrap.dedent("""
        class DataTools:
            @classmethod
            def _labels(cls, root):
                print("labelling", root)
                return {}

            @classmethod
            def prepare(cls, root):
                labels = cls._labels(root)
                print("prepared", len(labels))

            @classmethod
            def loader(cls, root):
                print("loading", root)
    """),
    "main.py": textwrap.dedent("""
        import torch.distributed as dist
        import torch.multiprocessing as mp
        from tools import DataTools

        def worker(rank, root):
            dist.init_process_group("nccl", rank=rank, world_size=2)
            DataTools.loader(root)
            dist.destroy_process_group()

        def train(root):
            DataTools.prepare(root)
            mp.spawn(worker, args=(root,), nprocs=2)

        if __name__ == "__main__":
            train("data")
    """),
}


def test_a_classmethod_only_the_parent_of_spawn_calls_runs_once():
    lines = _lint_files(PARENT_CLASSMETHODS, "DDP008")
    assert lines == {("tools.py", 15)}  # loader() runs in every worker; _labels and prepare in the parent
