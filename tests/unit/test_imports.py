"""The import graph of src/ddpkit: no cycles, no other module's private names, and lower layers never import higher.

Every `import` counts, wherever it sits: at module level, inside a function (a deferred import is
still a dependency) and under `if TYPE_CHECKING:` (a type is part of a module's contract). The
package face, ddpkit/__init__.py, names its exports as strings resolved on first use; those are not
imports, and no ddpkit module may import the face itself (it is the users' entry, above everything).

Private names: `from ddpkit.x import _y` and `ddpkit_module._y` are refused outside module x. A module
whose own name starts with an underscore (check/_bootstrap.py) is private to its package: only
modules of that package may import it; others name it as a string (`python -m ...`) if at all.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

ARCHITECTURE = SRC.parent / "docs" / "architecture.md"


def read_layers(text: str) -> list[tuple[str, set[str]]]:
    """The floors table of docs/architecture.md (between its floors:begin/end markers), lowest first:
    (floor name, module patterns); 'pkg.*' stands for package pkg and its modules."""
    import re

    body = text.split("<!-- floors:begin -->", 1)[1].split("<!-- floors:end -->", 1)[0]
    layers = []
    for row in body.strip().splitlines()[2:]:  # past the header and its rule
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        layers.append((cells[0], set(re.findall(r"`([\w.*]+)`", cells[1]))))
    return layers


LAYERS: list[tuple[str, set[str]]] = read_layers(ARCHITECTURE.read_text())
"""Lowest first, as docs/architecture.md draws them: a module may import its own layer and the ones below."""


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    names: tuple[str, ...] = ()
    """What `from target import ...` took from a module (empty for `import target` or a submodule)."""


def module_names(root: Path) -> dict[str, Path]:
    """'ddpkit.x.y' -> file, for every .py under root/ddpkit."""
    out = {}
    for path in sorted((root / "ddpkit").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def analyse(root: Path) -> tuple[dict[str, Path], list[Edge], list[str]]:
    """(modules, import edges between them, private-name uses as 'module:line: what')."""
    modules = module_names(root)
    edges, private = [], []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases: dict[str, str] = {}  # local name -> the ddpkit module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] != "ddpkit":
                        continue
                    edges.append(Edge(module, alias.name, node.lineno))
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        aliases["ddpkit"] = "ddpkit"
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(module, node, path.name == "__init__.py")
                if target.split(".")[0] != "ddpkit":
                    continue
                taken = []
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in modules:
                        edges.append(Edge(module, sub, node.lineno))
                        aliases[alias.asname or alias.name] = sub
                    else:
                        taken.append(alias.name)
                if taken:
                    edges.append(Edge(module, target, node.lineno, tuple(taken)))
        for edge in (e for e in edges if e.source == module):
            if edge.target != module:
                for name in edge.names:
                    if _private(name):
                        private.append(f"{module}:{edge.line}: imports {edge.target}.{name}")
            leaf = edge.target.rsplit(".", 1)[-1]
            package = edge.target.rsplit(".", 1)[0]
            if _private(leaf) and not (module == package or module.startswith(package + ".")):
                private.append(f"{module}:{edge.line}: imports the private module {edge.target} of {package}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                owner = _dotted(node.value)
                if owner is None:
                    continue
                head, _, rest = owner.partition(".")
                if head not in aliases:
                    continue
                target = aliases[head] + ("." + rest if rest else "")
                if target in modules and target != module:
                    private.append(f"{module}:{node.lineno}: uses {target}.{node.attr}")
    return modules, edges, private


def cycles(modules: dict[str, Path], edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components with more than one module (or a module importing itself)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        if e.target in graph:
            graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph has a few dozen nodes
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str, layers: list[tuple[str, set[str]]] = LAYERS) -> int | None:
    for level, (_, members) in enumerate(layers):
        for member in members:
            if module == member or member.endswith(".*") and (module == member[:-2] or module.startswith(member[:-1])):
                return level
    return None


def upward(edges: list[Edge], modules: dict[str, Path], layers: list[tuple[str, set[str]]] = LAYERS) -> list[str]:
    out = []
    for e in edges:
        if e.target not in modules or e.target == e.source:
            continue
        src, dst = layer_of(e.source, layers), layer_of(e.target, layers)
        if src is not None and dst is not None and dst > src:
            out.append(f"{e.source}:{e.line} ({layers[src][0]}) imports {e.target} ({layers[dst][0]})")
    return out


def _edges_in(path_text: dict[str, str], tmp_path: Path) -> tuple[dict[str, Path], list[Edge], list[str]]:
    for rel, text in path_text.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return analyse(tmp_path)


def test_the_checks_see_deferred_and_type_checking_imports_private_names_and_layers(tmp_path):
    modules, edges, private = _edges_in({
        "ddpkit/__init__.py": "from ddpkit.low import VERSION\n",
        "ddpkit/low.py": "VERSION = 1\ndef f():\n    from ddpkit import high\n    return high._secret\n",
        "ddpkit/high.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ddpkit.low import VERSION\n"
                          "from ddpkit.low import _hidden\nimport ddpkit.pkg._inner as inner\n_secret = 1\n",
        "ddpkit/pkg/__init__.py": "from . import _inner\n",
        "ddpkit/pkg/_inner.py": "X = 1\n",
    }, tmp_path)
    assert set(modules) == {"ddpkit", "ddpkit.low", "ddpkit.high", "ddpkit.pkg", "ddpkit.pkg._inner"}
    assert cycles(modules, edges) == [["ddpkit.high", "ddpkit.low"]]
    assert sorted(p.split(": ", 1)[1] for p in private) == [
        "imports ddpkit.low._hidden", "imports the private module ddpkit.pkg._inner of ddpkit.pkg",
        "uses ddpkit.high._secret"]  # pkg's own import of _inner is allowed
    layers = [("low", {"ddpkit.low", "ddpkit.pkg.*"}), ("high", {"ddpkit.high", "ddpkit"})]
    assert [u.split(" (")[0] for u in upward(edges, modules, layers)] == ["ddpkit.low:3"]
    assert layer_of("ddpkit.pkg._inner", layers) == 0 and layer_of("ddpkit.pkgx", layers) is None


def test_ddpkit_has_no_import_cycles():
    modules, edges, _ = analyse(SRC)
    found = cycles(modules, edges)
    detail = [f"{e.source}:{e.line} -> {e.target}" for c in found for e in edges if e.source in c and e.target in c]
    assert found == [], "import cycles (break them by moving the shared piece down a layer):\n" + "\n".join(detail)


def test_no_ddpkit_module_imports_another_modules_private_names():
    _, _, private = analyse(SRC)
    assert private == [], "make the name public where it is defined, or move the code that needs it there:\n" + \
        "\n".join(private)


def test_every_module_has_a_layer_and_lower_layers_never_import_higher_ones():
    modules, edges, _ = analyse(SRC)
    unplaced = sorted(m for m in modules if layer_of(m) is None)
    assert unplaced == [], f"add {unplaced} to a layer in LAYERS of tests/unit/test_imports.py (see DESIGN.md)"
    bad = upward(edges, modules)
    assert bad == [], "lower layers import higher ones:\n" + "\n".join(bad)


def test_the_package_face_imports_nothing_heavy_and_nobody_imports_the_face():
    modules, edges, _ = analyse(SRC)
    assert {e.target for e in edges if e.source == "ddpkit"} <= {"ddpkit.version"}
    into_face = [f"{e.source}:{e.line} imports {', '.join(e.names)} from the package face"
                 for e in edges if e.target == "ddpkit" and e.source != "ddpkit" and layer_of(e.source) != len(LAYERS) - 1]
    assert into_face == [], "\n".join(into_face) + "\nimport from the module that defines the name (ddpkit.version, ...)"


def floors(modules: dict[str, Path], edges: list[Edge]) -> tuple[int, list[str]]:
    """(the number of floors, the longest import chain): a module with no ddpkit import is floor 1."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        if e.target in graph and e.target != e.source:
            graph[e.source].add(e.target)
    chain: dict[str, list[str]] = {}

    def longest(m: str) -> list[str]:
        if m not in chain:
            chain[m] = [m] + max((longest(t) for t in sorted(graph[m])), key=len, default=[])
        return chain[m]

    best = max((longest(m) for m in sorted(modules)), key=len)
    return len(best), best


