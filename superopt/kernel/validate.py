"""Checks a kernel program when it is built and infers the dims of every tile value.

A bad program raises :class:`KernelError` naming the statement and what to change.
"""

from __future__ import annotations

from .errors import KernelError
from .program import _ATTRS, _REQUIRED, BINARY, DTYPES, REDUCTIONS, UNARY

__all__ = ["validate", "broadcast_dims"]


def _subsequence(short, long_) -> bool:
    it = iter(long_)
    return all(d in it for d in short)


def broadcast_dims(a: tuple, b: tuple, order: tuple = ()) -> tuple | None:
    """The dims of an elementwise result: the longer operand's, if the other's are a subsequence;
    else (an outer product, ``mu[M] * c[N]``) the union of disjoint dims in declaration ``order``,
    if each operand's dims keep that order."""
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    if _subsequence(short, long_):
        return long_
    if set(a) & set(b) or not order:
        return None
    out = tuple(d for d in order if d in a or d in b)
    return out if _subsequence(a, out) and _subsequence(b, out) else None


def _fail(p, block, s, msg):
    from .textform import stmt_text
    raise KernelError(f"kernel {p.name}: {block} statement '{stmt_text(s)}': {msg}")


def validate(p) -> dict[str, tuple]:
    sizes = _check_header(p)
    tiles: dict[str, tuple] = {a.name: a.dims for a in p.accs}
    scope = set(tiles)
    updated: list[str] = []
    for block in ("pre", "body", "post"):
        local = set(scope)
        for s in getattr(p, block):
            dims = _check_stmt(p, block, s, tiles, local, sizes, updated)
            if s.out and s.op != "update":
                if s.out in tiles:
                    _fail(p, block, s, f"the name {s.out!r} is defined twice; every value needs its own name")
                tiles[s.out] = dims
                local.add(s.out)
        if block == "pre":
            scope = local
    want = sorted(a.name for a in p.accs)
    if sorted(updated) != want:
        raise KernelError(f"kernel {p.name}: accumulators {want} must each be updated exactly once in the body, "
                          f"got updates of {sorted(updated)}")
    for t in p.outputs:
        if not any(s.op == "store" and s.tensor == t.name for _, s in p.statements()):
            raise KernelError(f"kernel {p.name}: output {t.name!r} is never stored; add 'store {t.name}[...] value'")
    return tiles


def _check_header(p) -> dict[str, int]:
    sizes = {}
    for d, n in p.dims:
        if d in sizes or n < 1:
            raise KernelError(f"kernel {p.name}: dim {d!r} is declared twice or has size {n} < 1")
        sizes[d] = n
    for d, _ in p.grid:
        if d not in sizes:
            raise KernelError(f"kernel {p.name}: grid dim {d!r} is not declared; add 'dim {d} SIZE'")
    if p.loop is not None and (p.loop not in sizes or p.loop in dict(p.grid)):
        raise KernelError(f"kernel {p.name}: loop dim {p.loop!r} must be declared and not on the grid")
    if p.loop is None and (p.accs or p.body):
        raise KernelError(f"kernel {p.name}: accumulators and a body need a loop; add 'loop DIM'")
    names = [t.name for t in p.inputs + p.outputs]
    if len(set(names)) != len(names):
        raise KernelError(f"kernel {p.name}: tensor names {names} must be unique")
    for t in p.inputs + p.outputs:
        if t.dtype not in DTYPES.values():
            raise KernelError(f"kernel {p.name}: tensor {t.name!r} has dtype {t.dtype!r}; use one of {list(DTYPES)}")
    for a in p.accs:
        bad = [d for d in a.dims if d not in sizes or p.role(d) == "program"]
        if bad:
            raise KernelError(f"kernel {p.name}: accumulator {a.name!r} has dims {bad} that are not tile dims")
        if p.loop in a.dims and a.init != 0:
            raise KernelError(f"kernel {p.name}: accumulator {a.name!r} over the loop dim {p.loop!r} (a lane "
                              f"accumulator) must start at 0; after the loop only 'sum {a.name} dim={p.loop}' "
                              f"may read it")
    return sizes


def _operand_dims(p, block, s, a, tiles, scope):
    if not isinstance(a, str):
        return ()
    if a not in scope:
        where = " (a body value is not visible after the loop: accumulate it)" if a in tiles else ""
        _fail(p, block, s, f"uses {a!r} before it is defined{where}")
    return tiles[a]


def _check_attrs(p, block, s):
    allowed = _ATTRS.get(s.op, {})
    for k, v in s.attrs:
        if k not in allowed:
            _fail(p, block, s, f"{s.op} takes no attribute {k!r} (it takes: {', '.join(allowed) or 'none'})")
    for k in _REQUIRED.get(s.op, ()):
        if s.attr(k) is None:
            _fail(p, block, s, f"{s.op} needs attribute {k}=...")
    if s.op == "cast" and s.attr("dtype") not in DTYPES:
        _fail(p, block, s, f"cast to {s.attr('dtype')!r}; use one of {list(DTYPES)}")


