"""`ddpkit test`: the machine self-test (the launcher side in command.py, the per-rank checks in checks.py)."""
