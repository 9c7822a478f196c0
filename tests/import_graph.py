"""The product's import graph, read with the stdlib's `ast` (nothing is imported or run).

Every import counts, also those inside functions (they run on some path, and a circle through
them is still a circle to a reader); relative imports are resolved against the module's
package. `from a.b import c` is an edge to the module a.b.c when that is a module, else to a.b.
Only edges between the product's own modules are kept (plus `external`: the top-level names of
everything else each module imports, for contracts such as "no Qt in engines").
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ImportGraph:
    root: Path
    modules: dict[str, Path] = field(default_factory=dict)  # dotted name -> file
    edges: dict[str, set[str]] = field(default_factory=dict)  # module -> product modules it imports
    external: dict[str, set[str]] = field(default_factory=dict)  # module -> other top-level names

    def circles(self) -> list[list[str]]:
        """Every strongly connected component of more than one module (Tarjan), sorted."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[list[str]] = []

        def visit(v: str) -> None:  # recursive: the graph has a few hundred modules
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in self.edges.get(v, ()):
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
                if len(component) > 1 or v in self.edges.get(v, ()):
                    found.append(sorted(component))

        for v in sorted(self.modules):
            if v not in index:
                visit(v)
        return sorted(found)

    def imports_of(self, prefix: str) -> dict[str, set[str]]:
        """The product modules under `prefix` (a package name) and what each imports."""
        return {m: self.edges.get(m, set()) for m in self.modules if in_package(m, prefix)}


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def read_graph(root: Path, packages: list[str]) -> ImportGraph:
    graph = ImportGraph(root)
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            graph.modules[module_name(root, path)] = path
    for name, path in graph.modules.items():
        is_package = path.name == "__init__.py"
        inside, outside = set(), set()
        for target in imported_names(ast.parse(path.read_text(encoding="utf-8")), name, is_package):
            module = product_module(target, graph.modules)
            if module is not None:
                if module != name:
                    inside.add(module)
            else:
                outside.add(target.split(".")[0])
        graph.edges[name] = inside
        graph.external[name] = outside
    return graph


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names this module imports; for `from m import x`, both `m.x` and `m`
    (product_module keeps the one that is a module)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module is in
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            names += [f"{base}.{a.name}" if base else a.name for a in node.names]
    return names


def product_module(dotted: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `dotted` that is one of the product's modules."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None
