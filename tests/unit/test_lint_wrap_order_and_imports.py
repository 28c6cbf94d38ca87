"""A forward before the DDP wrap, BatchNorm in a type test or converted by apex, and mp.spawn imported bare."""

from pathlib import Path

from ddpkit.lint import lint_file, lint_sources

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lint"


def _rules(path: Path) -> set[str]:
    return {f.rule for f in lint_file(path)}


def test_a_rank_checked_forward_before_the_wrap_runs_the_plain_module():
    path = FIXTURES / "good_ddp010_reference_forward_before_the_wrap.py"
    assert "DDP010" not in _rules(path)
    # the same forward after the wrap is one rank's DDP step
    code = path.read_text()
    moved = code.replace("    model = DDP(model)\n", "").replace(
        "    model = torch.nn.Linear(4, 1)\n", "    model = DDP(torch.nn.Linear(4, 1))\n")
    assert "DDP010" in {f.rule for f in lint_sources({"train.py": moved})}
    # inside a loop the wrap further down may already have run when the forward comes round again
    looped = code.replace("    if rank == 0 and", "    for _ in range(2):\n      if rank == 0 and")
    assert "DDP010" in {f.rule for f in lint_sources({"train.py": looped})}


def test_batchnorm_in_a_type_test_or_converted_by_apex_is_no_finding():
    path = FIXTURES / "good_ddp013_type_test_and_apex_sync.py"
    assert "DDP013" not in _rules(path)
    # without the converter the model build() makes with a BatchNorm2d is reported where it is wrapped (the
    # BatchNorm2d in isinstance() builds no layer)
    code = path.read_text().replace("        encoder = apex.parallel.convert_syncbn_model(encoder)\n", "        pass\n")
    lines = [f.line for f in lint_sources({"train.py": code}) if f.rule == "DDP013"]
    assert lines == [next(i for i, t in enumerate(code.splitlines(), 1) if "= DDP(model" in t)]
    # with the isinstance() test alone (no layer built) there is nothing to report
    bare = code.replace("nn.BatchNorm2d(8), ", "")
    assert [f for f in lint_sources({"train.py": bare}) if f.rule == "DDP013"] == []


_UTILS = '''
import torch
import torch.distributed as dist


def setup(rank, world_size):
    dist.init_process_group("gloo", world_size=world_size, rank=rank)
'''
_TRAIN = '''
import torch
from torch.multiprocessing.spawn import spawn
from torch.nn.parallel import DistributedDataParallel as DDP

from utils import setup


def worker(rank, world_size):
    setup(rank=rank, world_size=world_size)
    torch.manual_seed(rank)
    model = DDP(torch.nn.Linear(4, 1))
    model(torch.randn(8, 4)).sum().backward()


def main():
    print("starting the workers")  # the parent, once
    spawn(worker, args=(2,), nprocs=2)


if __name__ == "__main__":
    main()
'''


def test_spawn_imported_bare_from_its_module_is_mp_spawn():
    found = {(f.path, f.line, f.rule) for f in lint_sources({"p/train.py": _TRAIN, "p/utils.py": _UTILS})}
    line = next(i for i, t in enumerate(_TRAIN.splitlines(), 1) if "starting the workers" in t)
    assert ("p/train.py", line, "DDP008") not in found


def test_a_print_after_a_try_whose_finally_exits_is_never_reached():
    path = FIXTURES / "good_ddp008_after_an_exiting_finally.py"
    assert "DDP008" not in _rules(path)
    # without the exit in the finally the print runs on every rank
    code = path.read_text().replace("        sys.exit(code)\n", "        pass\n")
    assert "DDP008" in {f.rule for f in lint_sources({"train.py": code})}


def test_a_line_headed_by_the_device_its_tensor_was_moved_to_is_the_processs_own():
    path = FIXTURES / "good_ddp008_prints_the_tensors_device.py"
    assert "DDP008" not in _rules(path)
    # a device name that is a setting (the same string on every rank) is no such header
    code = path.read_text().replace('    x = batch.to(f"cuda:{local_rank}")\n',
                                    '    x = batch.to(f"cuda:{local_rank}")\n    x = batch\n')
    assert "DDP008" in {f.rule for f in lint_sources({"train.py": code})}
