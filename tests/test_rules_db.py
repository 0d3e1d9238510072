"""The rule database and its commands: round trips, identity, transactions (also under kill -9),
refusing foreign, corrupt and newer files without writing them, and every `superopt rules`
command in text and JSON; `superopt verify --db` after the axioms change."""

import json
import os
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from superopt.cli import main
from superopt.ir import GraphBuilder, Rule
from superopt.rules import SCHEMA_VERSION, RuleDB, RuleDBError
from superopt.verify import VerifyResult
from superopt.verify.samples import composed_rules

RULES = composed_rules()
PROVEN = VerifyResult("proven", "unsat", 0.01, ("add_comm",), "passed", 0.0)
UNPROVEN = VerifyResult("unproven", "sat: not implied", 0.02, (), "failed", 0.5)


def _pairs(names=("conv_fuse_kernels", "factor_common", "concat_grid", "wrong_add_mul", "matmul_split_merge")):
    return [(RULES[n], UNPROVEN if n.startswith("wrong") else PROVEN) for n in names]


@pytest.fixture
def db_path(tmp_path):
    path = tmp_path / "rules.db"
    with RuleDB.create(path, {"max_ops": 2, "seed": 7}) as db:
        assert db.add(_pairs()) == 5
    return path


def _renamed(rule: Rule, names: dict) -> Rule:
    sides = []
    for g in (rule.lhs, rule.rhs):
        b = GraphBuilder()
        remap = {}
        for i, n in enumerate(g.nodes):
            if n.name is not None:
                remap[(i, 0)] = b.input(names.get(n.name, n.name), n.types[0].shape)
            else:
                remap.update({(i, k): r for k, r in enumerate(b.add(n.op, [remap[tuple(r)] for r in n.inputs], n.attr))})
        sides.append(b.build([remap[tuple(r)] for r in g.outputs]))
    return Rule(*sides)


# ---- the library -------------------------------------------------------------------------------

def test_round_trip_and_queries(db_path):
    with RuleDB.open(db_path) as db:
        assert len(db) == 5 and db.ids() == {r.id for r, _ in _pairs()}
        assert db.meta["schema_version"] == SCHEMA_VERSION and db.meta["settings"] == {"max_ops": 2, "seed": 7}
        s = db.get(RULES["factor_common"].id)
        assert s.rule == RULES["factor_common"] and s.result == PROVEN
        assert s.sizes == RULES["factor_common"].size and s.ops == RULES["factor_common"].ops
        assert db.get(s.id[:6]).id == s.id
        assert [x.id for x in db.query(status="unproven")] == [RULES["wrong_add_mul"].id]
        assert {x.id for x in db.query(op="conv2d")} == {RULES["conv_fuse_kernels"].id}
        assert all(max(x.sizes) <= 2 for x in db.query(max_ops=2))
        sizes = [sum(x.sizes) for x in db.query(order_by="size", descending=True)]
        assert sizes == sorted(sizes, reverse=True)
        assert {r.id for r in db.proven_rules()} == db.ids() - {RULES["wrong_add_mul"].id}
        assert db.settings()[s.settings_id]["seed"] == 7


def test_add_skips_rules_already_stored_even_renamed(db_path):
    renamed = _renamed(RULES["factor_common"], {"x": "p", "y": "q", "z": "r"})
    assert renamed.id == RULES["factor_common"].id
    with RuleDB.open(db_path, writable=True) as db:
        assert db.add([(renamed, PROVEN), (RULES["conv_identity"], PROVEN)], settings={"max_ops": 3}) == 1
        assert len(db) == 6
        assert db.get(RULES["conv_identity"].id).settings_id != db.get(RULES["factor_common"].id).settings_id


def test_update_results_is_one_transaction(db_path):
    rid = RULES["factor_common"].id
    with RuleDB.open(db_path, writable=True) as db:
        with pytest.raises(RuleDBError, match="no rule with id"):
            db.update_results([(rid, UNPROVEN), ("feedfeedfeedfeed", UNPROVEN)])
        assert db.get(rid).status == "proven"
        assert db.update_results([(rid, UNPROVEN)], note={"timeout_s": 1}) == 1
        assert db.get(rid).result == UNPROVEN and db.meta["last_verification"]["timeout_s"] == 1


