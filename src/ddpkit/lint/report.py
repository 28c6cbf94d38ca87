"""Lint findings and the rule table, and how they are printed: text lines, JSON or SARIF 2.1.0."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["SEVERITIES", "Rule", "RULES", "Finding", "format_text", "format_json", "format_sarif"]

SEVERITIES = ("error", "warning", "note")
"""Only errors fail `ddpkit lint` (exit 1); warnings and notes are advice."""


@dataclass(frozen=True)
class Rule:
    """One check: its id, default severity and a one-line summary for the rule table."""

    id: str
    severity: str
    summary: str


RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("DDP000", "error", "the file does not parse as Python"),
    Rule("DDP001", "error", "DistributedSampler shuffles but set_epoch() is never called"),
    Rule("DDP002", "error", "DataLoader gets shuffle=True together with sampler=/batch_sampler="),
    Rule("DDP003", "error", "a DistributedDataParallel-only argument is passed to something else"),
    Rule("DDP004", "error", "torch.save without a global-rank check (warning: local-rank check only)"),
    Rule("DDP005", "warning", "torch.load without map_location, or with weights_only=False"),
    Rule("DDP006", "warning", "a metric of one rank's shard (or a padded eval set) is reported as the run's"),
    Rule("DDP007", "error", "deprecated torch.distributed.launch (warning: --local_rank argument)"),
    Rule("DDP008", "warning", "print()/tqdm() runs on every rank"),
    Rule("DDP009", "warning", "init_process_group without destroy_process_group"),
    Rule("DDP010", "error", "only some ranks reach a collective: under a rank check, a one-rank exit, DDP forward"),
    Rule("DDP011", "error", "torch.cuda.device(...) used as a device"),
    Rule("DDP012", "error", "every rank on cuda:0 or the wrong GPU (no set_device, global rank as GPU index)"),
    Rule("DDP013", "note", "BatchNorm in a DDP model without SyncBatchNorm"),
    Rule("DDP014", "warning", "the same seed on every rank, or (note) seeded in the spawn parent only or CUDA only"),
    Rule("DDP015", "error", "a training step runs a model around its DDP wrapper, or trains a module never wrapped"),
)}


@dataclass(frozen=True)
class Finding:
    """One problem at one place, with the change that fixes it."""

    path: str
    line: int
    col: int
    """1-based column, as editors count."""
    rule: str
    severity: str
    message: str
    fix: str

    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.path, self.line, self.col, self.rule)


def format_text(findings: list[Finding], num_files: int) -> str:
    """`path:line:col: RULE severity: message. fix: ...` per finding, then a summary line."""
    lines = [f"{f.path}:{f.line}:{f.col}: {f.rule} {f.severity}: {f.message}. fix: {f.fix}"
             for f in findings]
    counts = Counter(f.severity for f in findings)
    files = f"{num_files} file" + ("" if num_files == 1 else "s")
    if findings:
        parts = [f"{counts[s]} {s}" + ("" if counts[s] == 1 else "s") for s in SEVERITIES if counts[s]]
        lines.append(f"{', '.join(parts)} in {files} checked")
    else:
        lines.append(f"no findings in {files} checked")
    return "\n".join(lines)


def format_json(findings: list[Finding]) -> str:
    """A JSON list of {path, line, col, rule, severity, message, fix} objects."""
    return json.dumps([asdict(f) for f in findings], indent=2)


_SARIF_LEVEL = {"error": "error", "warning": "warning", "note": "note"}


def format_sarif(findings: list[Finding]) -> str:
    """A SARIF 2.1.0 log with one run: the rule table as the tool's rules, one result per finding.

    Each result carries the rule id, level, message, the physical location (file, 1-based line and
    column) and the fix as `fixes[0].description` (SARIF's place for a fix given in words).
    """
    rules = [{"id": r.id, "name": r.id, "shortDescription": {"text": r.summary},
              "defaultConfiguration": {"level": _SARIF_LEVEL[r.severity]}} for r in RULES.values()]
    index = {r.id: i for i, r in enumerate(RULES.values())}
    results = [{
        "ruleId": f.rule, "ruleIndex": index[f.rule], "level": _SARIF_LEVEL[f.severity],
        "message": {"text": f"{f.message}. fix: {f.fix}"},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": Path(f.path).as_posix()},
                                            "region": {"startLine": f.line, "startColumn": f.col}}}],
        "fixes": [{"description": {"text": f.fix}, "artifactChanges": []}],
    } for f in findings]
    log = {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
           "runs": [{"tool": {"driver": {"name": "ddpkit lint",
                                         "rules": rules}},
                     "results": results}]}
    return json.dumps(log, indent=2)
