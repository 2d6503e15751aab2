"""Keep the code readable: no module over 400 lines, no function over 80 lines,
unless a reason is written at its top.

A module gives its reason as a line ``Size: ...`` in its docstring; a function
as a line ``Size: ...`` in its docstring. The reason must say why splitting
would make the code harder to follow, not just that it is long.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hetsched"
MODULE_LINES = 400
FUNCTION_LINES = 80


def _has_reason(doc: str | None) -> bool:
    return any(line.strip().startswith("Size:") for line in (doc or "").splitlines())


def oversized() -> list[str]:
    out: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        rel = path.relative_to(PACKAGE.parent)
        n = len(text.splitlines())
        if n > MODULE_LINES and not _has_reason(ast.get_docstring(tree)):
            out.append(f"{rel}: {n} lines (> {MODULE_LINES}) and no 'Size:' reason")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES and not _has_reason(ast.get_docstring(node)):
                    out.append(f"{rel}:{node.lineno} {node.name}: {length} lines "
                               f"(> {FUNCTION_LINES}) and no 'Size:' reason")
    return out


def test_no_oversized_module_or_function_without_a_reason() -> None:
    found = oversized()
    assert not found, "\n".join(found)


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES + 5))
    tree = ast.parse(f"def f():\n{body}\n")
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert (fn.end_lineno or 0) - fn.lineno + 1 > FUNCTION_LINES
    assert not _has_reason(ast.get_docstring(fn))
    assert _has_reason("Long.\n\nSize: one state machine; split, its states would scatter.")


if __name__ == "__main__":
    print("\n".join(oversized()) or "all within bounds")
