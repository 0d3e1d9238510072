"""The translator for attention regions: ``sdpa`` (scale, causal, grouped-query heads).

Moves (``AttentionOptions``):

* **online softmax** (flash attention): the loop walks the keys S; a running max m, a running
  sum l and the output accumulator are rescaled by exp(m_old - m_new) each tile, and the
  division by l happens once after the loop (the row scale 1/l moves out of p·v: the identity
  ``mul_rowscale_matmul``). Without it, the whole key axis is one tile (only for short S);
* **GQA packing**: the G query heads that share one key/value head are the rows of one program,
  so each key/value tile is read once per group rather than once per query head (queries of
  different heads cannot share a causal mask, so causal packing is pruned unless L = 1);
* **query norm prologue** (where the region holds a per-head RMSNorm of the queries, Qwen3's
  ``q_norm``: :mod:`superopt.kernel.headnorm`): the query rows are normalized before the loop,
  their sum of squares from the loads the prologue makes anyway (two half-width ones under a
  rotary prologue), the weight's halves read beside them;
* **rotary prologue** (where the region holds the queries' rotary embedding,
  :mod:`superopt.kernel.rotary`): the rotated queries are computed before the loop from two
  half-width loads of q and the cos/sin tables, and the scores are the sum of two half-width
  dots (the head dim D of the program is half the head dim: loads at ``D`` and ``D+h``).

Abstract expressions: the scores ``matmul(q,trans(k))``, ``exp`` of them, their row sum and
``matmul(exp, v)`` are subexpressions of sdpa's definition; a max is a ``shift`` (a value the
result does not depend on; see :mod:`superopt.kernel.semantics`), and ``x - shift`` is ``x``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import Graph, GraphBuilder
from ..ir.rule import Rule
from .build import ProgramBuilder, Pruned, frac, target_set, term
from .headnorm import identities as norm_identities, match_head_norm
from .program import DTYPES
from .rotary import identities as rotary_identities, match_rotary
from .verify import Identity

__all__ = ["AttentionOptions", "AttentionShape", "attention_shape", "translate_attention", "MAX_FULL_KEYS"]

MAX_FULL_KEYS = 256
_SHORT = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class AttentionOptions:
    online: bool = True
    pack: bool = False

    def text(self) -> str:
        return f"online={int(self.online)} pack_gqa={int(self.pack)}"


@dataclass(frozen=True)
class AttentionShape:
    b: int
    h: int
    kvh: int
    l: int
    s: int
    d: int
    e: int
    scale: float
    causal: bool
    names: tuple[str, str, str]
    dtypes: tuple[str, str, str, str]
    mask: str | None = None            # an additive mask source, broadcast to the scores
    mask_shape: tuple[int, ...] = ()
    mask_dtype: str = "float32"
    rotary: "RotaryTables | None" = None   # the queries' rotary embedding, in the region
    qnorm: "QueryNorm | None" = None        # a per-head RMSNorm of the queries, in the region

    @property
    def group(self) -> int:
        return self.h // self.kvh


@dataclass(frozen=True)
class RotaryTables:
    """The cos and sin sources of a rotary prologue: names, shapes (broadcast to q from the
    right, the last axis the head dim) and dtypes."""

    cos: str
    sin: str
    cos_shape: tuple[int, ...]
    sin_shape: tuple[int, ...]
    cos_dtype: str
    sin_dtype: str
    minus: str             # rotate_half's -1 (a one-element weight: the compiled program bakes it)
    minus_dtype: str


@dataclass(frozen=True)
class QueryNorm:
    """A per-head RMSNorm of the queries in the region (:mod:`superopt.kernel.headnorm`): the
    names and dtypes of its weight [d] and its epsilon (a one-element weight); ``transposed``:
    the source is [B, L, H, D] (the norm before the heads moved to axis 1)."""

    weight: str
    weight_dtype: str
    eps: str
    eps_dtype: str
    transposed: bool


#: layout operators a key/value head repetition is written with (repeat_kv's expand + reshape,
#: repeat_interleave, or split + concat)
REPEAT_OPS = ("reshape", "expand", "repeat_interleave", "concat", "split", "unsqueeze")


def _unrepeat(region: Graph, ref):
    """The source under a chain of layout operators (a key/value head repetition), or None."""
    seen = 0
    node = region.nodes[ref.node]
    while node.name is None:
        if node.op not in REPEAT_OPS or seen > 8:
            return None
        srcs = {r.node for r in node.inputs}
        if len(srcs) != 1:
            return None
        node, seen = region.nodes[srcs.pop()], seen + 1
    return node


def attention_shape(region: Graph) -> AttentionShape | None:
    """The shape of a region that is one sdpa over q [..,H,L,D] and k/v [..,KVH,S,*] sources
    (k/v possibly repeated to H heads by layout operators: grouped-query attention, head h
    reading key/value head h // G; the verifier checks that reading)."""
    sd = [n for n in region.nodes if n.op == "sdpa"]
    if len(sd) != 1 or len(sd[0].inputs) not in (3, 4) or len(region.outputs) != 1:
        return None
    n = sd[0]
    mask = region.nodes[n.inputs[3].node] if len(n.inputs) == 4 else None
    if mask is not None and mask.name is None:
        return None
    if region.nodes[region.outputs[0].node] is not n:
        return None
    rot, tables = _rotary_sources(region, n.inputs[0])
    q_ref = rot.q if rot else n.inputs[0]
    norm, qnorm = _norm_source(region, q_ref)
    if rot and norm is None and region.nodes[rot.q.node].op not in ("input", "weight"):
        return None
    if norm is not None:
        first = region.nodes[norm.source.node]
    else:
        first = region.nodes[rot.q.node] if rot else _unrepeat(region, n.inputs[0])
    srcs = [first] + [_unrepeat(region, r) for r in n.inputs[1:3]]
    if any(s is None for s in srcs) or (rot is None and norm is None and region.nodes[n.inputs[0].node] is not srcs[0]):
        return None
    q, k, v = region.type_of(q_ref), srcs[1].types[0], srcs[2].types[0]   # q: the queries the sdpa reads
    qdtype = srcs[0].types[0].dtype
    if q.rank < 3 or not q.rank == k.rank == v.rank or k.shape[-2] != region.type_of(n.inputs[1]).shape[-2]:
        return None
    inside = (rot.nodes if rot else frozenset()) | (norm.nodes | norm.casts if norm else frozenset())
    layout = {i for i, m in enumerate(region.nodes) if m.name is None and m is not n and i not in inside}
    mtype = mask.types[0] if mask is not None else None
    if any(region.nodes[i].op not in REPEAT_OPS for i in layout):
        return None
    h, kvh = q.shape[-3], k.shape[-3]
    if kvh < 1 or h % kvh or v.shape[-3] != kvh or q.shape[:-3] != k.shape[:-3]:
        return None
    b = q.numel // (h * q.shape[-2] * q.shape[-1])
    out = region.type_of(region.outputs[0])
    return AttentionShape(b, h, kvh, q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], float(n.attr["scale"]),
                          bool(n.attr.get("causal", 0)), tuple(s.name for s in srcs),
                          (qdtype, k.dtype, v.dtype, out.dtype), mask and mask.name,
                          mtype.shape if mtype else (), mtype.dtype if mtype else "float32", tables, qnorm)