def _check_stmt(p, block, s, tiles, scope, sizes, updated) -> tuple:
    _check_attrs(p, block, s)
    ins = [_operand_dims(p, block, s, a, tiles, scope) for a in s.args]
    lanes = {a.name for a in p.accs if p.loop in a.dims}
    if block != "body" and lanes.intersection(a for a in s.args if isinstance(a, str)) and \
            not (s.op == "sum" and s.attr("dim") == p.loop):
        _fail(p, block, s, f"a lane accumulator (over the loop dim {p.loop!r}) is read outside the loop only by "
                           f"'sum ACC dim={p.loop}'")
    if s.op in ("load", "store"):
        dims = _check_access(p, block, s, sizes)
        if s.op == "store":
            if len(s.args) != 1 or ins[0] != dims:
                _fail(p, block, s, f"stores a tile of dims {ins[0] if ins else '?'} into {list(dims)}; "
                                   f"they must match (use trans)")
            return ()
    elif s.op == "update":
        dims = _check_update(p, block, s, ins, updated)
    elif s.op in UNARY:
        dims = _check_unary(p, block, s, ins)
    elif s.op in BINARY:
        dims = _check_binary(p, block, s, ins)
    elif s.op in REDUCTIONS + ("causal",):
        dims = _check_reduce(p, block, s, ins)
    else:
        _fail(p, block, s, f"unknown operator {s.op!r}")
    if s.op not in ("store", "update") and not s.out:
        _fail(p, block, s, "the statement needs a result name: 'name = ...'")
    if p.loop in dims and block != "body":
        _fail(p, block, s, f"a tile over the loop dim {p.loop!r} exists only in the body")
    return dims


def _check_access(p, block, s, sizes):
    t = next((t for t in (p.inputs if s.op == "load" else p.outputs) if t.name == s.tensor), None)
    if t is None:
        kind = "input" if s.op == "load" else "output"
        _fail(p, block, s, f"{s.tensor!r} is not an {kind} of the kernel")
    if len(s.index) != len(t.shape):
        _fail(p, block, s, f"{t.name} has rank {len(t.shape)}, indexed with {len(s.index)} axes")
    dims = []
    for ax, n in zip(s.index, t.shape):
        top = ax.offset if ax.dim is None else (sizes.get(ax.dim, 0) - 1) // ax.div + ax.offset
        if ax.dim is not None and ax.dim not in sizes:
            _fail(p, block, s, f"index dim {ax.dim!r} is not declared")
        if ax.offset < 0 or ax.div < 1 or top >= n:
            _fail(p, block, s, f"index {ax.text()} reaches {top}, outside an axis of size {n}")
        if ax.dim is not None and p.role(ax.dim) != "program":
            if ax.div != 1:
                _fail(p, block, s, f"index {ax.text()}: only program dims (grid 'D:1') may be divided")
            dims.append(ax.dim)
    if len(set(dims)) != len(dims):
        _fail(p, block, s, f"a tile dim is used twice in {[a.text() for a in s.index]}")
    return tuple(dims)


def _check_update(p, block, s, ins, updated):
    if block != "body":
        _fail(p, block, s, "update is only allowed in the loop body")
    acc = next((a for a in p.accs if a.name == s.out), None)
    if acc is None or len(s.args) != 1:
        _fail(p, block, s, f"{s.out!r} is not an accumulator; declare it with 'acc {s.out}[dims] = init'")
    if ins[0] != acc.dims and broadcast_dims(ins[0], acc.dims) != acc.dims:
        _fail(p, block, s, f"the value has dims {list(ins[0])}, the accumulator {list(acc.dims)}")
    updated.append(s.out)
    return acc.dims


def _check_unary(p, block, s, ins):
    if len(s.args) != 1:
        _fail(p, block, s, f"{s.op} takes one operand")
    if s.op == "trans":
        if len(ins[0]) != 2:
            _fail(p, block, s, f"trans needs a 2-d tile, got dims {list(ins[0])}")
        return ins[0][::-1]
    return ins[0]


def _check_binary(p, block, s, ins):
    if len(s.args) != 2:
        _fail(p, block, s, f"{s.op} takes two operands")
    a, b = ins
    if s.op == "dot":
        if len(a) != 2 or len(b) != 2 or a[1] != b[0] or a[0] == b[1]:
            _fail(p, block, s, f"dot needs a[X,K] and b[K,Y], got {list(a)} and {list(b)}")
        return (a[0], b[1])
    out = broadcast_dims(a, b, tuple(d for d, _ in p.dims))
    if out is None:
        _fail(p, block, s, f"dims {list(a)} and {list(b)} do not broadcast (one must be a subsequence of the other)")
    return out


def _check_reduce(p, block, s, ins):
    if len(s.args) != 1:
        _fail(p, block, s, f"{s.op} takes one operand")
    if s.op == "causal":
        if s.attr("q") not in ins[0] or s.attr("k") not in ins[0]:
            _fail(p, block, s, f"causal q={s.attr('q')} k={s.attr('k')}: both must be dims of {list(ins[0])}")
        return ins[0]
    d = s.attr("dim")
    if d not in ins[0]:
        _fail(p, block, s, f"reduces over {d!r}, which is not a dim of {list(ins[0])}")
    return tuple(x for x in ins[0] if x != d)
