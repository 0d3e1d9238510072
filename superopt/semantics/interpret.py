"""One interpreter for every semantics: walk the nodes, look each operator up in a table.

A table maps an operator name to ``fn(attrs, *inputs)`` returning one value or a tuple (for
several outputs). Sources are read from ``env`` by name, weights falling back to the graph's
own data.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import SuperoptError
from ..ir.graph import Graph

__all__ = ["interpret", "SemanticsError"]


class SemanticsError(SuperoptError):
    """A graph cannot be evaluated under a semantics (missing input, operator not defined there)."""


def interpret(g: Graph, env: Mapping[str, Any], table: Mapping[str, Callable], what: str,
              convert: Callable[[Any], Any] = lambda v: v) -> list:
    """Evaluate ``g``; returns the output values in order.

    ``convert`` turns weight data from the graph into the semantics' value type.
    """
    vals: list[tuple] = []
    for i, n in enumerate(g.nodes):
        if n.name is not None:
            if n.name in env:
                v = env[n.name]
            elif n.op == "weight" and n.name in g.data:
                v = convert(g.data[n.name])
            else:
                raise SemanticsError(f"{what}: no value given for {n.op} {n.name!r}")
            vals.append((v,))
            continue
        fn = table.get(n.op)
        if fn is None:
            raise SemanticsError(f"{what}: operator {n.op!r} (node %{i}) has no {what} semantics")
        try:
            out = fn(n.attr, *(vals[r.node][r.index] for r in n.inputs))
        except SuperoptError:
            raise
        except Exception as e:
            raise RuntimeError(f"{what}: while evaluating node %{i} ({n.op}): {e}") from e
        vals.append(out if isinstance(out, tuple) else (out,))
    return [vals[r.node][r.index] for r in g.outputs]