def _norm_source(region: Graph, ref):
    """``(match, QueryNorm)`` of a per-head RMSNorm over a region source computing the queries
    ``ref``, else ``(None, None)``."""
    if region.nodes[ref.node].op in ("input", "weight"):
        return None, None
    m = match_head_norm(region, ref)
    if m is None or m.source.index or region.nodes[m.source.node].op != "input":
        return None, None
    (w, wt), (e, et) = ((region.nodes[r.node].name, region.type_of(r)) for r in (m.weight, m.eps))
    return m, QueryNorm(w, wt.dtype, e, et.dtype, m.transposed)


def _rotary_sources(region: Graph, ref):
    """``(match, tables)`` of a rotary embedding over region sources computing the queries
    ``ref``, else ``(None, None)``."""
    rot = match_rotary(region, ref)
    if rot is None or rot.q.index or any(region.nodes[r.node].op not in ("input", "weight")
                                         for r in (rot.cos, rot.sin)):
        return None, None
    (c, ct), (s, st), (m, mt) = ((region.nodes[r.node].name, region.type_of(r)) for r in (rot.cos, rot.sin, rot.minus))
    return rot, RotaryTables(c, s, ct.shape, st.shape, ct.dtype, st.dtype, m, mt.dtype)


def _rows_rule(l, s, e) -> Rule:
    l, s, e = (min(d, 8) for d in (l, s, e))   # an axiom over every shape: a small instance

    def side(commuted):
        b = GraphBuilder()
        x, u, w = b.input("x", (l, s)), b.input("u", (l, 1)), b.input("w", (s, e))
        return b.build([b.op("mul", b.op("matmul", x, w), u) if commuted else b.op("matmul", b.op("mul", x, u), w)])
    return Rule(side(False), side(True))


