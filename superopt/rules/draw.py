"""A rule as a picture: both graphs side by side, as SVG written by hand (no graphviz needed).

Each side is drawn in layers: sources on top, every operator one row below its deepest input,
outputs at the bottom (``out 0``, ``out 1``, ... in the same order on both sides, which is the
rule's output mapping). Boxes show the operator, its non-default attributes and its type.

>>> from superopt.ir import GraphBuilder, Rule
>>> def side(f):
...     b = GraphBuilder(); x = b.input("x", (2, 3))
...     return b.build([f(b, x)])
>>> svg = rule_svg(Rule(side(lambda b, x: b.op("relu", b.op("relu", x))), side(lambda b, x: b.op("relu", x))))
>>> svg.startswith("<svg") and svg.count("<rect") == 6
True
"""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape

from ..ir.graph import Graph
from ..ir.printing import fmt_attrs
from ..ir.rule import Rule

__all__ = ["rule_svg"]

_ROW, _BOX_H, _GAP, _CHAR, _PAD = 78, 40, 24, 7.2, 12
_MARGIN, _TITLE, _HEAD_CHAR = 20, 44, 8.0


@dataclass
class _Box:
    node: int
    title: str
    detail: str
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0


def _layers(g: Graph) -> list[list[int]]:
    depth: dict[int, int] = {}
    for i, n in enumerate(g.nodes):
        depth[i] = 1 + max((depth[r.node] for r in n.inputs), default=-1)
    rows: list[list[int]] = [[] for _ in range(max(depth.values(), default=0) + 1)]
    for i, d in depth.items():
        rows[d].append(i)
    for k in range(1, len(rows)):  # order each row by where its inputs sit (fewer crossings)
        pos = {i: j for row in rows[:k] for j, i in enumerate(row)}
        rows[k].sort(key=lambda i: sum(pos.get(r.node, 0) for r in g.nodes[i].inputs) / max(1, len(g.nodes[i].inputs)))
    return rows


def _box(g: Graph, i: int) -> _Box:
    n = g.nodes[i]
    types = ", ".join(map(repr, n.types))
    if n.name is not None:
        return _Box(i, n.name + (" (weight)" if n.op == "weight" else ""), types)
    attrs = fmt_attrs(n.attrs, op=n.op)
    return _Box(i, n.op, (attrs[1:-1] + "  " if attrs else "") + types)


def _place(g: Graph, x0: float, y0: float) -> tuple[dict[int, _Box], float, float]:
    """Boxes with positions; the width and height the side takes."""
    rows = _layers(g)
    boxes = {i: _box(g, i) for row in rows for i in row}
    for b in boxes.values():
        b.w = max(len(b.title), len(b.detail)) * _CHAR + 2 * _PAD
    width = max(sum(boxes[i].w for i in row) + _GAP * (len(row) - 1) for row in rows)
    for k, row in enumerate(rows):
        x = x0 + (width - (sum(boxes[i].w for i in row) + _GAP * (len(row) - 1))) / 2
        for i in row:
            boxes[i].x, boxes[i].y = x, y0 + k * _ROW
            x += boxes[i].w + _GAP
    return boxes, width, len(rows) * _ROW + _ROW


def _side_svg(g: Graph, boxes: dict[int, _Box], label: str, x0: float, y0: float) -> list[str]:
    out = [f'<text x="{x0}" y="{y0 - 10}" class="side">{escape(label)}</text>']
    for i, b in boxes.items():
        n = g.nodes[i]
        cls = "src" if n.name is not None else "op"
        out.append(f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{_BOX_H}" rx="6" class="{cls}"/>')
        out.append(f'<text x="{b.x + b.w / 2:.1f}" y="{b.y + 16:.1f}" class="title">{escape(b.title)}</text>')
        out.append(f'<text x="{b.x + b.w / 2:.1f}" y="{b.y + 32:.1f}" class="detail">{escape(b.detail)}</text>')
        for pos, r in enumerate(n.inputs):  # arguments arrive left to right, in order
            src = boxes[r.node]
            out.append(_arrow(src.x + src.w / 2, src.y + _BOX_H, b.x + b.w * (pos + 1) / (len(n.inputs) + 1), b.y,
                              f".{r.index}" if len(g.nodes[r.node].types) > 1 else ""))
    bottom = max(b.y for b in boxes.values()) + _ROW
    seen: dict[int, int] = {}
    for k, r in enumerate(g.outputs):
        src = boxes[r.node]
        nth = seen[r.node] = seen.get(r.node, -1) + 1  # outputs of one box fan out
        cx = src.x + src.w / 2 + 48 * nth
        out.append(_arrow(src.x + src.w / 2, src.y + _BOX_H, cx, bottom - 14,
                          f".{r.index}" if len(g.nodes[r.node].types) > 1 else ""))
        out.append(f'<text x="{cx:.1f}" y="{bottom:.1f}" class="out">out {k}</text>')
    return out


def _arrow(x1, y1, x2, y2, label: str = "") -> str:
    line = f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" class="edge" marker-end="url(#arrow)"/>'
    if label:
        line += f'<text x="{(x1 + x2) / 2 + 4:.1f}" y="{(y1 + y2) / 2:.1f}" class="detail">{escape(label)}</text>'
    return line


_STYLE = """<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7"
 orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>
<style>
 text { font-family: monospace; text-anchor: middle; }
 .title { font-size: 13px; font-weight: bold; } .detail { font-size: 10px; fill: #444; }
 .side { font-size: 15px; font-weight: bold; text-anchor: start; } .head { font-size: 13px; text-anchor: start; }
 .out { font-size: 12px; fill: #a33; } .op { fill: #eef4ff; stroke: #36c; } .src { fill: #f4f4f4; stroke: #888; }
 .edge { stroke: #555; stroke-width: 1.2; } .sep { stroke: #bbb; stroke-dasharray: 4 4; }
</style>"""


def rule_svg(rule: Rule, title: str = "") -> str:
    """The SVG text of ``rule``: left side, then right side, with ``title`` on top."""
    y0 = _MARGIN + _TITLE
    left, lw, lh = _place(rule.lhs, _MARGIN, y0)
    x1 = _MARGIN + lw + 3 * _GAP
    right, rw, rh = _place(rule.rhs, x1, y0)
    title = title or rule.text()
    width, height = max(x1 + rw, len(title) * _HEAD_CHAR) + _MARGIN, y0 + max(lh, rh) + _MARGIN
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
             f'viewBox="0 0 {width:.0f} {height:.0f}">', _STYLE,
             f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="white"/>',
             f'<text x="{_MARGIN}" y="{_MARGIN + 4}" class="head">{escape(title)}</text>',
             f'<line x1="{x1 - 1.5 * _GAP:.1f}" y1="{y0}" x2="{x1 - 1.5 * _GAP:.1f}" y2="{height - _MARGIN}" class="sep"/>']
    parts += _side_svg(rule.lhs, left, "left side (matched)", _MARGIN, y0)
    parts += _side_svg(rule.rhs, right, "right side (replacement)", x1, y0)
    parts.append("</svg>")
    return "\n".join(parts)
