"""Rule databases as a class of input: every command that reads one takes ``--db``, and every
command that meets one another process is writing says it is locked (by whom, where it can tell)
and changes nothing."""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import superopt.rules.db as rules_db
from superopt.cli import build_parser, main
from superopt.rules.busy import holders

ROOT = Path(__file__).resolve().parents[1]
DB = ROOT / "rules" / "default.db"
RULE = "1f7aec11a98230b8"  # a rule of the shipped database

#: every command that reads a rule database (the parser walk below finds any new one)
READS_DB = {"rules list", "rules show", "rules stats", "rules diff", "rules export", "rules draw", "rules migrate",
            "verify", "optimize", "generate"}


def _leaves(parser: argparse.ArgumentParser, prefix: str = ""):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix.strip(), parser
    for action in subs:
        for name, p in action.choices.items():
            yield from _leaves(p, f"{prefix} {name}")


def _mentions_a_database(p: argparse.ArgumentParser) -> bool:
    texts = [p.description or ""] + [a.help or "" for a in p._actions]
    return any("rule database" in t or "rules database" in t for t in texts)


def test_every_command_that_reads_a_database_takes_db():
    leaves = dict(_leaves(build_parser()))
    assert READS_DB <= set(leaves)
    for name, p in leaves.items():
        has_db = any("--db" in a.option_strings for a in p._actions)
        if name in READS_DB or _mentions_a_database(p):
            assert has_db, f"`superopt {name}` reads a rule database but takes no --db"


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("superopt: error:"), err
    return err[0]


@pytest.fixture
def db_copy(tmp_path):
    p = tmp_path / "r.db"
    shutil.copy(DB, p)
    return p


def test_rules_diff_takes_db_or_two_databases(db_copy, tmp_path, capsys):
    other = tmp_path / "o.db"
    shutil.copy(DB, other)
    with sqlite3.connect(other) as c:
        c.execute("DELETE FROM rules WHERE id = ?", (RULE,))
    assert main(["rules", "diff", "--db", str(db_copy), str(other)]) == 0
    out = capsys.readouterr().out
    assert f"1 only in {db_copy}" in out and f"< {RULE}" in out
    assert main(["rules", "diff", str(other), str(db_copy)]) == 0
    assert f"> {RULE}" in capsys.readouterr().out
    assert main(["rules", "diff", str(other)]) == 0  # against the shipped database
    assert f"< {RULE}" in capsys.readouterr().out
    assert main(["rules", "diff", "--db", str(db_copy), str(other), str(other)]) == 2
    assert "give two" in _err(capsys)


def test_rules_draw_takes_the_reversed_ids_a_report_prints(tmp_path, capsys):
    out = tmp_path / "r.svg"
    assert main(["rules", "draw", f"{RULE}~", "-o", str(out)]) == 0
    assert f"rule {RULE}~" in capsys.readouterr().out and out.read_text().startswith("<svg")


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


LOCKED_ARGV = [
    ["rules", "list", "--limit", "1"], ["rules", "show", RULE], ["rules", "stats"], ["rules", "export", "--limit", "1"],
    ["rules", "draw", RULE, "-o", "{tmp}/r.svg"], ["rules", "migrate"], ["rules", "diff", str(DB)],
    ["verify"], ["optimize", "--zoo", "squeezenet1_1", "-o", "{tmp}/s.pt2"],
    ["generate", "--max-ops", "1", "--ops", "relu", "--inputs", "x=2x3", "--workers", "1", "--quiet", "--overwrite"],
]


@pytest.mark.parametrize("argv", LOCKED_ARGV, ids=lambda a: " ".join(a[:2]))
def test_a_command_meeting_a_database_being_written_says_it_is_locked(argv, db_copy, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rules_db, "BUSY_TIMEOUT_S", 0.05)
    writer = sqlite3.connect(db_copy, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute("INSERT INTO meta VALUES ('probe', 'x')")  # a write under way: its journal is there
    before = _digest(db_copy)
    try:
        assert main([a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--db", str(db_copy)]) == 2
        msg = _err(capsys)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert "is locked" in msg and "try again when it finishes" in msg
    assert "not a superopt rule database" not in msg and "could not be rolled back" not in msg and "corrupt" not in msg
    assert _digest(db_copy) == before and db_copy.exists()


def test_the_lock_message_names_the_process_that_holds_it(db_copy, monkeypatch, capsys):
    monkeypatch.setattr(rules_db, "BUSY_TIMEOUT_S", 0.05)
    code = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('BEGIN EXCLUSIVE'); c.execute(\"INSERT INTO meta VALUES ('probe', 'x')\"); "
            "print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(db_copy)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert any(h.startswith(f"pid {proc.pid}: ") for h in holders(db_copy))
        assert main(["rules", "migrate", "--db", str(db_copy)]) == 2
        msg = _err(capsys)
    finally:
        proc.kill()
        proc.wait()
    assert f"locked by pid {proc.pid}: " in msg and "(or stop it)" in msg
    assert holders(db_copy) == []  # nobody else has it open now
    assert main(["rules", "migrate", "--db", str(db_copy)]) == 0  # the killed writer's journal is rolled back
    assert "already schema" in capsys.readouterr().out


def test_migrate_still_names_a_file_that_is_no_rule_database(tmp_path, capsys):
    p = tmp_path / "x.db"
    with sqlite3.connect(p) as c:
        c.execute("CREATE TABLE t (a)")
    assert main(["rules", "migrate", "--db", str(p)]) == 2
    assert "not a superopt rule database" in _err(capsys)
