"""``superopt ir``: look at graphs — a small demo, and checking or printing a graph file."""

from __future__ import annotations

import numpy as np

from .graph import GraphBuilder
from .hashing import structural_hash
from .printing import to_expr, to_text
from .serialize import load_graph

__all__ = ["register", "demo_graph"]


def register(sub) -> None:
    p = sub.add_parser("ir", help="the graph IR: a demo, or check/print a graph JSON file")
    ss = p.add_subparsers(dest="ir_command", metavar="ACTION", required=True)
    d = ss.add_parser("demo", help="build a small graph and show its three semantics agree")
    d.add_argument("--json", action="store_true", help="print the demo's results as one JSON document")
    d.set_defaults(func=_demo)
    c = ss.add_parser("check", help="load a graph JSON file, check it and print it")
    c.add_argument("file")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_check)


def demo_graph():
    """relu(conv(x, w1)) and conv(x, w2) on one image, concatenated: the shape of a TASO rule."""
    b = GraphBuilder()
    x = b.input("x", (1, 4, 8, 8))
    w1, w2 = b.weight("w1", (4, 4, 3, 3)), b.weight("w2", (4, 4, 3, 3))
    y1 = b.op("relu", b.op("conv2d", x, w1, padding=(1, 1)))
    y2 = b.op("conv2d", x, w2, padding=(1, 1))
    return b.build([b.op("concat", y1, y2, axis=1)])


def _demo(args) -> int:
    from ..semantics import Field, evaluate, random_inputs
    from ..semantics.torch_lowering import run
    g = demo_graph()
    rng = np.random.default_rng(0)
    env = random_inputs(g, rng)
    ref = evaluate(g, env)[0]
    got = run(g, env, dtype=__import__("torch").float64)[0].numpy()
    f = Field(seed=0)
    fp = f.evaluate(g, f.random_inputs(g, rng))[0]
    doc = {"graph": to_text(g), "expression": to_expr(g), "structural_hash": structural_hash(g),
           "reference_vs_torch_max_abs_difference": float(np.max(np.abs(ref - got))),
           "fingerprint_size": int(fp.size), "fingerprint_first": fp.ravel()[:4].tolist()}
    if args.json:
        from ..cliargs import print_json
        print_json(doc)
        return 0
    print(doc["graph"])
    print("one line:", doc["expression"])
    print("structural hash:", doc["structural_hash"])
    print(f"reference (float64 numpy) vs torch lowering: max abs difference "
          f"{doc['reference_vs_torch_max_abs_difference']:.2e}")
    print(f"fingerprint (GF(2^31-1)): {fp.size} field elements, first {doc['fingerprint_first']}")
    return 0


def _check(args) -> int:
    from ..cliargs import print_json
    g = load_graph(args.file)
    g.check()
    if args.json:
        print_json({"nodes": len(g.nodes), "outputs": len(g.outputs), "structural_hash": structural_hash(g)})
    else:
        print(to_text(g))
    return 0
