"""Kernel rules in the rule database: built from a profile, stored, listed and shown."""

import dataclasses
import json

import numpy as np
import pytest

from superopt.cli import main
from superopt.driver.kernel_rules import kernel_rules_for, store_kernel_rules
from superopt.ir import GraphBuilder
from superopt.kernel import default_configs
from superopt.kernel.choose import cached_candidates
from superopt.kernel.profile import KernelEntry, KernelProfile, ModelVerdict, region_signature
from superopt.kernel.regions import canonical_region, find_regions
from superopt.kernel.tune import config_text, variants
from superopt.rules.db import RuleDB
from superopt.rules.kernel_rules import get_kernel_rule, kernel_rules


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SUPEROPT_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kcache"))


def _norm_linear_graph(k=32, n=48, seed=0):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (4, k))
    ms = b.op("mean", b.op("pow", x, exponent=2.0), axis=-1, keepdim=1)
    r = b.op("rsqrt", b.op("add", ms, b.weight("eps", (1,), np.full((1,), 1e-5, np.float32))))
    h = b.op("mul", b.op("mul", x, r), b.weight("g", (k,), (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)))
    return b.build([b.op("matmul", h, b.weight("w", (k, n), (rng.standard_normal((k, n)) / k ** 0.5).astype(np.float32)))])


def _profile(graph, forge=False):
    prof = KernelProfile()
    for region in find_regions(graph):
        canon = canonical_region(region.graph)[0]
        c = cached_candidates(canon)[0][0]
        names = {canon.nodes[i].name for i in canon.weights} | set(c.prep.names if c.prep else ())
        prog = variants(c.program, names, "fp32")[-1].text()
        if forge:
            prog = prog.replace("1/32", "1/31")
        prof.add(KernelEntry(region_signature(canon), "fp32", "test-gpu", prog, config_text(default_configs(
            variants(c.program, names, "fp32")[-1])[0]), 1.5, 3.0, "2.x", "3.x", region="rms-linear"))
    return prof


def test_kernel_rules_are_built_stored_listed_and_shown(tmp_path, capsys):
    g = _norm_linear_graph()
    prof = _profile(g)
    sig = next(iter(prof.entries))[0]
    prof.add_model(ModelVerdict("m", "fp32", "test-gpu", (sig,), 9.0, 10.0, model="tiny"))
    rules = kernel_rules_for(g, prof, "fp32")
    assert len(rules) == 1
    k = rules[0]
    assert k.proof["status"] == "proved" and k.proof["checks"] and k.models == ("tiny",)
    assert "data" not in json.loads(k.region_json)   # the region's structure, never a model's weights
    assert "@triton.jit" in k.triton and "transposed" in k.proof["variant"] or "storage" in k.proof["variant"]
    db = tmp_path / "r.db"
    assert store_kernel_rules(db, rules) == 1
    assert store_kernel_rules(db, rules) == 1        # the same rule again replaces it
    with RuleDB.open(db) as d:
        back = get_kernel_rule(d, k.id[:6])
        assert [r.id for r in kernel_rules(d)] == [k.id] and back.created
        assert dataclasses.replace(back, created="") == k
    capsys.readouterr()
    assert main(["rules", "list", "--kernels", "--db", str(db)]) == 0
    out = capsys.readouterr()
    assert k.id in out.out and "proved" in out.out and "2.00x" in out.out and "1 kernel rule(s)" in out.err
    assert main(["rules", "show", k.id, "--db", str(db)]) == 0
    text = capsys.readouterr().out
    for want in ("kernel program (right side)", "Triton source", "@triton.jit", "region (left side)",
                 "fingerprint", "measured    1.50 us on test-gpu", "models      tiny"):
        assert want in text, want
    assert main(["rules", "show", k.id, "--db", str(db), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["id"] == k.id and doc["proof"]["status"] == "proved" and doc["speedup"] == 2.0


def test_no_rule_for_a_program_no_proved_candidate_accounts_for():
    g = _norm_linear_graph()
    assert kernel_rules_for(g, _profile(g, forge=True), "fp32") == []
    assert kernel_rules_for(g, KernelProfile(), "fp32") == []


def test_a_database_without_kernel_rules_and_a_wrong_id(tmp_path, capsys):
    db = tmp_path / "empty.db"
    RuleDB.create(db).close()
    assert main(["rules", "list", "--kernels", "--db", str(db)]) == 0
    assert "0 kernel rule(s)" in capsys.readouterr().err
    assert main(["rules", "show", "K0000", "--db", str(db)]) != 0
    err = capsys.readouterr().err
    assert "no kernel rule K0000" in err and "Traceback" not in err


def test_the_shipped_database_holds_the_shipped_kernels(capsys):
    """Every kernel rule in rules/default.db is proved, and is a kernel a shipped profile measured
    (the same program and time, on the same GPU: an H100 or an H200)."""
    from superopt.kernel.profile import shipped_profile
    from superopt.rules.paths import default_db_path
    with RuleDB.open(default_db_path()) as d:
        ks = kernel_rules(d)
    assert ks, "no kernel rules in the shipped database (scripts/ship_kernel_rules.py writes them)"
    assert default_db_path().stat().st_size < 16 << 20   # no weights stored with the regions
    measured = shipped_profile().entries
    for k in ks:
        assert k.proof["status"] == "proved" and k.us > 0 and k.inductor_us > 0
        assert k.device.startswith(("NVIDIA H100", "NVIDIA H200"))
        entry = measured.get((k.signature, k.dtype, k.device))
        assert entry is not None and entry.program == k.program and entry.us == k.us, k.region
        assert "@triton.jit" in k.triton
