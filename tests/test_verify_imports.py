"""The verifier package loads z3 and the prover on first use only: the rule database and the
rule loader (what `superopt optimize` imports at start-up) need just ``verify.result``, and every
public name still imports, ``prove`` and ``crosscheck`` being the functions."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_the_rule_loader_does_not_import_the_prover():
    out = _run("import sys, superopt.rules.load, superopt.rules.db\n"
               "print(sorted(m for m in ('z3', 'superopt.verify.prove', 'superopt.verify.verifier',"
               " 'superopt.verify.crosscheck') if m in sys.modules))")
    assert out.strip() == "[]"


def test_a_public_name_loads_its_submodule_on_use():
    out = _run("import sys, superopt.verify as v\n"
               "assert 'superopt.verify.verifier' not in sys.modules\n"
               "from superopt.verify import verify_rules\n"
               "print(verify_rules.__module__, 'superopt.verify.verifier' in sys.modules)")
    assert out.split() == ["superopt.verify.verifier", "True"]


def test_every_public_name_imports_and_prove_is_the_function():
    import importlib
    import superopt.verify as v
    importlib.import_module("superopt.verify.prove")  # binding the submodule must not hide the function
    importlib.import_module("superopt.verify.crosscheck")
    for name in v.__all__:
        assert getattr(v, name) is not None, name
    from superopt.verify import crosscheck, prove
    assert isinstance(prove, types.FunctionType) and prove.__module__ == "superopt.verify.prove"
    assert isinstance(crosscheck, types.FunctionType) and crosscheck.__module__ == "superopt.verify.crosscheck"
    assert sys.modules["superopt.verify.prove"].prove is prove
    try:
        from superopt.verify import no_such_name  # noqa: F401
    except ImportError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("an unknown name imported")