def _targets(qn, kn, vn, causal, mask=None) -> tuple[set, dict]:
    sc = term("matmul", qn, term("trans", kn))
    if causal:
        sc = term("causal", sc)
    if mask:
        sc = term("add", sc, mask)
    e = term("exp", sc)
    den = term("sum", e)
    t = {"scores": sc, "exp": e, "den": den, "pv": term("matmul", e, vn),
         "out": term("div", term("matmul", e, vn), den), "def": term("matmul", term("div", e, den), vn)}
    return target_set(t.values()), t


def translate_attention(region: Graph, sh: AttentionShape, opt: AttentionOptions, name: str = "attention"):
    """(program, identities, prep=None) for one option set, or raises :class:`Pruned`."""
    if opt.pack and sh.causal and sh.l > 1:
        raise Pruned("causal queries of different heads cannot share one tile (pack_gqa with L > 1)")
    if not opt.online and sh.s > MAX_FULL_KEYS:
        raise Pruned(f"the whole key axis ({sh.s}) in one tile is larger than {MAX_FULL_KEYS}")
    qn, kn, vn = sh.names
    if sh.qnorm and sh.qnorm.transposed and sh.l > 1 and opt.pack:
        raise Pruned("rows packed from several heads cannot read queries laid out [B, L, H, D]")
    qt = _normed(sh) if sh.qnorm else qn
    qe = _rotated(sh, qt) if sh.rotary else qt
    target, t = _targets(qe, kn, vn, sh.causal, sh.mask)
    b = ProgramBuilder(name, target)
    g = sh.group
    rows = sh.l * g if opt.pack else sh.l
    b.dim("B", sh.b), b.dim("H", sh.kvh if opt.pack else sh.h), b.dim("L", rows)
    b.dim("S", sh.s), b.dim("D", sh.d // 2 if sh.rotary else sh.d), b.dim("E", sh.e)
    b.grid = [("B", False), ("H", False), ("L", True)]
    head = "H" if opt.pack or g == 1 else f"H/{g}"
    qh = sh.kvh if opt.pack else sh.h
    block = "body" if opt.online else "pre"
    if opt.online:
        b.loop = "S"
    scores = term("matmul", qe, term("trans", kn))
    vshape, vi = (sh.b, sh.kvh, sh.s, sh.e), ("B", head, "S", "E")
    if sh.rotary:
        s = _rotary_scores(b, sh, opt, (sh.b, qh, rows, sh.d), head, block, scores)
        v = b.load(block, vn, sh.dtypes[2], vshape, vi, vn)
    else:
        q = _queries(b, sh, (sh.b, qh, rows, sh.d), ("",))[0]
        k = b.load(block, kn, sh.dtypes[1], (sh.b, sh.kvh, sh.s, sh.d), ("B", head, "S", "D"), kn)
        v = b.load(block, vn, sh.dtypes[2], vshape, vi, vn)
        kt = b.emit(block, "trans", (k,), (), term("trans", kn))
        s = b.emit(block, "dot", (q, kt), (), t["scores"] if not sh.causal else scores)
    if sh.causal:
        s = b.emit(block, "causal", (s,), (("k", "S"), ("q", "L")), t["scores"])
    if sh.mask:
        m = b.load(block if _mask_index(sh, opt)[-1] == "S" else "pre", sh.mask, sh.mask_dtype, sh.mask_shape,
                   _mask_index(sh, opt), sh.mask)
        s = b.emit(block, "addmask", (s, m), (("scale", sh.scale),), t["scores"])
    if opt.online:
        out = _online(b, sh, s, v, t)
    else:
        out = _full(b, sh, s, v, t)
    b.store("post", "out0", sh.dtypes[3], (sh.b, qh, rows, sh.e), ("B", "H", "L", "E"), out)
    ident = (Identity("mul_rowscale_matmul: the softmax's 1/sum moves out of p·v", _rows_rule(sh.l, sh.s, sh.e)),)
    ident += rotary_identities() if sh.rotary else ()
    return b.build(), ident + (norm_identities() if sh.rotary and sh.qnorm else ()), None


def _normed(sh: AttentionShape) -> str:
    """The abstract expression of the normalized queries, x·rsqrt(Σx²/d + eps)·w."""
    x = sh.names[0]
    r = term("rsqrt", term("add", term("mul", term("sum", term("pow", x, 2.0)), frac(sh.d)), sh.qnorm.eps))
    return term("mul", term("mul", x, r), sh.qnorm.weight)


def _queries(b: ProgramBuilder, sh: AttentionShape, qshape: tuple, parts: tuple) -> list[str]:
    """The query tiles of the prologue: the whole head dim (``parts`` ``("",)``) or its two
    halves (``("lo", "hi")``), loaded from q, or from the source of a per-head norm and
    normalized (the sum of squares over all the parts, so the halves share one row scale)."""
    qn, h = sh.names[0], sh.d // 2
    at = {"": "D", "lo": "D", "hi": f"D+{h}"}
    part = (lambda p, x: term(p, x) if p else x)
    n = sh.qnorm
    if n is None:
        return [b.load("pre", qn, sh.dtypes[0], qshape, ("B", "H", "L", at[p]), part(p, qn)) for p in parts]
    if n.transposed and sh.l > 1:
        shape, index = (sh.b, sh.l, sh.h, sh.d), ("B", "L", "H")
    else:
        shape, index = qshape, ("B", "H", "L")
    sq_t = [term("sum", term("pow", part(p, qn), 2.0)) for p in parts]
    ss_t = sq_t[0] if len(parts) == 1 else term("add", *sq_t)
    mean_t = term("mul", ss_t, frac(sh.d))
    r_t = term("rsqrt", term("add", mean_t, n.eps))
    if len(parts) > 1:   # the kernel's spelling of each half of the normalized queries
        for p in parts:
            b.rewrite(term("mul", term("mul", part(p, qn), r_t), part(p, n.weight)), part(p, _normed(sh)))
    xs = [b.load("pre", qn, sh.dtypes[0], shape, index + (at[p],), part(p, qn)) for p in parts]
    ws = [b.load("pre", n.weight, n.weight_dtype, (sh.d,), (at[p],), part(p, n.weight)) for p in parts]
    sq = [b.emit("pre", "sum", (b.emit("pre", "pow", (x,), (("exponent", 2.0),), term("pow", part(p, qn), 2.0)),),
                 (("dim", "D"),), t) for x, p, t in zip(xs, parts, sq_t)]
    ss = sq[0] if len(sq) == 1 else b.emit("pre", "add", tuple(sq), (), ss_t)
    eps = b.load("pre", n.eps, n.eps_dtype, (1,), ("0",), n.eps)
    mean = b.emit("pre", "mul", (ss, frac(sh.d)), (), mean_t)
    r = b.emit("pre", "rsqrt", (b.emit("pre", "add", (mean, eps), (), term("add", mean_t, n.eps)),), (), r_t)
    out = []
    for x, w, p in zip(xs, ws, parts):
        xr = b.emit("pre", "mul", (x, r), (), term("mul", part(p, qn), r_t))
        out.append(b.emit("pre", "mul", (xr, w), (), term("mul", term("mul", part(p, qn), r_t), part(p, n.weight))))
    return out


def _rotated(sh: AttentionShape, qn: str) -> str:
    """The abstract expression of the rotated queries ``qn``, q·cos + concat(-q_hi, q_lo)·sin."""
    r = sh.rotary
    return term("add", term("mul", qn, r.cos),
                term("mul", term("concat", term("mul", term("hi", qn), r.minus), term("lo", qn)), r.sin))


def _rotary_scores(b: ProgramBuilder, sh: AttentionShape, opt: AttentionOptions, qshape: tuple, head: str,
                   block: str, scores: str) -> str:
    """The scores of rotated queries (see the module docstring): the rotation in the prologue
    over half-width loads, then two half-width dots per key tile."""
    qn, kn, _ = sh.names
    qn = _normed(sh) if sh.qnorm else qn
    r, h = sh.rotary, sh.d // 2
    lo, hi = (lambda x: term("lo", x)), (lambda x: term("hi", x))
    neg_t = term("mul", hi(qn), r.minus)
    rlo = term("add", term("mul", lo(qn), lo(r.cos)), term("mul", neg_t, lo(r.sin)))
    rhi = term("add", term("mul", hi(qn), hi(r.cos)), term("mul", lo(qn), hi(r.sin)))
    halves = term("add", term("matmul", rlo, term("trans", lo(kn))), term("matmul", rhi, term("trans", hi(kn))))
    b.rewrite(halves, scores)

    def load(block_, name, dtype, shape, index, part):
        at = ("D", f"D+{h}")[part == "hi"]
        return b.load(block_, name, dtype, shape, index[:-1] + (at,), term(part, name))

    q_lo, q_hi = _queries(b, sh, qshape, ("lo", "hi"))
    tab = {}
    for name, shape, dtype in ((r.cos, r.cos_shape, r.cos_dtype), (r.sin, r.sin_shape, r.sin_dtype)):
        index = _table_index(sh, opt, shape)
        tab[name] = [load("pre", name, dtype, shape, index, p) for p in ("lo", "hi")]
    (c_lo, c_hi), (s_lo, s_hi) = tab[r.cos], tab[r.sin]
    minus = b.load("pre", r.minus, r.minus_dtype, (1,), ("0",), r.minus)   # a scalar, as linear.py reads one
    neg = b.emit("pre", "mul", (q_hi, minus), (), neg_t)
    r_lo = b.emit("pre", "add", (b.emit("pre", "mul", (q_lo, c_lo), (), term("mul", lo(qn), lo(r.cos))),
                                 b.emit("pre", "mul", (neg, s_lo), (), term("mul", neg_t, lo(r.sin)))),
                  (), rlo)
    r_hi = b.emit("pre", "add", (b.emit("pre", "mul", (q_hi, c_hi), (), term("mul", hi(qn), hi(r.cos))),
                                 b.emit("pre", "mul", (q_lo, s_hi), (), term("mul", lo(qn), hi(r.sin)))),
                  (), rhi)
    if sh.dtypes[0] != "float32":   # the dot's operands in q's dtype, as the reference rounds them
        r_lo, r_hi = (b.emit("pre", "cast", (x,), (("dtype", _SHORT[sh.dtypes[0]]),), tx)
                      for x, tx in ((r_lo, rlo), (r_hi, rhi)))
    kshape, ki = (sh.b, sh.kvh, sh.s, sh.d), ("B", head, "S", "D")
    dots = []
    for rq, part, tq in ((r_lo, "lo", rlo), (r_hi, "hi", rhi)):
        k = load(block, kn, sh.dtypes[1], kshape, ki, part)
        kt = b.emit(block, "trans", (k,), (), term("trans", term(part, kn)))
        dots.append(b.emit(block, "dot", (rq, kt), (), term("matmul", tq, term("trans", term(part, kn)))))
    return b.emit(block, "add", tuple(dots), (), halves)


def _table_index(sh: AttentionShape, opt: AttentionOptions, shape: tuple) -> tuple:
    """A rotary table's index over the queries [B, H, L, D] (aligned from the right; an axis of
    size 1 read at 0; the last axis is the head dim, replaced by the caller)."""
    names = ("B", "H", "L", "D")[-len(shape):] if len(shape) <= 4 else None
    sizes = {"B": sh.b, "H": sh.h, "L": sh.l, "D": sh.d}
    if names is None:
        raise Pruned(f"a rotary table of shape {list(shape)} over queries [{sh.b}, {sh.h}, {sh.l}, {sh.d}]")
    out = []
    for d, n in zip(names, shape):
        if d == "D" or n == 1:
            out.append("D" if d == "D" else "0")
        elif n != sizes[d]:
            raise Pruned(f"a rotary table axis of {n} over a query axis of {sizes[d]}")
        elif opt.pack and d in ("H", "L"):
            raise Pruned("rows packed from several heads cannot share a rotary table over heads or queries")
        else:
            out.append(d)
    return tuple(out)


def _mask_index(sh: AttentionShape, opt: AttentionOptions) -> tuple:
    """The mask's index, its axes aligned to the scores [B, H, L, S] from the right; an axis of
    size 1 is read at 0. Rows packed from several heads cannot share a mask over L or H."""
    names = ("B", "H", "L", "S")[-len(sh.mask_shape):] if len(sh.mask_shape) <= 4 else None
    sizes = {"B": sh.b, "H": sh.h, "L": sh.l, "S": sh.s}
    if names is None or (len(sh.mask_shape) == 4 and sh.b != sh.mask_shape[0] and sh.mask_shape[0] != 1):
        raise Pruned(f"a mask of shape {list(sh.mask_shape)} over scores [{sh.b}, {sh.h}, {sh.l}, {sh.s}]")
    out = []
    for d, n in zip(names, sh.mask_shape):
        if n == 1:
            out.append("0")
        elif n == sizes[d]:
            if opt.pack and d in ("H", "L") and n > 1:
                raise Pruned("rows packed from several heads cannot share a mask over heads or queries")
            out.append(d)
        else:
            raise Pruned(f"a mask axis of {n} over a scores axis of {sizes[d]}")
    return tuple(out)


def _exp_args(sh):
    return (("scale", sh.scale),) if sh.scale != 1.0 else ()


def _cast_p(b, block, p, sh, t):
    if sh.dtypes[2] != "float32":
        return b.emit(block, "cast", (p,), (("dtype", _SHORT[sh.dtypes[2]]),), t)
    return p


def _online(b: ProgramBuilder, sh, s, v, t) -> str:
    # the running max starts at -1e30, not -inf: a key tile masked whole (-inf) then gives
    # exp(-inf - (-1e30)) = 0 rather than exp(-inf + inf) = NaN
    m, l, o = b.acc("m", ("L",), -1e30), b.acc("l", ("L",)), b.acc("o", ("L", "E"))
    mx = b.emit("body", "max", (s,), (("dim", "S"),), "shift")
    mn = b.emit("body", "maximum", (m, mx), (), "shift")
    p = b.emit("body", "exp", (b.emit("body", "sub", (s, mn), (), t["scores"]),), _exp_args(sh), t["exp"])
    alpha = b.emit("body", "exp", (b.emit("body", "sub", (m, mn), (), "shift"),), _exp_args(sh), "shift")
    ps = b.emit("body", "sum", (p,), (("dim", "S"),), f"partial({t['den']})")
    l2 = b.emit("body", "add", (b.emit("body", "mul", (l, alpha)), ps))
    pv = b.emit("body", "dot", (_cast_p(b, "body", p, sh, t["exp"]), v), (), f"partial({t['pv']})")
    o2 = b.emit("body", "add", (b.emit("body", "mul", (o, alpha)), pv))
    b.update(m, mn), b.update(l, l2), b.update(o, o2)
    return b.emit("post", "div", (o, l), (), t["out"])


def _full(b: ProgramBuilder, sh, s, v, t) -> str:
    mx = b.emit("pre", "max", (s,), (("dim", "S"),), "shift")
    p = b.emit("pre", "exp", (b.emit("pre", "sub", (s, mx), (), t["scores"]),), _exp_args(sh), t["exp"])
    den = b.emit("pre", "sum", (p,), (("dim", "S"),), t["den"])
    pv = b.emit("pre", "dot", (_cast_p(b, "pre", p, sh, t["exp"]), v), (), t["pv"])
    return b.emit("post", "div", (pv, den), (), t["out"])
