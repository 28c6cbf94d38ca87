"""`ddpkit port`: the same script ports to the same text whatever the interpreter's hash seed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ddpkit

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"
_PORT = ("import sys\nfrom ddpkit.port import port_source\n"
         "r = port_source(open(sys.argv[1]).read(), 'resumed_settings.py')\n"
         "print(r.code)\nprint([(t.line, t.message) for t in r.todos])\n")


def _port_with_hash_seed(seed: int) -> str:
    # a set of names iterates in another order under each PYTHONHASHSEED: only a fresh interpreter shows it
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": str(Path(ddpkit.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", _PORT, str(FIXTURES / "resumed_settings.py")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_port_does_not_depend_on_the_hash_seed():
    # several names read back from a checkpoint through a chain of helpers: the decision on them once depended on
    # which name a set yielded first (seeds 0, 1, 2 and 4 left a TODO at the sys.exit, seed 3 did not)
    ports = {seed: _port_with_hash_seed(seed) for seed in range(5)}
    assert len(set(ports.values())) == 1, {seed: text.splitlines()[-1][:200] for seed, text in ports.items()}
