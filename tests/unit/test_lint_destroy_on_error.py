"""DDP009: a destroy_process_group that runs only when something failed (in an `except` block, or in a helper
called only from one) leaves the group alive when training ends normally."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = textwrap.dedent("""
    import torch.distributed as dist


    def cleanup():
        dist.destroy_process_group()


    def main():
        dist.init_process_group("nccl")
        try:
            for step in range(10):
                pass
        except KeyboardInterrupt:
            HANDLER
        AFTER


    if __name__ == "__main__":
        main()
""")


def _destroy_lines(handler: str, after: str = "pass") -> list[int]:
    source = _TRAIN.replace("HANDLER", handler).replace("AFTER", after)
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP009"]


def test_a_destroy_only_in_an_except_block_frees_nothing_at_the_normal_end():
    assert _destroy_lines("dist.destroy_process_group()") == [10]
    assert _destroy_lines("cleanup()") == [10]


def test_a_destroy_also_on_the_normal_path_counts():
    assert _destroy_lines("dist.destroy_process_group()", "dist.destroy_process_group()") == []
    assert _destroy_lines("cleanup()", "cleanup()") == []
