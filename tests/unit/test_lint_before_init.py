"""A rank helper that answers True without a process group, asked before the group exists (DDP008)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_EARLY = """
    import logging

    import torch.distributed as dist


    def is_main_process():
        return not dist.is_initialized() or dist.get_rank() == 0


    def main():
        if is_main_process():
            logging.basicConfig(level=logging.INFO)
            logging.info("starting")
        dist.init_process_group("gloo")
        if is_main_process():
            logging.info("group ready")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": textwrap.dedent(source)}) if f.rule == "DDP008"]


def test_a_main_process_helper_asked_before_init_process_group_is_true_on_every_rank():
    """Above init_process_group `not dist.is_initialized()` holds in every process: each sets up logging and logs."""
    assert _lines(_EARLY) == [14]


def test_the_same_helper_asked_after_init_process_group_is_a_rank_check():
    late = _EARLY.replace('        dist.init_process_group("gloo")\n', "").replace(
        "    def main():\n", '    def main():\n        dist.init_process_group("gloo")\n')
    assert _lines(late) == []
