"""One enumeration step, run by the workers: every child of a batch of parent graphs.

A *compact graph* is a tuple of nodes ``(op, attrs, inputs)``; inputs are value ids: ``0..S-1``
are the input tensors, then each node's outputs in node order. A graph's outputs are the values
no node uses. Every node has a Merkle hash (operator, attributes and its inputs' hashes, sorted
for commutative operators; inputs hashed by name) and every value a *value hash*: its exact
fingerprint (``Settings.fingerprint_seeds`` field evaluations) and shape. The graph's
fingerprint hashes its outputs' value hashes sorted, so it does not depend on output order.

No graph is built twice: a child is kept only when its new node is the *canonical last* node of
the child, the sink (a node nobody uses) with the largest Merkle hash, and the new node is not a
copy of a node already there. Removing that node gives back the parent, so each graph has one
parent and is reached once (canonical augmentation). Values are computed from the parent's
values, one operator per child, and cached by Merkle hash, so a node shared by many graphs is
evaluated once per worker.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from ..semantics import Field
from .fastfield import fast_table
from .opsets import MAX_INPUTS, Instance, OpTable
from .settings import Settings

__all__ = ["RECORD", "MAX_ARITY", "Expander", "Unpacked", "ChunkResult", "expand_chunk", "h64", "value_hash",
           "source_merkle"]

MAX_ARITY = MAX_INPUTS
_MASK = (1 << 64) - 1
_MEMO_LIMIT = 400_000

#: one row per child graph: how it was built, its new node, and its fingerprint
RECORD = np.dtype([("parent", "<i8"), ("inst", "<u8"), ("ins", "<i2", (MAX_ARITY,)), ("merkle", "<u8"),
                   ("size", "<i1"), ("vh", "<u8", (2,)), ("fp", "<u8"), ("key", "<u8"), ("nout", "<i1"),
                   ("nsinks", "<i1")])


def h64(*ints: int) -> int:
    """A 64-bit hash of integers, never 0 (0 means 'none' in the records).

    CPython's tuple hash (deterministic for integers in every process and run: hash
    randomization only touches strings and bytes; the checkpoint records the Python version)
    followed by MurmurHash3's 64-bit finalizer. The finalizer matters: the tuple hash alone is
    nearly linear, so sums of node hashes (a graph's key) collided for different graphs.
    """
    z = hash(ints) & _MASK
    z = ((z ^ (z >> 33)) * 0xFF51AFD7ED558CCD) & _MASK
    z = ((z ^ (z >> 33)) * 0xC4CEB9FE1A85EC53) & _MASK
    return (z ^ (z >> 33)) or 1


def source_merkle(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"input:{name}".encode(), digest_size=8).digest(), "little") or 1


def value_hash(shape: tuple, vals) -> int:
    """Hash of one value: its shape and its field values under every seed."""
    h = hashlib.blake2b(repr(tuple(shape)).encode(), digest_size=8)
    for v in vals:
        h.update(np.ascontiguousarray(v, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little") or 1


@dataclass
class Unpacked:
    """A parent graph unpacked: per value its kind, hashes, values and component; per node its
    Merkle hash, users and cone (the nodes it depends on, as a bit set)."""

    nodes: tuple
    vkind: list
    vm: list
    vals: list
    vh: list
    vnode: list
    vw: list
    comp: list
    merkle: list = field(default_factory=list)
    users: list = field(default_factory=list)
    cones: list = field(default_factory=list)
    key: int = 0
    n_comps: int = 0

    def join(self, j: int, ins) -> None:
        """Node ``j`` joins the components of its inputs (inputs sharing a tensor are linked)."""
        old = {self.comp[v] for v in ins if self.comp[v] >= 0}
        for v, c in enumerate(self.comp):
            if c in old:
                self.comp[v] = j
        for v in ins:
            self.comp[v] = j
        self.n_comps += 1 - len(old)

    def finish(self, n_src: int) -> None:
        """Derived views the child loop reads: unused values, sinks by Merkle hash, kinds."""
        used = {v for _, _, ins in self.nodes for v in ins}
        self.unused = {v for v in range(n_src, len(self.vkind)) if v not in used}
        self.sinks = sorted(((self.merkle[j], j) for j, u in enumerate(self.users) if u == 0), reverse=True)
        self.mset = set(self.merkle)
        self.by_kind: dict = {}
        self.node_by_kind: dict = {}
        for v, k in enumerate(self.vkind):
            self.by_kind.setdefault(k, []).append(v)
            if v >= n_src:
                self.node_by_kind.setdefault(k, []).append(v)


@dataclass
class ChunkResult:
    """What a worker sends back for one chunk of parents."""

    level: int
    chunk: int
    records: np.ndarray
    instances: dict
    tried: int
    seconds: float


class Expander:
    """Per-process state of the enumeration for one :class:`Settings` (see the module docstring)."""

    def __init__(self, settings: Settings):
        from ..semantics import P
        self.settings = settings
        self.table = OpTable(settings.ops, settings.inputs, settings.weight_ops)
        self.fields = [Field(seed=f"{settings.seed}.{j}") for j in range(settings.fingerprint_seeds)]
        self.tables = [fast_table(f) for f in self.fields]
        self.n_src = len(settings.inputs)
        self.kinds: dict = {}
        self.kind_list: list = []
        self.src_kind = [self.kind(s.type, s.weight) for s in settings.inputs]
        self.src_weight = [s.weight for s in settings.inputs]
        self.src_vm = [source_merkle(s.name) for s in settings.inputs]
        rngs = [np.random.default_rng([settings.seed, j]) for j in range(len(self.fields))]
        self.src_vals = [tuple(r.integers(0, P, s.shape, dtype=np.int64) for r in rngs) for s in settings.inputs]
        self.src_vh = [value_hash(s.shape, v) for s, v in zip(settings.inputs, self.src_vals)]
        self.memo: dict[int, tuple] = {}
        n, extra = settings.max_ops, self.table.max_arity - 1
        self.bound = [settings.max_outputs + (n - k) * extra for k in range(n + 1)]
        self.comp_bound = [1 + (n - k) * extra for k in range(n + 1)]
        self._sigs: dict[tuple, list] = {}
        self._sig_one: dict[tuple, tuple | None] = {}
        self._src_cands = self._source_candidates()
        self._src_keys = [c[0] for c in self._src_cands]

    def kind(self, t, weight: bool) -> int:
        """Small integer id of ``(type, is_weight)``: the key candidate inputs are grouped by."""
        k = self.kinds.get((t, weight))
        if k is None:
            k = self.kinds[(t, weight)] = len(self.kind_list)
            self.kind_list.append((t, weight))
        return k

    def _signature(self, op: str, combo: tuple):
        """``(arity, kind ids, ((instance, n_out), ...), commutative)`` for ``op`` on inputs of
        the kinds ``combo``, or None where no attribute choice (or the operator's roles) fits."""
        key = (op, combo)
        hit = self._sig_one.get(key, ())
        if hit == ():
            kinds = [self.kind_list[k] for k in combo]
            hit = None
            if self.table.roles_allow(op, tuple(w for _, w in kinds)):
                insts = tuple((inst, len(outs)) for inst, outs in self.table.apply(op, tuple(t for t, _ in kinds)))
                hit = (len(combo), combo, insts, insts[0][0].commutative) if insts else None
            self._sig_one[key] = hit
        return hit

    def signatures(self, kinds, node_kinds=None) -> list:
        """Every operator use over values of ``kinds`` (with ``node_kinds``: only uses that can
        take a node's value); cached per pair of kind sets."""
        key = (frozenset(kinds), None if node_kinds is None else frozenset(node_kinds))
        sigs = self._sigs.get(key)
        if sigs is None:
            sigs = []
            ordered = sorted(key[0])
            for op in self.table.ops:
                for combo in itertools.product(ordered, repeat=self.table.arity[op]):
                    if key[1] is not None and key[1].isdisjoint(combo):
                        continue
                    sig = self._signature(op, combo)
                    if sig is not None:
                        sigs.append(sig)
            self._sigs[key] = sigs
        return sigs

    # ---- parents ------------------------------------------------------------------------------
    def unpack(self, nodes: tuple, values: bool = True) -> Unpacked:
        """Rebuild a compact graph's values, hashes, users, cones and components (without
        ``values``: structure and Merkle hashes only, value hashes left 0)."""
        p = Unpacked(nodes, list(self.src_kind), list(self.src_vm), list(self.src_vals), list(self.src_vh),
                    [-1] * self.n_src, list(self.src_weight), [-1] * self.n_src)
        for j, (op, attrs, ins) in enumerate(nodes):
            inst = self.table.instance(op, attrs)
            m = self._merkle(inst, ins, p.vm)
            if values:
                types, vals, vhs = self._evaluate(m, inst, ins, p.vals, p.vkind)
            else:
                types = self.table.out_types(inst, tuple(self.kind_list[p.vkind[v]][0] for v in ins))
                vals, vhs = (None,) * len(types), (0,) * len(types)
            cone = 1 << j
            for v in ins:
                if p.vnode[v] >= 0:
                    p.users[p.vnode[v]] += 1
                    cone |= p.cones[p.vnode[v]]
            p.merkle.append(m), p.users.append(0), p.cones.append(cone)
            weight = all(p.vw[v] for v in ins)
            for i, t in enumerate(types):
                p.vkind.append(self.kind(t, weight)), p.vm.append(m if i == 0 else h64(m, i))
                p.vals.append(vals[i]), p.vh.append(vhs[i]), p.vnode.append(j), p.vw.append(weight)
                p.comp.append(-1)
            p.join(j, list(ins) + list(range(len(p.vkind) - len(types), len(p.vkind))))
            p.key = (p.key + m) & _MASK
        p.finish(self.n_src)
        return p

    @staticmethod
    def _merkle(inst: Instance, ins, vm) -> int:
        hs = [vm[v] for v in ins]
        if inst.commutative:
            hs.sort()
        return h64(inst.key, *hs)

    def _evaluate(self, m: int, inst: Instance, ins, pvals, pkind):
        hit = self.memo.get(m)
        if hit is not None:
            return hit
        types = self.table.out_types(inst, tuple(self.kind_list[pkind[v]][0] for v in ins))
        per_seed = []
        for j, table in enumerate(self.tables):
            out = table[inst.op](inst.attr, *(pvals[v][j] for v in ins))
            per_seed.append(out if isinstance(out, tuple) else (out,))
        vals = tuple(tuple(per_seed[j][i] for j in range(len(self.tables))) for i in range(len(types)))
        hit = (types, vals, tuple(value_hash(t.shape, v) for t, v in zip(types, vals)))
        if len(self.memo) > _MEMO_LIMIT:
            self.memo.clear()
        self.memo[m] = hit
        return hit

    # ---- children -----------------------------------------------------------------------------
    def _source_candidates(self) -> list[tuple]:
        """Every node on input tensors only, sorted by Merkle hash: ``(merkle, inst, ins, n_out)``."""
        by_kind: dict = {}
        for v, k in enumerate(self.src_kind):
            by_kind.setdefault(k, []).append(v)
        out = []
        for arity, combo, insts, comm in self.signatures(by_kind):
            for ins in itertools.product(*(by_kind[k] for k in combo)):
                if len(set(ins)) < len(ins) or comm and len(ins) == 2 and self.src_vm[ins[0]] > self.src_vm[ins[1]]:
                    continue
                for inst, n_out in insts:
                    out.append((self._merkle(inst, ins, self.src_vm), inst, ins, n_out))
        out.sort(key=lambda c: c[0])
        return out

    def _node_inputs(self, p: Unpacked, arity: int, combo, comm: bool):
        """Input tuples for one signature that use at least one node's value."""
        if arity == 0:
            return []
        if arity == 1:
            return [(v,) for v in p.node_by_kind.get(combo[0], ())]
        n_src, vm = self.n_src, p.vm
        if arity == 2:
            l0, l1 = p.by_kind[combo[0]], p.by_kind[combo[1]]
            return [(a, b) for a in l0 for b in l1
                    if (a >= n_src or b >= n_src) and a != b and not (comm and vm[a] > vm[b])]
        return [ins for ins in itertools.product(*(p.by_kind[k] for k in combo))
                if max(ins) >= n_src and len(set(ins)) == len(ins)]

    def children(self, p: Unpacked, level: int, parent_index: int, rows: list, canonical: bool = True) -> int:
        """Append a record for every child of ``p`` (a graph of ``level - 1`` nodes); returns the
        number of candidate nodes tried. A child may have more outputs (or more unconnected
        parts) than the final graph only as far as the operators still to come can join them.
        ``canonical=False`` keeps children whose new node is not their canonical last node too
        (each graph then comes once per parent: only for testing the canonical order)."""
        unused, comp, vnode = p.unused, p.comp, p.vnode
        n_unused, bound = len(unused), self.bound[level]
        need = p.n_comps + 1 - self.comp_bound[level]   # components the new node must touch
        tried = 0
        if n_unused + 1 <= bound:
            start = bisect.bisect_right(self._src_keys, p.sinks[0][0] if p.sinks and canonical else 0)
            for m, inst, ins, n_out in self._src_cands[start:]:
                tried += 1
                if n_unused + n_out > bound or m in p.mset:
                    continue
                if need > 0 and len({comp[v] for v in ins if comp[v] >= 0}) < need:
                    continue
                self._emit(p, parent_index, inst, ins, m, rows)
        for arity, combo, insts, comm in self.signatures(p.by_kind, p.node_by_kind):
            if need > arity:
                continue
            for ins in self._node_inputs(p, arity, combo, comm):
                if need > 0 and len({comp[v] for v in ins if comp[v] >= 0}) < need:
                    continue
                left = n_unused - len(unused.intersection(ins))
                eaten = [vnode[v] for v in ins]
                top = next((sm for sm, sj in p.sinks if sj not in eaten), 0) if canonical else 0
                for inst, n_out in insts:
                    tried += 1
                    if left + n_out > bound:
                        continue
                    m = self._merkle(inst, ins, p.vm)
                    if m > top and m not in p.mset:
                        self._emit(p, parent_index, inst, ins, m, rows)
        return tried

    def _emit(self, p: Unpacked, parent_index, inst, ins, m, rows):
        types, vals, vhs = self._evaluate(m, inst, ins, p.vals, p.vkind)
        cone = 1 << len(p.nodes)
        for v in ins:
            if p.vnode[v] >= 0:
                cone |= p.cones[p.vnode[v]]
        left = [v for v in p.unused if v not in ins]
        outs = [p.vh[v] for v in left] + list(vhs)
        nout = len(outs)
        data = not all(p.vw[v] for v in ins) and not any(p.vw[v] for v in left)
        fp = h64(nout, *sorted(outs)) if nout <= self.settings.max_outputs and data else 0
        padded = tuple(ins) + (-1,) * (MAX_ARITY - len(ins))
        vh2 = (vhs[0], vhs[1] if len(vhs) > 1 else 0)
        nsinks = 1 + sum(1 for _, j in p.sinks if all(p.vnode[v] != j for v in ins))
        rows.append((parent_index, inst.key, padded, m, cone.bit_count(), vh2, fp, (p.key + m) & _MASK, nout,
                     nsinks))


_EXPANDERS: dict[str, Expander] = {}


def expander_for(settings: Settings) -> Expander:
    """The process-wide expander of these settings (built once per worker process)."""
    key = settings.digest()
    ex = _EXPANDERS.get(key)
    if ex is None:
        _EXPANDERS.clear()
        ex = _EXPANDERS[key] = Expander(settings)
    return ex


def expand_chunk(settings: Settings, level: int, chunk: int, first: int, parents: list) -> ChunkResult:
    """Children of ``parents`` (frontier entries ``first, first+1, ...`` of level ``level-1``)."""
    t0 = time.perf_counter()
    ex = expander_for(settings)
    rows: list = []
    tried = 0
    for k, nodes in enumerate(parents):
        tried += ex.children(ex.unpack(nodes), level, first + k, rows)
    records = np.array(rows, dtype=RECORD) if rows else np.zeros(0, dtype=RECORD)
    used = {int(k) for k in np.unique(records["inst"])}
    instances = {k: (ex.table.instances[k].op, ex.table.instances[k].attrs) for k in used}
    return ChunkResult(level, chunk, records, instances, tried, time.perf_counter() - t0)