def test_the_import_graph_has_at_most_eight_floors():
    modules, edges, _ = analyse(SRC)
    count, chain = floors(modules, edges)
    print(f"{count} floors: {' -> '.join(chain)}")
    assert count <= 8, f"{count} floors (docs/architecture.md allows 8): {' -> '.join(chain)}"


def test_floors_count_the_longest_chain_of_imports(tmp_path):
    modules, edges, _ = _edges_in({
        "ddpkit/__init__.py": "",
        "ddpkit/a.py": "def f():\n    import ddpkit.b\n",
        "ddpkit/b.py": "from ddpkit import c\n",
        "ddpkit/c.py": "X = 1\n",
    }, tmp_path)
    assert floors(modules, edges) == (3, ["ddpkit.a", "ddpkit.b", "ddpkit.c"])


def test_at_most_24_modules_sit_directly_under_the_package():
    top = [p.name for p in (SRC / "ddpkit").iterdir()
           if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())]
    assert len(top) <= 24, f"{len(top)} modules directly under src/ddpkit (at most 24): {sorted(top)}"


def test_lint_and_port_stand_apart_from_the_runtime():
    modules, edges, _ = analyse(SRC)
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in edges
           for pkg in ("ddpkit.lint", "ddpkit.port")
           if (e.source == pkg or e.source.startswith(pkg + "."))
           and not (e.target == pkg or e.target.startswith(pkg + ".") or e.target == "ddpkit.version"
                    or pkg == "ddpkit.port" and e.target.startswith("ddpkit.lint"))]
    # port lints its own output (the claim gate), so it may import lint; lint never imports port
    assert bad == [], "lint/ and port/ read code and import only their own package (port: and lint):\n" + "\n".join(bad)


def test_the_floors_table_is_read_from_the_architecture_page():
    assert [name for name, _ in LAYERS][:2] == ["launcher contract", "device and seeds"]
    assert "ddpkit.hang.*" in dict(LAYERS)["hang forensics"]
    assert layer_of("ddpkit.run.launcher") == len(LAYERS) - 2 and layer_of("ddpkit") == len(LAYERS) - 1
