"""`ddpkit.init(profile=True)` on 2 gloo ranks: injected slowness is found on the right rank and phase, and measured.

Each job injects a known delay on rank 1 (a sleep in its dataset, or busy work in its forward) and
checks the report's figures against it. Tolerances: a phase that holds an injected delay of D ms
measures between 0.8 D and 1.5 D + 20 ms (sleeps and busy loops only overrun, and this machine's
cores are shared); a rank that waits for it shows at least 0.5 D of exposed communication.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from harness import RankInfo, run_ranks

from ddpkit.profile import PHASES, WARMUP_STEPS

STEPS = WARMUP_STEPS + 16
DELAY_MS = 40.0


class _Data(torch.utils.data.Dataset):
    """Random regression samples; `sleep_ms` per batch (fetched whole through __getitems__)."""

    def __init__(self, num_samples: int, width: int, sleep_ms: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(num_samples, width, generator=g)
        self.y = torch.randn(num_samples, width, generator=g)
        self.sleep_s = sleep_ms / 1e3

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]

    def __getitems__(self, indices: list[int]):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return [(self.x[i], self.y[i]) for i in indices]


class _Net(torch.nn.Module):
    """`depth` linear layers after an embedding table of `vocab` rows: its gradient is dense, so every row is
    all-reduced every step while a batch computes on a few of them (a large model, a small batch)."""

    def __init__(self, width: int, depth: int, spin_ms: float, vocab: int = 16) -> None:
        super().__init__()
        torch.manual_seed(123)
        self.embed = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
        self.spin_s = spin_ms / 1e3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.spin_s:  # busy work, not a sleep: the forward of a slower device
            end = time.perf_counter() + self.spin_s
            while time.perf_counter() < end:
                pass
        rows = (x[:, 0].abs() * 1000).long() % self.embed.num_embeddings
        return self.layers(x + self.embed(rows))


def _job(info: RankInfo, profile: bool, slow_data_ms: float, slow_forward_ms: float, width: int, depth: int,
         batch_size: int, vocab: int = 16, slow_ranks: tuple[int, ...] = (1,)) -> dict:
    import ddpkit

    path = str(Path(info.tmp) / "profile.json")
    slow = info.rank in slow_ranks
    with info.init(seed=0, profile=profile, profile_json=path if profile else None) as ctx:
        model = ddpkit.wrap(_Net(width, depth, slow_forward_ms if slow else 0.0, vocab), ctx)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        prec = ddpkit.Precision(ctx, dtype="fp32")
        data = ddpkit.loader(_Data(batch_size * info.world_size * STEPS, width, slow_data_ms if slow else 0.0), ctx,
                             batch_size=batch_size, seed=1)
        steps = 0
        for x, y in data:  # one whole epoch: every step is closed by the next request
            with prec.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
            prec.backward(loss)
            prec.step(opt, model)
            steps += 1
        digest = ddpkit.param_sha256(model)
    report = json.loads(Path(path).read_text()) if profile and info.rank == 0 else None
    return {"steps": steps, "digest": digest, "report": report}


def _report(*args) -> dict:
    results = run_ranks(_job, 2, True, *args, timeout=150)
    assert results[0]["steps"] == STEPS
    report = results[0]["report"]
    assert report["world_size"] == 2 and report["steps"] == STEPS - WARMUP_STEPS
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for row in report["ranks"]:
        assert set(row) == {"rank", "step_ms", *(f"{p}_ms" for p in PHASES)}
        assert all(row[f"{p}_ms"] >= 0 for p in PHASES) and row["step_ms"] > 0, row
    return report


def _near(measured: float, injected: float) -> bool:
    return 0.8 * injected <= measured <= 1.5 * injected + 20.0


@pytest.mark.timeout(200)
def test_a_rank_that_loads_slowly_is_the_straggler_in_data():
    report = _report(DELAY_MS, 0.0, 32, 2, 8)
    r0, r1 = report["ranks"]
    assert report["straggler"] == {"rank": 1, "phase": "data"}, report
    assert _near(r1["data_ms"], DELAY_MS), r1
    assert r0["data_ms"] < 0.25 * DELAY_MS, r0
    assert 0.5 * DELAY_MS <= r0["comm_ms"] <= 1.5 * DELAY_MS + 20.0, r0  # rank 0 waits for rank 1's gradients
    assert _near(r1["step_ms"], DELAY_MS) and _near(r0["step_ms"], DELAY_MS)
    assert any("rank 1" in s and "data" in s for s in report["suggestions"]), report["suggestions"]


@pytest.mark.timeout(200)
def test_a_rank_that_computes_slowly_is_the_straggler_in_compute():
    report = _report(0.0, DELAY_MS, 32, 2, 8)
    r0, r1 = report["ranks"]
    assert report["straggler"] == {"rank": 1, "phase": "compute"}, report
    assert _near(r1["compute_ms"] - r0["compute_ms"], DELAY_MS), (r0, r1)
    assert 0.5 * DELAY_MS <= r0["comm_ms"] <= 1.5 * DELAY_MS + 20.0, r0
    assert r1["data_ms"] < 0.25 * DELAY_MS, r1


@pytest.mark.timeout(200)
def test_a_balanced_job_has_no_straggler_and_profiling_leaves_the_parameters_unchanged():
    # The control of the data straggler's job: the same delay on every rank. (Not a compute-bound job: on
    # this machine's shared cores, one rank of such a job often gets half the CPU of the other for a
    # whole run, which is a real straggler: a noisy neighbour.)
    results = run_ranks(_job, 2, True, DELAY_MS, 0.0, 32, 2, 8, 16, (0, 1), timeout=150)
    plain = run_ranks(_job, 2, False, DELAY_MS, 0.0, 32, 2, 8, 16, (0, 1), timeout=150)
    report = results[0]["report"]
    assert report["straggler"] is None, report
    assert all(_near(r["data_ms"], DELAY_MS) for r in report["ranks"]), report
    assert results[0]["digest"] == results[1]["digest"] == plain[0]["digest"] == plain[1]["digest"]
    assert plain[0]["report"] is None


@pytest.mark.timeout(200)
def test_the_communication_share_grows_with_the_model():
    # The same job twice (0.8 M parameters, a forward and backward of about 0.6 GFLOP per rank), the second
    # with a 16,384-row embedding table more: + 8.4 M parameters, 33.6 MB more gradients to all-reduce per
    # step, for a few rows' compute (and a dense gradient to zero and copy).
    small = _report(0.0, 0.0, 512, 3, 128, 16)
    large = _report(0.0, 0.0, 512, 3, 128, 16384)

    def comm(report: dict) -> tuple[float, float]:
        row = min(report["ranks"], key=lambda r: r["comm_ms"])  # the rank that waited least for the other
        return row["comm_ms"], row["comm_ms"] / row["step_ms"]

    (small_ms, small_share), (large_ms, large_share) = comm(small), comm(large)
    # 40 times the bytes. Measured on 2-core CPU machines: 11 times the ms and the share +0.24 when the suite
    # ran alone; 5 times the ms and the share +0.099 under CI's load, where the larger job's dense-gradient
    # compute grew too (18 -> 45 ms). The ms ratio is the claim; the share is only asserted to grow.
    assert large_ms > 4 * small_ms, (small, large)
    assert large_share > small_share, (small, large)


@pytest.mark.timeout(200)
def test_ddpkit_run_profile_reports_the_straggler_of_a_script_that_never_mentions_profiling(tmp_path: Path):
    out = tmp_path / "profile.json"
    script = Path(__file__).parent / "scripts" / "profile_job.py"
    proc = subprocess.run([sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", "2", "--profile-json", str(out),
                           str(script)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == 2 and report["steps"] == 20 - WARMUP_STEPS
    assert report["straggler"] == {"rank": 1, "phase": "data"}, report
    assert _near(report["ranks"][1]["data_ms"], 30.0), report
    assert "straggler: rank 1 (data)" in proc.stdout and proc.stdout.count("ddpkit profile:") == 1
