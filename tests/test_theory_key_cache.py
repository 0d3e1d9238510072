"""The shipped axioms' theory key read from its small cache (search/instance_proofs.py): the
same key as the compiled theory's, without compiling the axioms the second time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from superopt.search.instance_proofs import InstanceProofs, theory_key
from superopt.verify.verifier import theory_for

ROOT = Path(__file__).resolve().parents[1]


def test_theory_key_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPEROPT_PROOF_CACHE", str(tmp_path / "instance_proofs.db"))
    want = theory_key(theory_for(None))
    first = InstanceProofs()
    assert first.theory_key() == want
    doc = json.loads((tmp_path / "theory-keys.json").read_text())
    assert list(doc.values()) == [want]
    second = InstanceProofs()
    assert second.theory_key() == want and second._theory is None  # read, not compiled


def test_stale_entry_not_used(tmp_path, monkeypatch):
    """An entry under another digest (other axiom files or parser) is not read."""
    monkeypatch.setenv("SUPEROPT_PROOF_CACHE", str(tmp_path / "instance_proofs.db"))
    (tmp_path / "theory-keys.json").write_text(json.dumps({"0" * 32: "stale"}))
    assert InstanceProofs().theory_key() == theory_key(theory_for(None))


def test_given_theory_is_keyed_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPEROPT_PROOF_CACHE", str(tmp_path / "instance_proofs.db"))
    th = theory_for(None)
    assert InstanceProofs(theory=th).theory_key() == theory_key(th)
    assert not (tmp_path / "theory-keys.json").exists()


def test_specs_found_without_importing_the_axioms_package():
    """The cached key reads the axiom files from where ``default_specs_dir`` says, without
    importing the axioms package (a search whose answers are stored needs none of it)."""
    code = ("import sys; from superopt.search.instance_proofs import _specs_dir; d = _specs_dir(); "
            "assert 'superopt.axioms' not in sys.modules; from superopt.axioms.parse import default_specs_dir; "
            "assert d == default_specs_dir(), (d, default_specs_dir())")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
