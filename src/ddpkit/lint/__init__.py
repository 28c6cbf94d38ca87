"""Static checks of a user's DDP training script (`ddpkit lint`): the classic mistakes, with fixes."""

from __future__ import annotations

from ddpkit.lint.command import collect_paths, lint_file, lint_files, lint_source, lint_sources, main
from ddpkit.lint.report import RULES, Finding, Rule

__all__ = ["RULES", "Finding", "Rule", "collect_paths", "lint_file", "lint_files", "lint_source", "lint_sources",
           "main"]
