"""ddpkit.launch: ranks of a Python function, from a real Jupyter kernel and from a script."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

CELLS = [
    # a function and an exception class defined in cells: they reach the ranks by value
    """
    import os, signal, psutil, ddpkit

    class CellError(ValueError):
        pass

    def train(scale):
        import torch, ddpkit
        with ddpkit.init(device="cpu") as ctx:
            total = ddpkit.all_reduce_sum(ctx, torch.tensor([float(ctx.rank + 1)])).item()
            return {"rank": ctx.rank, "world_size": ctx.world_size, "total": total * scale, "pid": os.getpid()}

    def broken():
        import ddpkit
        with ddpkit.init(device="cpu") as ctx:
            if ctx.rank == 1:
                raise CellError(f"rank {ctx.rank} found a bad batch")
            ddpkit.barrier(ctx)
    """,
    """
    sigint = signal.getsignal(signal.SIGINT)
    results = ddpkit.launch(train, 10, nproc_per_node=2)
    assert [r["rank"] for r in results] == [0, 1], results
    assert all(r["world_size"] == 2 and r["total"] == 30.0 for r in results), results
    assert signal.getsignal(signal.SIGINT) is sigint  # Ctrl+C in the notebook is the kernel's again
    assert not any(psutil.pid_exists(r["pid"]) and psutil.Process(r["pid"]).status() != "zombie" for r in results)
    """,
    """
    try:
        ddpkit.launch(broken, nproc_per_node=2)
    except CellError as e:
        caught = e
    assert "rank 1 found a bad batch" in str(caught)
    remote = str(caught.__cause__)
    assert "rank 1 raised:" in remote and "in broken" in remote and "CellError: rank 1 found a bad batch" in remote, remote
    assert not [c for c in psutil.Process().children(recursive=True) if c.status() != "zombie"
                and "resource_tracker" not in " ".join(c.cmdline())]
    print("notebook ok")
    """,
]


def test_launch_from_a_jupyter_kernel_on_functions_defined_in_cells(tmp_path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(cell)) for cell in CELLS]
    # ipykernel's own kernel spec ("python3", installed into this environment with it) runs this
    # interpreter: jupyter_client puts sys.executable in place of the spec's plain "python"
    client = NotebookClient(nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream"]
    assert "notebook ok" in "".join(outputs)


SCRIPT = """
import os, sys, time
from pathlib import Path
import ddpkit

def wait_forever(out):
    tmp = Path(out, f"rank-{os.environ['RANK']}.tmp")
    tmp.write_text(str(os.getpid()))
    tmp.rename(Path(out, f"rank-{os.environ['RANK']}.pid"))  # whole, when the test sees it
    time.sleep(600)

if __name__ == "__main__":
    try:
        ddpkit.launch(wait_forever, sys.argv[1], nproc_per_node=2)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
"""


def test_ctrl_c_stops_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 300
        while len(list(tmp_path.glob("rank-*.pid"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.5)
        pids = [int(p.read_text()) for p in tmp_path.glob("rank-*.pid")]
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and "interrupted" in stdout, stderr[-2000:]
    time.sleep(0.5)
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"rank processes left running: {alive}"


NUMBERS = """
import ddpkit
from ddpkit.collectives import all_reduce_number


def sums():
    with ddpkit.init(device="cpu") as ctx:
        # rank 0 saw no batch of an uneven shard: its `total = 0` is still the int it started from
        loss_sum = 0 if ctx.rank == 0 else 2.5
        correct = 3 * (ctx.rank + 1)
        return all_reduce_number(ctx, loss_sum), all_reduce_number(ctx, correct)


if __name__ == "__main__":
    results = ddpkit.launch(sums, nproc_per_node=2)
    assert results == [(2.5, 9), (2.5, 9)], results
    assert all(isinstance(r[0], float) and isinstance(r[1], int) for r in results), results
    print("numbers ok")
"""


def test_a_number_summed_over_ranks_is_a_float_where_any_rank_holds_one(tmp_path: Path) -> None:
    # the sums `ddpkit port` writes after a loop: an int on a rank with no batch must not cut the run's float total
    script = tmp_path / "sums_job.py"
    script.write_text(NUMBERS)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    assert done.returncode == 0 and "numbers ok" in done.stdout, done.stderr[-3000:]
