"""The README and docs/ stay true to the code: every ddpkit name they use exists, every relative
link points at a file of the repository, and the README stays short."""

from __future__ import annotations

import importlib
import importlib.util
import re
import unicodedata
from pathlib import Path

import pytest

import ddpkit

ROOT = Path(__file__).resolve().parents[2]
README_MAX_BYTES = 12 * 1024


def _doc_files() -> list[Path]:
    """README.md, benchmarks/README.md and every docs/*.md (including files added later)."""
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---- names --------------------------------------------------------------------------------------

_DOTTED = re.compile(r"\bddpkit((?:\.[A-Za-z_]\w*)+)(?!\w)(?<!\.pt)")  # a file such as ddpkit.pt is no name
_FROM_IMPORT = re.compile(r"\bfrom (ddpkit(?:\.[A-Za-z_]\w*)*) import ([A-Za-z_][\w, ]*)")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent is not a package
        return False


def _resolves(dotted: str) -> bool:
    """`ddpkit.a.b.c`: import the longest module prefix, then find the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if _is_module(module):
            obj = importlib.import_module(module)
            for attr in parts[cut:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


def names_used(text: str) -> set[str]:
    """Every `ddpkit.x[.y...]` and `from ddpkit[.m] import a, b` in a text, as dotted names."""
    used = {"ddpkit" + m.group(1) for m in _DOTTED.finditer(text)}
    for module, names in _FROM_IMPORT.findall(text):
        used |= {f"{module}.{n.strip()}" for n in names.split(",") if n.strip()}
    return used


def test_names_used_finds_dotted_and_imported_names():
    text = "call `ddpkit.wrap(m, ctx)`; ddpkit.run.launcher.build_torchrun_argv.\nfrom ddpkit.metrics.log import MetricsLog, print0\n"
    assert names_used(text) == {"ddpkit.wrap", "ddpkit.run.launcher.build_torchrun_argv", "ddpkit.metrics.log",
                                "ddpkit.metrics.log.MetricsLog", "ddpkit.metrics.log.print0"}
    assert not _resolves("ddpkit.no_such_name") and not _resolves("ddpkit.run.launcher.no_such_function")


def test_every_ddpkit_name_the_docs_use_exists():
    missing, top = [], set()
    for path in _doc_files():
        for dotted in sorted(names_used(path.read_text())):
            first = dotted.split(".")[1]
            if not _is_module(f"ddpkit.{first}"):
                top.add(first)
            if not _resolves(dotted):
                missing.append(f"{_rel(path)}: {dotted}")
    assert not missing, "names the docs use that ddpkit lacks: " + "; ".join(missing)
    # The docs name most of the public API, and everything public resolves.
    assert {"init", "wrap", "loader"} <= set(ddpkit.__all__) and len(top) > 10
    assert [n for n in sorted(top | set(ddpkit.__all__)) if not hasattr(ddpkit, n)] == []


def face_table(text: str) -> set[str]:
    """The names in docs/api.md's face table (between its face:begin/end markers)."""
    body = text.split("<!-- face:begin -->", 1)[1].split("<!-- face:end -->", 1)[0]
    rows = body.strip().splitlines()[2:]
    return {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}


def test_the_api_page_documents_exactly_the_package_face():
    documented = face_table((ROOT / "docs" / "api.md").read_text())
    exported = set(ddpkit.__all__)
    assert documented - exported == set(), f"docs/api.md documents names ddpkit does not export: {documented - exported}"
    assert exported - documented == set(), f"ddpkit exports names docs/api.md does not document: {exported - documented}"
    # 20 names, and gather_list: what `ddpkit port` writes after an evaluation loop that fills lists
    assert len(exported) <= 21, f"the face holds {len(exported)} names (at most 21): {sorted(exported)}"


def test_a_name_off_the_face_says_which_module_has_it():
    with pytest.raises(AttributeError, match=r"from ddpkit.checkpoint.api import latest_checkpoint"):
        ddpkit.latest_checkpoint  # noqa: B018
    with pytest.raises(AttributeError, match=r"no attribute 'nonsense'$"):
        ddpkit.nonsense  # noqa: B018


# ---- links --------------------------------------------------------------------------------------

_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks (a `[x](y)` inside code is not a link)."""
    return _FENCE.sub("", text)


def relative_links(text: str) -> list[str]:
    """Targets of the inline links of a markdown text that point into the repository."""
    return [t for t in _LINK.findall(_prose(text)) if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


def anchors(text: str) -> set[str]:
    """GitHub's anchors for a markdown file's headings (lowercased; punctuation but - and _ dropped;
    spaces -> hyphens; repeated headings numbered -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_prose(text)):
        slug = "".join(c for c in heading.lower().replace("`", "")
                       if c in " -_" or unicodedata.category(c)[0] in "LN").replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_link_helpers():
    text = ("see [api](docs/api.md#setup), [web](https://pytorch.org), [top](#top), ![img](x.png)\n"
            "```\n[not](a-link.md)\n```\n# Set-up — `ddpkit run`\n## Same\n## Same\n")
    assert relative_links(text) == ["docs/api.md#setup", "#top"]
    assert anchors(text) == {"set-up--ddpkit-run", "same", "same-1"}


@pytest.mark.parametrize("path", _doc_files(), ids=_rel)
def test_every_relative_link_points_at_a_file_that_exists(path):
    broken = []
    for target in relative_links(path.read_text()):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target} (no heading with the anchor #{anchor} in {_rel(dest)})")
    assert not broken, f"{_rel(path)} has broken links: " + "; ".join(broken)


def test_the_readme_links_every_docs_file():
    readme = (ROOT / "README.md").read_text()
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(readme)}
    unlinked = [_rel(p) for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert unlinked == []


# ---- size ---------------------------------------------------------------------------------------

def test_the_readme_is_at_most_12_kb():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/ (limit {README_MAX_BYTES})"
