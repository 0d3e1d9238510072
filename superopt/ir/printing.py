"""Text views of a graph: one line per node (``to_text``) and one line per graph (``to_expr``).

>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder(); x = b.input("x", (2, 4)); w = b.weight("w", (4, 4))
>>> g = b.build([b.op("relu", b.op("matmul", x, w))])
>>> print(to_expr(g))
relu(matmul(x, w))
"""

from __future__ import annotations

from .graph import Graph, Ref
from .ops import REQUIRED

__all__ = ["to_text", "to_expr", "fmt_attrs", "value_name"]


def _fmt(v):
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt(x) for x in v) + ")"
    return repr(v) if isinstance(v, str) else str(v)


def fmt_attrs(attrs, skip=("out_types",), op: str | None = None) -> str:
    """``{k=v, ...}``; with ``op`` given, attributes at their declared default are left out."""
    defaults = {}
    if op is not None:
        from .ops import get_op
        defaults = {a.name: a.normalize(a.default) for a in get_op(op).attrs
                    if a.default is not None and not isinstance(a.default, object.__class__) and a.default is not REQUIRED}
    shown = [f"{k}={_fmt(v)}" for k, v in attrs if k not in skip and not (k in defaults and defaults[k] == v)]
    return "{" + ", ".join(shown) + "}" if shown else ""


def value_name(g: Graph, r: Ref) -> str:
    """How ``to_text`` names a value: a source's name, ``%i``, or ``%i.k`` for multi-output nodes."""
    n = g.nodes[r.node]
    if n.name is not None:
        return n.name
    return f"%{r.node}" + (f".{r.index}" if len(n.types) > 1 else "")


def to_text(g: Graph) -> str:
    """One line per node, readable by people; inputs and weights head the listing."""
    srcs = ", ".join(f"{n.name}: {n.types[0]!r}{' weight' if n.op == 'weight' else ''}"
                     for n in g.nodes if n.name is not None)
    lines = [f"graph({srcs}) {{"]
    for i, n in enumerate(g.nodes):
        if n.name is not None:
            continue
        lhs = f"%{i}" + (f":{len(n.types)}" if len(n.types) > 1 else "")
        args = ", ".join(value_name(g, r) for r in n.inputs)
        attrs = fmt_attrs(n.attrs, op=n.op)
        tys = ", ".join(map(repr, n.types))
        lines.append(f"  {lhs} = {n.op}({args}){' ' + attrs if attrs else ''} : {tys}")
    lines.append("  return " + ", ".join(value_name(g, r) for r in g.outputs))
    lines.append("}")
    return "\n".join(lines)


def to_expr(g: Graph, attrs: bool = True) -> str:
    """The graph as nested calls on one line; a value used twice is written once as a ``let``."""
    uses: dict[int, int] = {}
    for n in g.nodes:
        for r in n.inputs:
            uses[r.node] = uses.get(r.node, 0) + 1
    for r in g.outputs:
        uses[r.node] = uses.get(r.node, 0) + 1
    lets: list[str] = []
    named: dict[int, str] = {}

    def expr(r: Ref) -> str:
        n = g.nodes[r.node]
        if n.name is not None:
            return n.name
        if r.node in named:
            base = named[r.node]
        else:
            a = fmt_attrs(n.attrs, op=n.op) if attrs else ""
            base = f"{n.op}{a and '[' + a[1:-1] + ']'}(" + ", ".join(expr(x) for x in n.inputs) + ")"
            if uses.get(r.node, 0) > 1 or len(n.types) > 1:
                name = f"t{len(lets)}"
                lets.append(f"{name} = {base}")
                named[r.node] = base = name
        return base + (f".{r.index}" if len(n.types) > 1 else "")

    outs = ", ".join(expr(r) for r in g.outputs)
    return "; ".join(lets + [outs])
