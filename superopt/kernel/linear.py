"""The translator for matmul regions: norm -> matmul(s) -> epilogue, in one kernel.

The kernel's grid tiles the output rows M and columns N; its loop walks the contracted dim K.
Values over [M, K] (the input rows and what the norm does to them) live in the loop body, one
K tile at a time; row reductions over K (a norm's sum of squares) are accumulated there; the
matmul accumulates ``dot`` tiles; everything over [M, N] (bias, activation, gate·up, residual)
is the epilogue after the loop. The moves that make one kernel of it:

* **row scale out of the matmul** (``mul_rowscale_matmul``): ``matmul(x·r, W) = matmul(x, W)·r`` for
  a row vector r, so RMSNorm's 1/rms, known only after the loop, scales the accumulator;
* **norm weight into the next weight** (``matmul_mul_rows``): ``matmul(x·g, W) =
  matmul(x, g[:,None]·W)``, a weight-only product folded at compile time (a :class:`Prep`);
* **several matmuls of one input in one loop** (gate and up: two accumulators, one read of x).

A region with a LayerNorm over N after the matmul (the residual add and the next norm in the
epilogue: :func:`row_owning`) gets a **row-owning** program: a grid over M alone, N one tile
padded to a power of two, so the post-block sees whole rows and computes the norm's mean and
variance there (:meth:`_Translator.row_layernorm`; sums over N never count the padding).

Options (``LinearOptions``) say which moves to use; a combination that leaves a value the loop
cannot compute (a row scale applied inside the loop, where only its partial sum exists) is
pruned on its abstract expression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from ..ir.graph import Graph, Ref
from .build import ProgramBuilder, Pruned, target_set, term
from .moves import (colsum_graph, fold_graph, fold_rule, merge_preps, rows_rule, rows_shift_rule, rowvec_matmul_graph,
                    swap_rule)
from .program import DTYPES
from .verify import Identity, Prep

__all__ = ["LinearOptions", "LinearShape", "linear_shape", "translate_linear", "graph_terms", "row_owning", "UNARY_OPS"]

UNARY_OPS = ("relu", "sigmoid", "tanh", "gelu", "silu", "gelu_tanh", "neg", "rsqrt", "exp", "pow")
BINARY_OPS = ("add", "mul", "sub", "div", "smul")
TRANSPARENT = ("reshape", "cast")
REDUCE_OPS = ("mean", "sum")
#: a row reduction over K is kept as per-lane sums through the loop (a lane accumulator,
#: :func:`~superopt.kernel.triton_lower.lane_accumulators`) when K is a multiple of this, the
#: smallest loop block: an iteration then adds element-wise, and the one cross-lane sum runs
#: after the loop (a sum per iteration stalled the weight stream: RMSNorm -> 4096x4096 took
#: 23.8 us against 13.9 for the bare linear on an H100)
LANE_BLOCK = 16
_SHORT = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class LinearOptions:
    commute: bool = True      # move row scales out of the matmul (else: pruned when a norm needs it)
    fold: bool = True         # fold norm weights into the next weight at compile time
    low_dot: bool = True      # dot in the weights' dtype (bf16 tensor cores) rather than float32

    def text(self) -> str:
        return f"commute={int(self.commute)} fold={int(self.fold)} low_dot={int(self.low_dot)}"


@dataclass(frozen=True)
class LinearShape:
    m: int
    k: int
    n: int
    matmuls: tuple[int, ...]


def _axis_last(node, rank) -> bool:
    a = node.attr.get("axis", node.attr.get("axes", node.attr.get("dim", -1)))
    if isinstance(a, tuple):
        if len(a) != 1:
            return False
        a = a[0]
    return a in (-1, rank - 1)


def linear_shape(region: Graph) -> LinearShape | None:
    """M, K, N of a matmul region: its matmuls by a [K, N] source (N > 1) sharing K and N."""
    mm = []
    for i, n in enumerate(region.nodes):
        if n.op != "matmul":
            continue
        w = region.nodes[n.inputs[1].node]
        wt, xt = region.type_of(n.inputs[1]), region.type_of(n.inputs[0])
        if w.op in ("input", "weight") and wt.rank == 2 and wt.shape[1] > 1:
            mm.append((i, xt.numel // xt.shape[-1], wt.shape[0], wt.shape[1]))
    if not mm or len(mm) > 2 or len({(k, n) for _, _, k, n in mm}) != 1 or len({m for _, m, _, _ in mm}) != 1:
        return None
    return LinearShape(mm[0][1], mm[0][2], mm[0][3], tuple(i for i, *_ in mm))


def graph_terms(region: Graph, shape: LinearShape) -> dict[Ref, str]:
    """The abstract expression of every value of the region (the same spelling as the kernel's)."""
    out: dict[Ref, str] = {}
    for i, n in enumerate(region.nodes):
        r = Ref(i, 0)
        if n.name is not None:
            out[r] = n.name
            continue
        a = [out.get(x, "?") for x in n.inputs]
        if n.op in TRANSPARENT:
            out[r] = a[0]
        elif n.op == "mean":
            out[r] = term("mul", term("sum", a[0]), Fraction(1, region.type_of(n.inputs[0]).shape[-1]))
        elif n.op == "matmul" and region.type_of(n.inputs[1]).shape[-1] == 1:
            out[r] = term("sum", term("mul", a[0], a[1]))
        elif n.op == "pow":
            out[r] = term("pow", a[0], n.attr["exponent"])
        elif n.op == "smul":
            out[r] = term("mul", *a)
        else:
            out[r] = term(n.op, *a)
    return out


@dataclass
class _Val:
    space: str               # src, row, red, out, pre
    name: str = ""           # the statement (or source) name
    t: str = ""              # abstract expression
    kf: tuple = ()           # deferred norm-weight factors (source names)
    rs: tuple = ()           # deferred row scales (_Val of space red)
    dtype: str = "float32"
    ct: str = ""             # the term of the statement ``name`` itself (t without kf and rs)
    center: tuple = ()       # deferred row means to subtract (_Val of space red): LayerNorm
    kb: tuple = ()           # deferred [K] addends after the weights (a norm bias: source names)

    def __post_init__(self):
        self.ct = self.ct or self.t


@dataclass
class _Translator:
    region: Graph
    shape: LinearShape
    opt: LinearOptions
    b: ProgramBuilder
    identities: list = field(default_factory=list)
    preps: list = field(default_factory=list)

    # ---- sources ----------------------------------------------------------------------------
    def src_load(self, v: _Val, space: str) -> _Val:
        n = self.region.nodes[self.region.by_name[v.name]]
        tt = n.types[0]
        s = self.shape
        plan = {"row": ("body", (s.m, s.k), ("M", "K")), "kvec": ("body", (s.k,), ("K",)),
                "kcol": ("body", (s.k,), ("K",)), "out": ("post", (s.m, s.n), ("M", "N")),
                "nvec": ("post", (s.n,), ("N",)), "pre": ("pre", (1,), ("0",)), "wmat": ("body", (s.k, s.n), ("K", "N"))}
        block, shp, idx = plan[space]
        if tt.numel != math.prod(shp) or (space in ("row", "out", "wmat") and tt.shape[-1] != shp[-1]):
            raise Pruned(f"source {v.name} {tt!r} cannot be read as {space} {list(shp)}")
        name = self.b.load(block, v.name, tt.dtype, shp, idx, v.name)
        return _Val({"kvec": "row", "kcol": "row", "nvec": "out", "wmat": "w"}.get(space, space), name, v.name,
                    dtype=tt.dtype)

    def coerce(self, v: _Val, partner: _Val | None) -> _Val:
        if v.space != "src":
            return v
        tt = self.region.nodes[self.region.by_name[v.name]].types[0]
        s = self.shape
        if tt.numel == 1:
            return self.src_load(v, "pre")
        want = partner.space if partner is not None and partner.space != "src" else "row"
        fits_row = tt.shape == (s.k,) or (tt.numel == s.m * s.k and tt.shape[-1] == s.k)
        if want in ("row", "red", "pre") and fits_row:
            return self.src_load(v, "kvec" if tt.shape == (s.k,) else "row")
        return self.src_load(v, "nvec" if tt.shape == (s.n,) else "out")

    # ---- materializing a row value in the body ------------------------------------------------
    def body_value(self, v: _Val) -> _Val:
        if v.rs or v.center or v.kb:
            raise Pruned(f"{v.t} needs a row scale inside the loop")
        name, t = v.name, v.ct
        for g in v.kf:
            gl = self.src_load(_Val("src", g, g), "kvec")
            name, t = self.b.emit("body", "mul", (name, gl.name), (), term("mul", t, g)), term("mul", t, g)
        return _Val("row", name, t)

    # ---- operators ----------------------------------------------------------------------------
    def unary(self, op, attrs, a: _Val) -> _Val:
        a = self.coerce(a, None)
        extra = ((("exponent", attrs["exponent"]),) if op == "pow" else ())
        t = term(op, a.t, attrs["exponent"]) if op == "pow" else term(op, a.t)
        if a.space == "row":
            a = self.body_value(a)
            return _Val("row", self.b.emit("body", op, (a.name,), extra, t), t)
        block = "pre" if a.space == "pre" else "post"
        return _Val(a.space, self.b.emit(block, op, (a.name,), extra, t), t)

    def binary(self, op, a: _Val, b: _Val) -> _Val:
        op = "mul" if op == "smul" else op
        if op == "mul" and self.opt.fold:
            for x, y in ((a, b), (b, a)):
                if self.is_norm_weight(y) and self.coerce(x, None).space == "row":
                    x = self.coerce(x, None)
                    if x.kb:
                        raise Pruned("a norm weight after a norm bias")
                    return _Val("row", x.name, term("mul", x.t, y.name), x.kf + (y.name,), x.rs, ct=x.ct,
                                center=x.center)
        if op == "add":
            for x, y in ((a, b), (b, a)):
                if x.space == "row" and (x.rs or x.center) and self.is_norm_weight(y):
                    return _Val("row", x.name, term("add", x.t, y.name), x.kf, x.rs, ct=x.ct, center=x.center,
                                kb=x.kb + (y.name,))
        a, b = self.coerce(a, b), self.coerce(b, a)
        t = term(op, a.t, b.t)
        if a.space == "red" and b.space == "row" and op == "mul":
            a, b = b, a
        if op == "mul" and a.space == "row" and b.space == "row" and (a.rs or b.rs):
            return self.swap_scales(a, b)
        if a.space == "row" and b.space == "red" and op == "mul":
            if self.opt.commute and not a.kb:
                return _Val("row", a.name, t, a.kf, a.rs + (b,), ct=a.ct, center=a.center)
            a = self.body_value(a)   # the scale inside the loop: only its partial sum exists there
            self.b.check(term("mul", a.t, f"partial({b.t})"), "a row scale inside the loop")
            raise Pruned("a row scale inside the loop")
        spaces = {a.space, b.space}
        if "row" in spaces:
            if spaces - {"row", "pre"}:
                raise Pruned(f"{op} of a [M,K] value and a {(spaces - {'row'}).pop()} value")
            x, y = (self.body_value(v) if v.space == "row" else v for v in (a, b))
            return _Val("row", self.b.emit("body", op, (x.name, y.name), (), t), t)
        space = "out" if "out" in spaces else "red" if "red" in spaces else "pre"
        return _Val(space, self.b.emit("pre" if space == "pre" else "post", op, (a.name, b.name), (), t), t)

    def swap_scales(self, a: _Val, b: _Val) -> _Val:
        """(x·r)·y = (x·y)·r: deferred row scales wait past an elementwise product."""
        if a.center or b.center or a.kb or b.kb:
            raise Pruned("a centred or shifted row times another row")
        x = self.body_value(_Val("row", a.name, a.ct, a.kf))
        y = self.body_value(_Val("row", b.name, b.ct, b.kf))
        ct = term("mul", x.t, y.t)
        self.b.target |= target_set([ct])
        self.identities.append(Identity("mul_rows_swap: a row scale commutes with an elementwise product",
                                        swap_rule(self.shape.m, self.shape.k)))
        return _Val("row", self.b.emit("body", "mul", (x.name, y.name), (), ct), term("mul", a.t, b.t),
                    (), a.rs + b.rs, ct=ct)

    def is_norm_weight(self, v: _Val) -> bool:
        i = self.region.by_name.get(v.name) if v.space == "src" else None
        return i is not None and self.region.nodes[i].op == "weight" and \
            self.region.nodes[i].types[0].shape == (self.shape.k,)

    def reduce(self, node, a: _Val, mean: bool, kcol: _Val | None = None) -> _Val:
        a = self.body_value(self.coerce(a, None))
        if a.space != "row" or node is not None and not _axis_last(node, self.region.type_of(node.inputs[0]).rank):
            raise Pruned("a reduction that is not over the contracted dim")
        x, t = a.name, a.t
        if kcol is not None:
            kc = self.src_load(kcol, "kcol")
            t = term("mul", t, kc.t)
            x = self.b.emit("body", "mul", (x, kc.name), (), t)
        full = term("sum", t)
        if self.shape.k % LANE_BLOCK == 0:  # lane sums in the loop, one row sum after it
            acc = self.b.acc(self.b.fresh("r"), ("M", "K"))
            self.b.update(acc, self.b.emit("body", "add", (acc, x), (), f"partial({full})"))
            acc = self.b.emit("post", "sum", (acc,), (("dim", "K"),), full)
        else:  # a row sum per loop tile
            part = self.b.emit("body", "sum", (x,), (("dim", "K"),), f"partial({full})")
            acc = self.b.acc(self.b.fresh("r"), ("M",))
            self.b.update(acc, self.b.emit("body", "add", (acc, part)))
        if mean:
            full = term("mul", full, Fraction(1, self.shape.k))
            name = self.b.emit("post", "mul", (acc, Fraction(1, self.shape.k)), (), full)
        else:
            name = acc
        return _Val("red", name, full)

    def matmul(self, a: _Val, w: _Val) -> _Val:
        a = self.coerce(a, None)
        if a.space != "row":
            raise Pruned("a matmul of a value outside the loop (a second matmul needs a second loop)")
        wname, wt = (self.fold(a.kf, w.name), term("mul", w.name, *a.kf)) if a.kf else (w.name, w.name)
        core = self.body_value(_Val("row", a.name, a.ct, ()))
        wdt = self.region.nodes[self.region.by_name[w.name]].types[0].dtype
        wl = self.b.load("body", wname, wdt, (self.shape.k, self.shape.n), ("K", "N"), wt)
        x = core.name
        if self.opt.low_dot and wdt != "float32":
            x = self.b.emit("body", "cast", (x,), (("dtype", _SHORT[wdt]),), core.t)
        mt = term("matmul", core.t, wt)
        d = self.b.emit("body", "dot", (x, wl), (), f"partial({mt})")
        acc = self.b.acc(self.b.fresh("o"), ("M", "N"))
        self.b.update(acc, self.b.emit("body", "add", (acc, d)))
        self.b.target |= target_set([mt])
        name, t = self.epilogue(a, w.name, wname, wt, acc, mt)
        self.b.rewrite(t, term("matmul", a.t, w.name))
        return _Val("out", name, t)

    def post_value(self, tensor: str, graph: Graph, t: str) -> str:
        """A compile-time [N] vector (a prep output) loaded after the loop."""
        if tensor not in [n for n, _ in self.preps]:
            self.preps.append((tensor, graph))
        self.b.target.add(t)
        return self.b.load("post", tensor, "float32", (self.shape.n,), ("N",), t)

    def epilogue(self, a: _Val, w: str, wname: str, wt: str, name: str, t: str):
        """What the deferred operations of the matmul's input become after the loop:
        (x - mu)·W' = x·W' - mu ⊗ colsum(W'); row scales; a norm bias beta gives beta·W."""
        k, n = self.shape.k, self.shape.n
        for mu in a.center:
            self.identities.append(Identity("matmul_add_rows: a row shift moves out of the matmul",
                                            rows_shift_rule(self.shape.m, k, n)))
            ct = term("colsum", wt)
            c1 = self.post_value(f"{wname}__colsum", colsum_graph(self.region, a.kf, w, k, n), ct)
            outer = term("mul", mu.t, ct)
            t2 = term("sub", t, outer)
            self.b.target |= target_set([t2])
            name, t = self.b.emit("post", "sub", (name, self.b.emit("post", "mul", (mu.name, c1), (), outer)), (), t2), t2
        for r in a.rs:
            self.identity_rows(None, r)
            t = term("mul", t, r.t)
            self.b.target |= target_set([t])
            name = self.b.emit("post", "mul", (name, r.name), (), t)
        for beta in a.kb:
            bt = term("matmul", beta, w)
            c2 = self.post_value(f"{beta}__at__{w}", rowvec_matmul_graph(self.region, beta, w, k, n), bt)
            t = term("add", t, bt)
            self.b.target |= target_set([t])
            name = self.b.emit("post", "add", (name, c2), (), t)
        return name, t

    def fold(self, gs: tuple, w: str) -> str:
        """The compile-time product g[:,None]·W (a weight-only subgraph) and its identity."""
        name = f"{w}__x__{'_'.join(gs)}"
        if name not in [n for n, _ in self.preps]:
            self.preps.append((name, fold_graph(self.region, gs, w, self.shape.k)))
        for g in gs:
            gi = self.region.nodes[self.region.by_name[g]].types[0]
            self.identities.append(Identity("matmul_mul_rows: a norm weight folds into the next weight",
                                            fold_rule(self.shape.m, self.shape.k, self.shape.n, gi.dtype)))
        self.b.target.add(term("mul", w, *gs))
        return name

    def row_layernorm(self, node, y: _Val) -> _Val:
        """LayerNorm over N of an epilogue value: the program owns whole rows (grid over M, N
        one tile), so after the loop the row's mean μ = Σy/N, the centred c = y - μ, the
        variance Σc²/N and c·rsqrt(var + eps): the operator's own definition, as every
        semantics evaluates it (no identity needed). Sums over N never count the padding of N."""
        if node.attr.get("ndim", 1) != 1:
            raise Pruned("layernorm over more than the last axis")
        if self.b.grid != [("M", True)]:
            raise Pruned("a LayerNorm over the output rows needs a grid over M alone")
        n, eps = self.shape.n, node.attr["eps"]
        inv = Fraction(1, n)
        mean_t = term("mul", term("sum", y.t), inv)
        c_t = term("sub", y.t, mean_t)
        var_t = term("mul", term("sum", term("mul", c_t, c_t)), inv)
        r_t = term("rsqrt", var_t, eps)
        self.b.target |= target_set([self.b.original(term("mul", c_t, r_t))])   # LayerNorm's definition, expanded
        emit, dim_n, sq_t = self.b.emit, (("dim", "N"),), term("mul", c_t, c_t)
        mean = emit("post", "mul", (emit("post", "sum", (y.name,), dim_n, term("sum", y.t)), inv), (), mean_t)
        c = emit("post", "sub", (y.name, mean), (), c_t)
        var = emit("post", "mul", (emit("post", "sum", (emit("post", "mul", (c, c), (), sq_t),), dim_n,
                                        term("sum", sq_t)), inv), (), var_t)
        r = emit("post", "rsqrt", (var,), (("eps", float(eps)),), r_t)
        return _Val("out", emit("post", "mul", (c, r), (), term("mul", c_t, r_t)), term("layernorm", y.t))

    def layernorm(self, node, a: _Val) -> _Val:
        """LayerNorm over K in the loop: sums of x and x², mean and variance after it
        (Σ(x-μ)²/K = Σx²/K - μ², exact in any field), the centering and 1/σ deferred.
        A LayerNorm of an epilogue value (over N) is :meth:`row_layernorm`."""
        if a.space == "out":
            return self.row_layernorm(node, a)
        a = self.body_value(self.coerce(a, None))
        if node.attr.get("ndim", 1) != 1:
            raise Pruned("layernorm over more than the last axis")
        inv, sq_t = Fraction(1, self.shape.k), term("mul", a.t, a.t)
        mean_t, ex2_t = term("mul", term("sum", a.t), inv), term("mul", term("sum", sq_t), inv)
        mu2 = term("mul", mean_t, mean_t)
        var = term("sub", ex2_t, mu2)
        rt = term("rsqrt", var, node.attr["eps"])
        self.b.target |= target_set([rt])   # LayerNorm's definition, expanded
        if not self.opt.commute:   # 1/σ and the mean exist only after the loop
            self.b.check(term("mul", a.t, f"partial({rt})"), "a row scale inside the loop")
        s1 = self.reduce(None, a, True)
        s2 = self.reduce(None, _Val("row", self.b.emit("body", "mul", (a.name, a.name), (), sq_t), sq_t), True)
        v = self.b.emit("post", "sub", (s2.name, self.b.emit("post", "mul", (s1.name, s1.name), (), mu2)), (), var)
        r = _Val("red", self.b.emit("post", "rsqrt", (v,), (("eps", float(node.attr["eps"])),), rt), rt)
        return _Val("row", a.name, term("layernorm", a.t), (), (r,), ct=a.ct, center=(s1,))

    def identity_rows(self, x_t, r):
        self.identities.append(Identity("mul_rowscale_matmul: a row scale moves out of the matmul",
                                        rows_rule(self.shape.m, self.shape.k, self.shape.n)))


def translate_linear(region: Graph, shape: LinearShape, opt: LinearOptions, name: str = "linear"):
    """(program, identities, prep) for one option set, or raises :class:`Pruned`."""
    terms = graph_terms(region, shape)
    b = ProgramBuilder(name, target_set(terms[r] for r in region.outputs))
    b.target |= target_set(terms.values())
    b.dim("M", shape.m), b.dim("K", shape.k), b.dim("N", shape.n)
    b.grid, b.loop = ([("M", True)] if row_owning(region, shape) else [("M", True), ("N", True)]), "K"
    tr = _Translator(region, shape, opt, b)
    vals: dict[Ref, _Val] = {}
    for i, n in enumerate(region.nodes):
        vals[Ref(i, 0)] = _node(tr, region, n, [vals[r] for r in n.inputs], shape)
    for k, r in enumerate(region.outputs):
        v = vals[r]
        if v.space == "src":
            raise Pruned("an output that is a source")
        if v.space != "out":
            raise Pruned(f"output {k} is not over [M, N] (it is a {v.space} value)")
        b.check(v.t, f"output {k}")
        dt = region.type_of(r).dtype
        b.store("post", f"out{k}", dt, (shape.m, shape.n), ("M", "N"), v.name)
    prep = None
    if tr.preps:
        pg = merge_preps(region, tr.preps)
        prep = Prep(pg, tuple(n for n, _ in tr.preps))
    return b.build(), tuple(_dedup(tr.identities)), prep


def row_owning(region: Graph, shape: LinearShape) -> bool:
    """Whether ``region`` normalizes the matmul's output rows (a LayerNorm over N after the
    matmul): its program then owns whole rows, a grid over M alone with N one (padded) tile."""
    after: set[int] = set(shape.matmuls)
    for i, n in enumerate(region.nodes):
        if any(r.node in after for r in n.inputs):
            after.add(i)
            if n.op == "layernorm" and region.type_of(n.inputs[0]).shape[-1] == shape.n:
                return True
    return False


def _node(tr: _Translator, region: Graph, n, ins: list, shape: LinearShape) -> _Val:
    if n.name is not None:
        return _Val("src", n.name, n.name, dtype=n.types[0].dtype)
    if n.op in TRANSPARENT:
        return ins[0]
    if n.op in UNARY_OPS:
        return tr.unary(n.op, n.attr, ins[0])
    if n.op in BINARY_OPS:
        return tr.binary(n.op, ins[0], ins[1])
    if n.op in REDUCE_OPS:
        return tr.reduce(n, ins[0], n.op == "mean")
    if n.op == "layernorm":
        return tr.layernorm(n, ins[0])
    if n.op == "matmul":
        wt = region.type_of(n.inputs[1])
        if ins[1].space == "src" and wt.rank == 2 and wt.shape[1] == 1 and wt.shape[0] == shape.k:
            return tr.reduce(n, ins[0], False, kcol=ins[1])
        if ins[1].space == "src" and wt.shape == (shape.k, shape.n):
            return tr.matmul(ins[0], ins[1])
    raise Pruned(f"operator {n.op} has no kernel translation in a matmul region")


def _dedup(idents):
    seen, out = set(), []
    for i in idents:
        if i.rule.id not in seen:
            seen.add(i.rule.id)
            out.append(i)
    return out
