"""The rule database (SQLite) and the ``superopt rules`` inspection commands.

The database files themselves live in the top-level ``rules/`` folder.
"""

from .db import FORMAT, ORDERS, SCHEMA_VERSION, RuleDB, RuleDBError, StoredRule

__all__ = ["RuleDB", "RuleDBError", "StoredRule", "SCHEMA_VERSION", "FORMAT", "ORDERS"]
