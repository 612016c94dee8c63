#!/usr/bin/env python3
"""Import circles and upward arrows in ``src/streamledger`` (issue 31: "a house you can walk").

Why a script of our own: the rule is ours (which layer may import which), so the check must be one
anyone can run with the project's own files: ``python scripts/import_graph.py`` (lists each circle and
upward arrow; exit 1 when there is one).

Every ``import``/``from … import`` counts, at module level or inside a function (a lazy import is
still a dependency), except those under ``if TYPE_CHECKING:`` (annotations only). A package's
``__init__`` counts as the package itself. Layers, lowest first; an arrow may point down or
sideways, never up:
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src"
PKG = "streamledger"

# Lowest first. A module belongs to the first entry that is a prefix of its dotted name.
# The root package face holds only the version, so it sits at the bottom.
LAYERS: list[tuple[str, ...]] = [
    ("streamledger.errors", "streamledger.offsets"),
    ("streamledger.protocol",),
    ("streamledger.home", "streamledger.paths", "streamledger.sources", "streamledger.manifest",
     "streamledger.schemas", "streamledger.redaction", "streamledger.progress",
     "streamledger.runs", "streamledger.processes", "streamledger.transform",
     "streamledger.fs", "streamledger.topology"),
    ("streamledger.ledger", "streamledger.migrations"),
    ("streamledger.batch",),
    ("streamledger.spark",),
    ("streamledger.hooks", "streamledger.queues", "streamledger.triggers", "streamledger.sensors",
     "streamledger.operators", "streamledger.dagster", "streamledger.provider", "streamledger.plugins",
     "streamledger.cli", "streamledger.batch.__face__"),
]
# A package face that offers names of a higher layer for the public API (resolved on first use, so
# importing the package's modules never imports that layer) counts at the top: its modules may not
# import it for anything but their siblings.
FACES = {"streamledger.batch"}
__doc__ = (__doc__ or "") + "".join(f"\n  {i}. {', '.join(names)}" for i, names in enumerate(LAYERS))


def layer_of(module: str) -> int:
    if module == PKG:
        return -1
    if module in FACES:
        module = module + ".__face__"
    best, level = -1, len(LAYERS)
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, level = len(name), i
    return level


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, module: str, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith(PKG):
                        target = resolve(alias.name)
                        if target:
                            found.add(target)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_pkg else module.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)]
                    stem = ".".join(base + ([child.module] if child.module else []))
                else:
                    stem = child.module or ""
                if not stem.startswith(PKG):
                    continue
                for alias in child.names:
                    full = f"{stem}.{alias.name}"
                    target = resolve(full) if full in known else resolve(stem)
                    if target:
                        found.add(target)
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    argparse.ArgumentParser(description=__doc__, formatter_class=formatter).parse_args()
    files = [p for p in (ROOT / PKG).rglob("*.py") if "_pb" not in p.parts]
    known = {module_name(p) for p in (ROOT / PKG).rglob("*.py")}  # generated code: known, not scanned
    graph: dict[str, set[str]] = defaultdict(set)
    for path in files:
        mod = module_name(path)
        graph[mod] = imports_of(path, mod, known)
    # A package face importing its own submodules is not a circle with them (re-export is its job),
    # but a submodule importing its own package face is an arrow like any other.
    circles = strongly_connected(graph)
    upward = sorted((a, b) for a, deps in graph.items() for b in deps if layer_of(b) > layer_of(a))
    lines = sum(len(p.read_text().splitlines()) for p in files)
    print(f"{len(files)} modules, {lines} lines, {sum(len(d) for d in graph.values())} imports")
    print(f"circles: {len(circles)}")
    for comp in circles:
        print("  " + " <-> ".join(comp))
    print(f"upward arrows: {len(upward)}")
    for a, b in upward:
        print(f"  {a} -> {b}  (layer {layer_of(a)} -> {layer_of(b)})")
    return 1 if circles or upward else 0


if __name__ == "__main__":
    raise SystemExit(main())
