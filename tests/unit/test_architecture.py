"""The house's import contracts, read from the source with the stdlib's `ast` (tests/import_graph.py):
no import circles among the product's modules, engines never import Qt or app, Qt only in
app/gui, the rooms import only downwards (docs/architecture.md draws the same arrows). And
importing the engines' types pulls in neither Qt nor a model runtime (the GUI starts fast and
engines stay headless)."""

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.import_graph import in_package, read_graph

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["app", "engines", "resources"]
QT_MODULES = {"PySide6", "PyQt5", "PyQt6", "pyqtgraph", "qtpy", "shiboken6"}

# room -> rooms it must never import (the arrows point down; app.cli.main, the dispatcher on
# top, is the one module that may open the window)
FORBIDDEN = {
    "engines": ["app"],
    # the batch is built on the single-stream chat engine, never the other way round; the
    # backend-agnostic speculation code knows no engine
    "engines.mlx_chat": ["engines.batch", "engines.distributed"],
    # tensor parallel wraps the batch loop from outside: the batch knows nothing of ranks
    "engines.batch": ["engines.distributed"],
    "engines.speculative": ["engines.batch", "engines.distributed", "engines.mlx_chat", "engines.glm_ocr", "engines.remote"],
    "resources": ["app", "engines"],
    "app.models": ["app.cli", "app.gui", "app.serve", "app.records"],
    "app.records": ["app.cli", "app.gui", "app.serve", "app.models"],
    "app.serve": ["app.cli", "app.gui"],
    "app.gui": ["app.cli", "app.serve"],
    "app.cli": ["app.gui"],
}
ALLOWED = {("app.cli.main", "app.gui.startup")}  # no command -> the window
CLI_BOTTOM = ["app.cli.common", "app.cli.io"]  # shared by the commands; imports none of them

GRAPH = read_graph(ROOT, PRODUCT)


def test_no_import_circles():
    assert GRAPH.circles() == []


def test_qt_only_in_app_gui():
    offenders = [f"{m}: {sorted(names & QT_MODULES)}" for m, names in GRAPH.external.items()
                 if names & QT_MODULES and not in_package(m, "app.gui")]
    assert offenders == []


def test_engines_never_import_app():
    offenders = [f"{m} -> {t}" for m, targets in GRAPH.imports_of("engines").items()
                 for t in targets if in_package(t, "app")]
    assert offenders == []


def test_rooms_import_only_downwards():
    offenders = []
    for room, forbidden in FORBIDDEN.items():
        for module, targets in GRAPH.imports_of(room).items():
            offenders += [f"{module} -> {t}" for t in sorted(targets)
                          if any(in_package(t, f) for f in forbidden) and (module, t) not in ALLOWED]
    assert offenders == []


def test_cli_bottom_imports_no_command():
    offenders = [f"{m} -> {t}" for m in CLI_BOTTOM for t in GRAPH.edges[m]
                 if in_package(t, "app.cli") and t not in CLI_BOTTOM]
    assert offenders == []


def test_the_graph_sees_every_product_module():
    """The contracts above hold only for what the graph reads: a module it missed would pass."""
    on_disk = {p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py")}
    assert set(GRAPH.modules.values()) == on_disk
    assert {"app.cli.main", "app.gui.main_window", "engines.types", "engines.factory"} <= set(GRAPH.modules)


def test_a_planted_circle_is_found(tmp_path):
    """The checker itself: a circle through a function-local relative import, and a second one
    through `from package import module`, in a throwaway package."""
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import thing\n",
        "pkg/b.py": "def thing():\n    from .c import other\n    return other\n",
        "pkg/c.py": "import pkg.a\nother = 1\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/x.py": "from pkg.sub import y\n",
        "pkg/sub/y.py": "from . import x\n",
        "pkg/sub/z.py": "from pkg.sub import x\n",  # imports into the circle, is not in it
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    assert read_graph(tmp_path, ["pkg"]).circles() == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.sub.x", "pkg.sub.y"]]
    (tmp_path / "pkg/c.py").write_text("other = 1\n")  # break the first circle
    assert read_graph(tmp_path, ["pkg"]).circles() == [["pkg.sub.x", "pkg.sub.y"]]


def test_importing_engine_types_loads_no_qt_mlx_or_torch():
    code = (
        "import sys, engines, engines.types, engines.factory, engines.speculative, engines.speculative.sampling\n"
        "heavy = {'PySide6', 'mlx', 'torch', 'transformers', 'coremltools'} & {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def private_names_by_module() -> dict[Path, set[str]]:
    """The underscore names each of the product's modules defines: functions, methods, classes."""
    import ast

    names = {}
    for package in ("app", "engines"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            names[path] = {n.name for n in ast.walk(tree)
                           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                           and n.name.startswith("_") and not n.name.startswith("__")}
    return names


def test_no_module_calls_another_modules_underscore_names():
    """What a module keeps to itself (a leading underscore) stays there: `x._name(...)` where
    `_name` is another of the product's modules' and not this one's (self, cls and super() are
    the class's own). The batch once made 14 such calls into the chat engine."""
    import ast

    defined = private_names_by_module()
    elsewhere: dict[str, set[Path]] = {}
    for path, names in defined.items():
        for name in names:
            elsewhere.setdefault(name, set()).add(path)
    crossings = []
    for path, own in defined.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr in elsewhere and node.attr not in own):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            crossings.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert crossings == []
