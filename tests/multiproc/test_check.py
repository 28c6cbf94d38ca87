"""`ddpkit check` end to end: each fault fixture is reported at its line; correct scripts pass (2 gloo ranks)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parents[1] / "fixtures" / "check"


def _check(script: str, *args: str, script_args: tuple[str, ...] = (), timeout: float = 150
           ) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "ddpkit.cli", "check", *args, str(FIXTURES / script), *script_args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=FIXTURES)


def _line(script: str, text: str) -> int:
    lines = (FIXTURES / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


@pytest.mark.timeout(170)
@pytest.mark.parametrize("script, kind, line_text, words", [
    ("bad_rank_local_grad.py", "grads", "opt.step()", "rank-local gradient"),
    ("bad_no_sync.py", "grads", "opt.step()", "inside no_sync()"),
    ("bad_no_sampler.py", "data-overlap", "for x, y in loader", "trained on"),
    ("bad_no_set_epoch.py", "data-order", "for x, y in loader", "same order"),
    ("bad_save_every_rank.py", "save", "torch.save(", "written by 2 ranks"),
    ("bad_eval_padding.py", "eval-padding", "for x, y in test_loader", "padded 1 duplicates"),
    ("bad_augmented_no_sampler.py", "data-overlap", "for x, y in loader", "trained on"),
    ("bad_uneven_shards.py", "data-uneven", "for x, y in loader", "(rank 0: 17, rank 1: 15)"),
])
def test_each_fault_is_reported_at_its_line(script, kind, line_text, words):
    out = _check(script)
    assert out.returncode == 1, out.stdout + out.stderr
    site = f"{script}:{_line(script, line_text)}: [{kind}]"
    [finding] = [line for line in out.stdout.splitlines() if site in line]
    assert words in finding
    assert "fix: " in out.stdout


@pytest.mark.timeout(170)
def test_a_rank_only_collective_is_named_with_both_ranks():
    script = "bad_collective_branch.py"
    out = _check(script, "--hang-timeout", "5")
    assert out.returncode == 1, out.stdout + out.stderr
    line = _line(script, "dist.all_reduce(metric)")
    assert f"{script}:{line}: [collectives]" in out.stdout
    assert f"rank 0 all_reduce float32[] at {script}:{line}; rank 1 never issued it" in out.stdout


@pytest.mark.timeout(170)
@pytest.mark.parametrize("script", ["good_torch_cuda.py", "good_ddpkit.py", "good_own_shards.py",
                                    "good_subset_shards.py", "good_fsdp.py"])
def test_correct_scripts_pass(script, tmp_path):
    out = _check(script)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no problems found" in out.stdout
    if script == "good_torch_cuda.py":  # written for CUDA/NCCL: mapped, and each mapping named
        assert f"'nccl' -> 'gloo' at {script}:{_line(script, 'init_process_group')}" in out.stdout
        assert f"device_ids= dropped (CPU) at {script}:{_line(script, 'device_ids=')}" in out.stdout
        # fp16 autocast and GradScaler switch off without CUDA: said, not silently passed
        assert (f"torch.autocast('cuda', float16) -> off (ran in float32: mixed precision not checked) at "
                f"{script}:{_line(script, 'torch.autocast(')}") in out.stdout
        assert f"GradScaler('cuda') -> disabled (loss not scaled: loss scaling not checked) at {script}:" in out.stdout
        # 3 epochs of 6 steps, each cut after --epoch-steps 5: what happened, not the --max-steps default
        assert (f"{script} on 2 CPU ranks (gloo), the script ended after 15 optimizer steps; each epoch cut "
                "after 5 steps (--epoch-steps 5)") in out.stdout


@pytest.mark.timeout(170)
def test_the_header_says_where_max_steps_stopped_the_ranks():
    out = _check("good_subset_shards.py", "--max-steps", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "(gloo), stopped after 3 optimizer steps (--max-steps 3)\n" in out.stdout


def _findings(out: subprocess.CompletedProcess) -> list[str]:
    return [line.strip() for line in out.stdout.splitlines() if re.match(r"  \S+:\d+: \[", line)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script, line_text, words", [
    ("bad_shard_accuracy.py", 'print(f"epoch {epoch} test accuracy', "about 1/2"),
    ("bad_loss_per_rank_count.py", 'print(f"epoch {epoch} test loss', "about 2x"),
])
def test_a_figure_that_depends_on_the_number_of_ranks_is_reported_at_its_line(script, line_text, words):
    out = _check(script, timeout=280)
    assert out.returncode == 1, out.stdout + out.stderr
    [finding] = _findings(out)
    assert finding.startswith(f"{script}:{_line(script, line_text)}: [reported]") and words in finding


@pytest.mark.timeout(300)
def test_figures_logged_shown_in_tqdm_and_written_as_json_lines_are_reported(tmp_path):
    script = "bad_reported_channels.py"
    out = _check(script, script_args=(str(tmp_path),), timeout=280)
    assert out.returncode == 1, out.stdout + out.stderr
    sites = [f.split(": [")[0] for f in _findings(out)]
    assert sites == [f"{script}:{_line(script, text)}" for text in ("bar.set_postfix(", "log.info(", "json.dumps(")]
    assert all(f"the figure {via} here depends on the number of ranks" in out.stdout
               for via in ("shown in tqdm", "logged", "written as JSON"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", ["good_reduced_accuracy.py", "good_rank0_eval.py"])
def test_figures_global_by_construction_pass_and_the_note_says_what_was_not_compared(script):
    out = _check(script, timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no problems found" in out.stdout
    # 3 epochs x (5 steps: loss and step/len(loader), then the accuracy and its time) were compared or set aside
    assert "note: figures rank 0 reports: " in out.stdout and "compared with a world-size-1 run (" in out.stdout
    assert "3 timings" in out.stdout and "15 loop and shard sizes" in out.stdout


@pytest.mark.timeout(300)
def test_a_file_written_and_a_download_run_by_every_rank_are_reported(tmp_path):
    import http.server
    import threading

    (tmp_path / "data.txt").write_text("data\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: Quiet(*a, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = "bad_write_every_rank.py"
    url = f"http://127.0.0.1:{server.server_address[1]}/data.txt"
    try:
        out = _check(script, script_args=(str(tmp_path), url), timeout=280)
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode == 1, out.stdout + out.stderr
    write, download = sorted(_findings(out), key=lambda f: "[download]" in f)
    assert write.startswith(f"{script}:{_line(script, 'losses.csv')}: [write] {tmp_path / 'losses.csv'} is written "
                            "by 2 ranks (0, 1)")
    assert download.startswith(f"{script}:{_line(script, 'urlretrieve(')}: [download] {url} is downloaded by 2 ranks")
    assert "rank 0 only, then barrier" in out.stdout


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(170)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupting_check_stops_torchrun_and_every_rank(sig, tmp_path):
    pytest.importorskip("psutil")
    cmd = [sys.executable, "-m", "ddpkit.cli", "check", "--timeout", "150", str(FIXTURES / "sleep_forever.py"),
           str(tmp_path)]
    # Its own process group, so that SIGINT can go to the whole group, as Ctrl+C in a terminal sends it.
    check = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=FIXTURES,
                             env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    pids: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("rank-*.pid"))) < 2 and check.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        for path in tmp_path.glob("rank-*.pid"):
            pids.update(map(int, path.read_text().split()))  # the rank's pid and torchrun's
        assert len(pids) == 3, f"ranks did not start: {check.poll()=}, pid files {sorted(pids)}"
        if sig == signal.SIGINT:
            os.killpg(check.pid, sig)
        else:
            check.send_signal(sig)
        out, err = check.communicate(timeout=60)
        deadline = time.monotonic() + 10
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = sorted(pid for pid in pids if _alive(pid))
    finally:
        if check.poll() is None:
            check.kill()
            check.wait()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert check.returncode == 128 + sig, out + err
    assert err.strip() == f"ddpkit check: stopped by {sig.name}; all ranks were terminated", out + err
    assert left == [], f"still running after ddpkit check exited: {left}"
