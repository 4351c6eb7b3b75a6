"""The package's layering, as the design fixes it: the silo side never imports the server
side, and the core decides with numpy alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fl_lbbsp"


def imported_modules(path: Path, *, module_level: bool = False) -> set[str]:
    """Absolute names of the modules ``path`` imports (``module_level``: only those its
    import runs, not those a function imports when called)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    nodes = tree.body if module_level else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                names.add(".".join([*base, *([node.module] if node.module else [])]))
            elif node.module:
                names.add(node.module)
    return names


@pytest.mark.parametrize(
    ("folder", "forbidden", "module_level"),
    [
        # The silo side, anywhere in its code.
        ("clients", ("fl_lbbsp.strategies", "fl_lbbsp.runs"), False),
        # The core imports with numpy alone (NARX's training imports torch when it runs).
        ("core", ("flwr", "torch", "fl_lbbsp.strategies", "fl_lbbsp.clients"), True),
    ],
)
def test_layers_import_only_what_they_may(
    folder: str, forbidden: tuple[str, ...], module_level: bool
) -> None:
    # Execute
    found = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for name in imported_modules(path, module_level=module_level)
        if name.startswith(forbidden)
    }

    # Assert
    assert not found
