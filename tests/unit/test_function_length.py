"""No function or method in app/ or engines/ runs over 100 lines (a nested function counts
within the one around it, and on its own): a function that long does several things, and
each of them is easier to read, name and test as a function of its own."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 100


def long_functions(root: Path, packages: list[str], limit: int = LIMIT) -> list[str]:
    """`path Class.function (lines)` for every function longer than `limit` lines, decorators
    and docstring included, longest first."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            found += _long_in(ast.parse(path.read_text()), path.relative_to(root).as_posix(), limit)
    return [f"{where} ({n} lines)" for n, where in sorted(found, key=lambda f: (-f[0], f[1]))]


def _long_in(tree: ast.AST, path: str, limit: int, scope: str = "") -> list[tuple[int, str]]:
    found = []
    for node in ast.iter_child_nodes(tree):
        name = f"{scope}{getattr(node, 'name', '')}"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = node.end_lineno - first + 1
            if lines > limit:
                found.append((lines, f"{path} {name}"))
            found += _long_in(node, path, limit, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            found += _long_in(node, path, limit, f"{name}.")
        else:
            found += _long_in(node, path, limit, scope)
    return found


def test_no_function_in_app_or_engines_is_over_100_lines():
    offenders = long_functions(ROOT, ["app", "engines"])
    assert offenders == [], "over 100 lines:\n" + "\n".join(offenders)


def test_a_long_function_is_named_with_its_length(tmp_path):
    """The checker itself: a method, a nested function and a decorated one, in a throwaway package."""
    body = "".join(f"    x{i} = {i}\n" for i in range(6))
    source = (f"class A:\n    def long(self):\n{body.replace('    ', '        ')}"
              f"def outer():\n    def inner():\n{body.replace('    ', '        ')}    return inner\n"
              f"@staticmethod\ndef short():\n    return 1\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(source)
    assert long_functions(tmp_path, ["pkg"], limit=6) == ["pkg/m.py outer (9 lines)", "pkg/m.py A.long (7 lines)",
                                                          "pkg/m.py outer.inner (7 lines)"]
    assert long_functions(tmp_path, ["pkg"], limit=9) == []
