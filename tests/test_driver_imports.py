"""The import contract: `lint-imports` (pyproject.toml's [tool.importlinter]) holds on the tree,
and the driver's modules import at the top (no import hidden in a function to dodge a cycle)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contract_holds():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                        "lint_imports_command()"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "2 kept, 0 broken" in r.stdout


def _function_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [f"{path.name}:{n.lineno}" for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return found


def test_the_driver_and_the_rule_loader_import_at_the_top():
    files = sorted((ROOT / "superopt" / "driver").glob("*.py")) + [ROOT / "superopt" / "rules" / "load.py",
                                                                  ROOT / "superopt" / "codegen" / "export.py"]
    hidden = [x for f in files for x in _function_imports(f)]
    cli = ROOT / "superopt" / "driver" / "cli.py"
    allowed = ["from .tune import", "from .aside import", "from .ahead import", "from .command import"]
    ahead = ROOT / "superopt" / "driver" / "ahead.py"  # the forked exporter's own, imported after the fork
    in_child = ["from ..codegen import write_program", "from .model import no_stack_traces"]
    assert sorted(hidden) == sorted(["cli.py:%d" % _line(cli, text) for text in allowed]
                                    + ["ahead.py:%d" % _line(ahead, text) for text in in_child])


def _line(path: Path, text: str) -> int:
    """The deferred imports allowed: the commands' work, so that `superopt --help` is fast."""
    return next(k for k, line in enumerate(path.read_text().splitlines(), 1) if text in line)
