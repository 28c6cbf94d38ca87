"""Output and figures that are not one rank's copy: streams silenced per rank, messages naming a value that differs
per rank, metrics that sync themselves, branches no call takes, messages just before the process dies."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _lint(files: dict[str, str]) -> set[tuple[str, int, str]]:
    found = lint_sources({name: textwrap.dedent(code) for name, code in files.items()})
    return {(f.path, f.line, f.rule) for f in found}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line)


_SILENCED_BOTH = """
    import os
    import sys

    import torch
    import torch.distributed as dist
    from tqdm import tqdm


    def main():
        local_rank = int(os.environ["LOCAL_RANK"])
        print("before the redirect")
        if local_rank != 0:
            sink = open(os.devnull, "w")
            sys.stdout = sys.stderr = sink
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        print("after the redirect")
        for _ in tqdm(range(3)):
            pass
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_stdout_and_stderr_sent_to_a_null_file_held_in_a_name_silence_print_and_tqdm():
    found = _lint({"train.py": _SILENCED_BOTH})
    assert ("train.py", _line(_SILENCED_BOTH, 'print("after the redirect")'), "DDP008") not in found
    assert ("train.py", _line(_SILENCED_BOTH, "tqdm(range(3))"), "DDP008") not in found
    assert ("train.py", _line(_SILENCED_BOTH, 'print("before the redirect")'), "DDP008") in found


def test_a_name_holding_a_real_file_silences_nothing():
    code = _SILENCED_BOTH.replace("open(os.devnull, \"w\")", "open(\"train.log\", \"w\")")
    assert code != _SILENCED_BOTH
    found = _lint({"train.py": code})
    assert ("train.py", _line(code, 'print("after the redirect")'), "DDP008") in found
    assert ("train.py", _line(code, "tqdm(range(3))"), "DDP008") in found