def test_add_interrupted_by_an_error_writes_nothing(db_path):
    def pairs():
        yield RULES["conv_identity"], PROVEN
        raise RuntimeError("generator crashed")

    with RuleDB.open(db_path, writable=True) as db:
        with pytest.raises(RuntimeError):
            db.add(pairs())
        assert len(db) == 5


def test_add_killed_mid_transaction_leaves_the_file_as_before(db_path):
    """kill -9 while the transaction is open: the next open rolls it back."""
    code = f"""
import os
from superopt.rules import RuleDB
from superopt.verify import VerifyResult
from superopt.verify.samples import enumerated_rules
res = VerifyResult("proven", "unsat", 0.0)
def pairs():
    for i, r in enumerate(enumerated_rules(2)):
        if i == 10:
            os.kill(os.getpid(), 9)
        yield r, res
with RuleDB.open({str(db_path)!r}, writable=True) as db:
    db._conn.execute("PRAGMA cache_size = 1")
    db.add(pairs())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert done.returncode == -9, done.stderr.decode()
    assert Path(str(db_path) + "-journal").exists()  # the write had begun
    with RuleDB.open(db_path) as db:  # read-only open still recovers
        assert len(db) == 5
    assert not Path(str(db_path) + "-journal").exists()


def test_create_refuses_to_overwrite(db_path):
    with pytest.raises(RuleDBError, match="already exists"):
        RuleDB.create(db_path)
    with RuleDB.create(db_path, overwrite=True) as db:
        assert len(db) == 0


def test_read_only_refuses_writes(db_path):
    with RuleDB.open(db_path) as db, pytest.raises(RuleDBError, match="read-only"):
        db.add(_pairs())


def _foreign(tmp_path, kind):
    p = tmp_path / f"{kind}.db"
    if kind == "text":
        p.write_text("these are not the rules you are looking for\n" * 50)
    elif kind in ("sqlite", "format", "newer"):
        c = sqlite3.connect(p)
        if kind == "sqlite":
            c.execute("CREATE TABLE t (x)")
        else:
            c.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
            fmt, ver = ("other.thing", "1") if kind == "format" else ("superopt.rules", str(SCHEMA_VERSION + 1))
            c.executemany("INSERT INTO meta VALUES (?, ?)", [("format", fmt), ("schema_version", ver)])
        c.commit()
        c.close()
    return p


@pytest.mark.parametrize("kind,message", [("text", "not a SQLite file"), ("sqlite", "no meta table"),
                                          ("format", "not a superopt rule database"), ("newer", "newer")])
@pytest.mark.parametrize("writable", [False, True])
def test_foreign_or_newer_files_are_refused_untouched(tmp_path, kind, message, writable):
    p = _foreign(tmp_path, kind)
    before = p.read_bytes()
    with pytest.raises(RuleDBError, match=message):
        RuleDB.open(p, writable=writable)
    assert p.read_bytes() == before


def test_corrupt_file_is_refused_untouched(db_path):
    data = bytearray(db_path.read_bytes())
    page = 4096
    data[page:page + 512] = b"\xff" * 512  # garbage over the start of the second page
    db_path.write_bytes(bytes(data))
    with pytest.raises(RuleDBError, match="corrupt"):
        with RuleDB.open(db_path, writable=True) as db:
            db.add(_pairs())
    assert db_path.read_bytes() == bytes(data)


@pytest.mark.parametrize("table, column", [("meta", "value"), ("rules", "lhs"), ("rules", "text")])
def test_text_that_is_not_utf8_is_a_corrupt_database(db_path, capsys, table, column):
    """A flipped bit inside a text value: sqlite hands back bytes Python cannot decode."""
    import sqlite3
    conn = sqlite3.connect(db_path)
    where = " WHERE key = 'format'" if table == "meta" else ""
    conn.execute(f"UPDATE {table} SET {column} = CAST(X'7BA0' AS TEXT){where}")
    conn.commit()
    conn.close()
    for argv in (["rules", "list", "--db", str(db_path)], ["rules", "export", "--db", str(db_path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "corrupt" in err


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(RuleDBError, match="no such rule database"):
        RuleDB.open(tmp_path / "nope.db")
    assert main(["rules", "list", "--db", str(tmp_path / "nope.db")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such rule database" in err


# ---- the commands --------------------------------------------------------------------------------

def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_show_stats_text_and_json(db_path, capsys):
    db = str(db_path)
    code, out, _ = _run(capsys, "rules", "list", "--db", db, "--status", "proven", "--sort", "size")
    assert code == 0 and out.count("proven") == 4 and "unproven" not in out
    code, out, _ = _run(capsys, "rules", "list", "--db", db, "--op", "conv2d", "--json")
    assert [r["id"] for r in json.loads(out)] == [RULES["conv_fuse_kernels"].id]
    rid = RULES["matmul_split_merge"].id
    code, out, _ = _run(capsys, "rules", "show", rid[:8], "--db", db)
    assert code == 0 and "left side" in out and "right side" in out and "out 1: left" in out and "add_comm" in out
    code, out, _ = _run(capsys, "rules", "show", rid, "--db", db, "--json")
    doc = json.loads(out)
    assert doc["id"] == rid and len(doc["output_mapping"]) == 2 and Rule.from_json(doc).id == rid
    code, out, _ = _run(capsys, "rules", "stats", "--db", db)
    assert code == 0 and "proven 4" in out and "unproven 1" in out and "p90" in out
    code, out, _ = _run(capsys, "rules", "stats", "--db", db, "--json")
    st = json.loads(out)
    assert st["rules"] == 5 and st["by_status"] == {"proven": 4, "unproven": 1} and st["by_op"]["add"] >= 3
    assert st["proof_seconds"]["count"] == 5


def test_diff_and_export(db_path, tmp_path, capsys):
    other = tmp_path / "other.db"
    with RuleDB.create(other) as db:
        db.add(_pairs(("factor_common", "concat_grid", "conv_identity")))
    code, out, _ = _run(capsys, "rules", "diff", str(db_path), str(other), "--json")
    d = json.loads(out)
    assert code == 0 and d["common"] == 2 and len(d["only_a"]) == 3 and [r["id"] for r in d["only_b"]] == \
        [RULES["conv_identity"].id]
    code, out, _ = _run(capsys, "rules", "diff", str(db_path), str(other))
    assert out.count("\n< ") + out.startswith("< ") == 3 and "> " + RULES["conv_identity"].id in out
    code, out, _ = _run(capsys, "rules", "export", "--db", str(db_path), "--status", "proven")
    lines = [json.loads(x) for x in out.splitlines()]
    assert len(lines) == 4 and all(Rule.from_json(x).id == x["id"] for x in lines)
    target = tmp_path / "all.jsonl"
    code, out, _ = _run(capsys, "rules", "export", "--db", str(db_path), "-o", str(target), "--json")
    assert json.loads(out)["exported"] == 5 and len(target.read_text().splitlines()) == 5


def test_draw_writes_an_svg_of_both_sides(db_path, tmp_path, capsys):
    target = tmp_path / "rule.svg"
    rid = RULES["conv_fuse_kernels"].id
    code, out, _ = _run(capsys, "rules", "draw", rid, "--db", str(db_path), "-o", str(target), "--json")
    assert code == 0 and json.loads(out) == {"id": rid, "path": str(target)}
    root = ET.fromstring(target.read_text())
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert texts.count("conv2d") == 3 and "out 0" in texts and "left side (matched)" in texts


def test_command_errors_are_one_line(db_path, tmp_path, capsys):
    for argv in (["rules", "show", "0000000000000000", "--db", str(db_path)],
                 ["rules", "list", "--db", str(_foreign(tmp_path, "text"))],
                 ["rules", "draw", RULES["concat_grid"].id, "--db", str(db_path), "-o", str(tmp_path / "no" / "x.svg")],
                 ["verify", "--db", str(db_path), "--timeout", "0"]):
        code, _, err = _run(capsys, *argv)
        assert code == 2 and err.count("\n") == 1 and err.startswith("superopt: error:"), (argv, err)


def test_verify_command_reverifies_after_the_axioms_change(db_path, tmp_path, capsys):
    code, out, err = _run(capsys, "verify", "--db", str(db_path), "--workers", "1", "--json")
    rep = json.loads(out)
    assert code == 0 and rep["rules"] == 5 and rep["after"] == {"proven": 4, "unproven": 1} and not rep["refuted"]
    with RuleDB.open(db_path) as db:
        assert db.get(RULES["factor_common"].id).axioms_used == ("add_comm", "mul_add_distrib", "mul_comm")
        assert db.meta["last_verification"]["axioms"] > 40
    specs = tmp_path / "few.axioms"
    specs.write_text("axiom add_comm: add(x, y) == add(y, x)\naxiom mul_comm: mul(x, y) == mul(y, x)\n")
    code, out, err = _run(capsys, "verify", "--db", str(db_path), "--workers", "1", "--specs", str(specs))
    assert code == 0 and "changed status  4" in out  # (progress bars only on a terminal)
    with RuleDB.open(db_path) as db:
        assert [s.status for s in db.query()] == ["unproven"] * 5


def test_verify_command_exits_1_on_a_refuted_rule(tmp_path, capsys):
    path = tmp_path / "r.db"
    with RuleDB.create(path) as db:
        db.add([(RULES["wrong_relu_add"], UNPROVEN)])
    specs = tmp_path / "wrong.axioms"
    specs.write_text("axiom relu_add_wrong: relu(add(x, y)) == add(relu(x), relu(y))\n")
    code, out, err = _run(capsys, "verify", "--db", str(path), "--specs", str(specs), "--workers", "1")
    assert code == 1 and "REFUTED" in out and "REFUTED" in err
    with RuleDB.open(path) as db:
        assert db.query()[0].status == "refuted" and db.proven_rules() == []


def test_default_db_is_next_to_the_repo():
    from superopt.rules.cli import default_db_path
    assert default_db_path() == Path(__file__).resolve().parents[1] / "rules" / "default.db"
    assert os.path.basename(default_db_path()) == "default.db"


# ---- all ranks: stored, migrated, shown ----------------------------------------------------------

def test_all_ranks_is_stored_shown_and_counted(tmp_path, capsys):
    every = VerifyResult("proven", "unsat", 0.01, ("add_comm",), "passed", 0.0, True, ("x", "y"),
                         "all ranks: x, y lifted by 1..1 (bound 1) proven")
    per = VerifyResult("proven", "unsat", 0.01, ("a",), "passed", 0.0, False, (), "per instance: conv2d is fixed")
    path = tmp_path / "r.db"
    with RuleDB.create(path) as db:
        db.add([(RULES["factor_common"], every), (RULES["conv_fuse_kernels"], per),
                (RULES["wrong_add_mul"], UNPROVEN)])
        assert db.get(RULES["factor_common"].id).result == every
        db.update_results([(RULES["factor_common"].id, per)])
        assert not db.get(RULES["factor_common"].id).all_ranks
        db.update_results([(RULES["factor_common"].id, every)])
    code, out, _ = _run(capsys, "rules", "stats", "--db", str(path))
    assert code == 0 and "ranks:         1 of 2 proven for all ranks; per instance: conv2d is fixed 1" in out
    assert f"not proven:    {RULES['wrong_add_mul'].id}" in out and "why: sat: not implied" in out
    code, out, _ = _run(capsys, "rules", "list", "--db", str(path))
    assert [line.split()[5] for line in out.splitlines()[1:]] == ["all", "instance", "-"]
    code, out, _ = _run(capsys, "rules", "show", "--db", str(path), RULES["factor_common"].id)
    assert "ranks       all ranks: x, y lifted" in out


def test_a_schema_2_database_migrates_to_per_instance(tmp_path):
    from superopt.rules.db import migrate
    path = tmp_path / "v2.db"
    with RuleDB.create(path) as db:
        db.add(_pairs())
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("ALTER TABLE rules DROP COLUMN all_ranks; ALTER TABLE rules DROP COLUMN batch_inputs; "
                       "ALTER TABLE rules DROP COLUMN ranks; UPDATE meta SET value = '2' WHERE key = 'schema_version';")
    conn.close()
    with pytest.raises(RuleDBError, match="rules migrate"):
        RuleDB.open(path)
    assert migrate(path) == 2
    with RuleDB.open(path) as db:
        assert len(db) == 5 and not any(s.all_ranks for s in db.query())
        assert all(s.ranks.startswith("per instance") for s in db.query())
