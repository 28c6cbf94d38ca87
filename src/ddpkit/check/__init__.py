"""`ddpkit check`: run a script on CPU ranks under probes and verify the DDP invariants; hang forensics."""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of `ddpkit check` (imports the checker only when it runs)."""
    from ddpkit.check.command import main as check_main

    return check_main(argv)
