"""The shipped axioms' theory key read from its small cache (search/instance_proofs.py): the
same key as the compiled theory's, without compiling the axioms the second time."""

from __future__ import annotations

import json

from superopt.search.instance_proofs import InstanceProofs, theory_key
from superopt.verify.verifier import theory_for


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
