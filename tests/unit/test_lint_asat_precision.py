"""Findings the program itself answers, seen on the AS+AT sets (judged wrong by adjudicators): a switch every
construction of a class turns off, where another class keeps an attribute of the same name; a missing set_device
where nothing uses the current device (a `device="cuda"` default every call overrides, placements by the global
rank, which are their own finding)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _found(files: dict[str, str]) -> set[tuple[str, str, str]]:
    """(path, stripped line, rule) of every finding."""
    sources = {path: textwrap.dedent(code) for path, code in files.items()}
    return {(f.path, sources[f.path].splitlines()[f.line - 1].strip(), f.rule) for f in lint_sources(sources)}


_PREPROCESS = """
    import logging

    logger = logging.getLogger(__name__)
    logging.basicConfig(level=logging.INFO)


    class GenePrep:
        def __init__(self, filter_genes=False, binning=None):
            self.filter_genes = filter_genes
            self.binning = binning

        def __call__(self, data):
            if self.filter_genes:
                logger.info("filtering genes")
            if self.binning:
                logger.info("binning")
            return data


    class PeakPrep:
        def __init__(self, filter_genes=False, binning=None):
            self.filter_genes = filter_genes
            self.binning = binning

        def __call__(self, data):
            if self.filter_genes:
                logger.info("filtering peaks")
            return data
"""

_PREP_ENTRY = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from preprocess import GenePrep, PeakPrep


    def main():
        dist.init_process_group("gloo")
        genes = GenePrep(filter_genes=False, binning=0)(torch.randn(8, 4))
        peaks = PeakPrep(filter_genes=False)(torch.randn(8, 4))
        model = DDP(torch.nn.Linear(4, 1))
        model(genes + peaks).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_switch_every_construction_turns_off_is_off_though_another_class_has_an_attribute_of_its_name():
    found = _found({"train.py": _PREP_ENTRY, "preprocess.py": _PREPROCESS})
    assert not {f for f in found if f[0] == "preprocess.py"}, found


def test_a_subclass_that_sets_the_attribute_itself_keeps_the_branch():
    preprocess = _PREPROCESS + """

    class LoudPrep(PeakPrep):
        def __init__(self):
            super().__init__()
            self.filter_genes = True
"""
    entry = _PREP_ENTRY.replace("model = DDP(", "LoudPrep()(peaks)\n        model = DDP(")
    found = _found({"train.py": entry, "preprocess.py": preprocess})
    assert ("preprocess.py", 'logger.info("filtering peaks")', "DDP008") in found, found
    assert ("preprocess.py", 'logger.info("filtering genes")', "DDP008") not in found, found


_EXPLICIT = """
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def evaluate(model, x, device="cuda"):
        return model(x.to(device)).sum().item()


    def main():
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        model = DDP(torch.nn.Linear(4, 1).to(local_rank), device_ids=[local_rank])
        model(torch.randn(8, 4).to(local_rank)).sum().backward()
        if dist.get_rank() == 0:
            print(evaluate(model, torch.randn(8, 4), device=local_rank))
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _no_set_device(found: set[tuple[str, str, str]]) -> bool:
    return any(rule == "DDP012" and line.startswith("dist.init_process_group") for _, line, rule in found)


def test_a_cuda_default_every_call_overrides_places_nothing():
    assert not _no_set_device(_found({"train.py": _EXPLICIT}))


def test_a_cuda_default_some_call_leaves_places_on_the_current_device():
    program = _EXPLICIT.replace("evaluate(model, torch.randn(8, 4), device=local_rank)",
                                "evaluate(model, torch.randn(8, 4))")
    assert _no_set_device(_found({"train.py": program}))


def test_placements_by_the_global_rank_get_that_finding_not_a_set_device_one():
    program = _EXPLICIT.replace('local_rank = int(os.environ["LOCAL_RANK"])', "local_rank = dist.get_rank()")
    found = _found({"train.py": program})
    assert not _no_set_device(found), found
    assert ("train.py", "local_rank = dist.get_rank()", "DDP012") in found, found


_DISABLED = """
    import logging

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    DISABLE
    logging.basicConfig(level=logging.INFO)
    logger = logging.getLogger(__name__)


    def main():
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(4, 1))
        for step in range(3):
            loss = model(torch.randn(8, 4)).sum()
            loss.backward()
            logger.info("step %d", step)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _info_reported(disable: str) -> bool:
    found = _found({"train.py": _DISABLED.replace("DISABLE", disable)})
    return ("train.py", 'logger.info("step %d", step)', "DDP008") in found


def test_logging_disabled_at_the_top_writes_no_info_line_anywhere():
    assert _info_reported("")
    assert not _info_reported("logging.disable(logging.WARNING)")
    assert not _info_reported("logging.disable()")  # CRITICAL and below


def test_logging_disabled_below_info_or_turned_back_on_still_writes_it():
    assert _info_reported("logging.disable(logging.DEBUG)")
    assert _info_reported("logging.disable(logging.WARNING)\n    logging.disable(logging.NOTSET)")
