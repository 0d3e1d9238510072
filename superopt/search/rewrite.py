"""Rewriting a state at a match: first a cheap *plan*, then, for plans the search keeps, the child.

:meth:`Rewriter.plan` decides whether a match can be rewritten and what the result costs and
hashes to, without copying the graph: it rejects a match whose intermediate values are used
outside it (unless the rule maps them as outputs), that would close a cycle, or whose right
side does not fit the match's shapes (see :mod:`superopt.pattern.instantiate`). It reuses an
existing node where the right side rebuilds one (same operator, attributes and inputs).
A plan holds *changes* (of cost, of the hash) and the nodes it read (``deps``), so a child
state reuses its parent's plans for every match the parent's rewrite did not come near (the
cycle check, which depends on paths through the whole graph, is redone on reuse).
:meth:`Rewriter.admit` asks the instance-proof gate whether the plan's instance of its rule
is proven (the search asks before it builds a child). :meth:`Rewriter.apply` builds the child state: copies of the parent's tables with the change
applied, and the child's matches (the parent's away from the change, plus new ones found at
the nodes the rewrite created or re-wired).
"""

from __future__ import annotations

import itertools
from collections import Counter
from operator import itemgetter
from dataclasses import dataclass
from typing import NamedTuple

from ..cost.model import CostModel
from ..ir.graph import Node, Ref
from .instance_proofs import InstanceProofs
from ..pattern import Instantiator, Match, RuleSet, instance_rule, match_near
from .state import DEPTH, MASK, State, node_sigs, output_hash, sigs_of, topo_ranks

__all__ = ["Step", "Plan", "Rejection", "Rewriter", "describe"]


class Step(NamedTuple):
    """One applied rewrite, as the history of a state records it."""

    rule_id: str
    pattern: int
    where: str
    cost_before: float
    cost_after: float


class Rejection(NamedTuple):
    """A match that cannot be rewritten here, why, and what it depends on (None: recheck)."""

    reason: str
    deps: frozenset | None


@dataclass
class Plan:
    """A rewrite decided but not yet built (see the module docstring)."""

    match: Match
    new: list            # (id, Node) in topological order
    new_const: dict
    new_cost: dict
    replace: dict        # old value -> new value
    removed: set
    redirected: dict     # id -> Node with re-wired inputs
    sigs: dict           # new signatures of new and nearby nodes
    dcost: float
    dsum: int
    exact: bool          # False: constness changed downstream, cost known only after apply
    deps: frozenset | None

    def key(self, st: State) -> int:
        """The dedup key of the graph this plan makes from ``st``."""
        if any(r.node in self.sigs or r in self.replace for r in st.outputs):
            outs = [self.replace.get(r, r) for r in st.outputs]
            out_hash = output_hash(outs, _Overlay(self.sigs, st.sigs))
        else:
            out_hash = st.out_hash
        return hash(((st.key_sum + self.dsum) & MASK, out_hash))


class Rewriter:
    """Plans and applies rewrites of states for one rule set and cost model."""

    def __init__(self, rules: RuleSet, cost: CostModel, proofs: InstanceProofs | None = None):
        self.rules, self.cost = rules, cost
        self.inst = Instantiator(cost)
        self.proofs = proofs if proofs is not None else InstanceProofs(store=None)
        self._admitted: dict = {}
        self.ids = itertools.count(1 << 32)
        self.rejected: Counter = Counter()
        self.reused = 0

    def admit(self, st: State, plan: Plan) -> bool:
        """Whether the plan's instance of its rule (at this match's types and attributes) is
        proven: asks the gate once per distinct instance."""
        pat = self.rules.patterns[plan.match.pattern]
        key = self.inst.key(pat, st, plan.match)
        ok = self._admitted.get(key)
        if ok is None:
            tpl = self.inst.template(pat, st, plan.match)
            ok = tpl is not None and self.proofs.admit(pat.rule_id, instance_rule(pat, st, plan.match, tpl))
            self._admitted[key] = ok
        return ok

    def plan(self, st: State, match: Match) -> Plan | None:
        """The plan of rewriting ``match`` in ``st``, or None (counted by reason)."""
        res = st.plans.get(match)
        if res is None:
            res = self._plan(st, match)
            if res.deps is not None:
                st.plans[match] = res
        else:
            self.reused += 1
            if isinstance(res, Plan) and self.rules.patterns[match.pattern].may_close_cycle and \
                    _cycle(st, match, _output_nodes(self.rules.patterns[match.pattern], match)):
                res = Rejection("would create a cycle", None)
        if isinstance(res, Rejection):
            self.rejected[res.reason] += 1
            return None
        return res

    def _plan(self, st: State, match: Match) -> Plan | Rejection:
        pat = self.rules.patterns[match.pattern]
        matched = set(match.nodes)
        reads = set(matched) | {r.node for r in match.binds}
        frozen = reads
        if all(st.const[m] for m in matched):
            return Rejection("folded at compile time", _freeze(frozen))
        outs = [Ref(match.nodes[j], k) for j, k in pat.outputs]
        if not _contained(st, matched, set(outs), reads):
            return Rejection("intermediate value used outside the match", _freeze(frozen))
        if any(r.node in matched for r in match.binds):
            return Rejection("would create a cycle", _freeze(frozen))
        if pat.may_close_cycle and _cycle(st, match, _output_nodes(pat, match)):
            return Rejection("would create a cycle", None)
        tpl = self.inst.template(pat, st, match)
        if tpl is None:
            return Rejection("right side does not fit the match's shapes", _freeze(frozen))
        new, refs, const, cost = self._new_nodes(st, tpl, match, matched, reads)
        replace: dict[Ref, Ref] = {}
        for k, spec in enumerate(tpl.outputs):
            target = match.binds[spec[1]] if spec[0] == "v" else Ref(refs[spec[1]], spec[2])
            if replace.setdefault(outs[k], target) != target:
                return Rejection("one value rewritten two ways", _freeze(frozen))
        if all(k == v for k, v in replace.items()):
            return Rejection("no change", _freeze(frozen))
        plan = self._finish(st, match, new, const, cost, replace, matched, reads)
        plan.deps = frozenset(reads)
        return plan

    def _new_nodes(self, st: State, tpl, match: Match, matched: set, reads: set):
        new, refs, const, cost = [], [], {}, {}
        sig = _Overlay({}, st.sigs)
        for t in tpl.nodes:
            ins = tuple(match.binds[s[1]] if s[0] == "v" else Ref(refs[s[1]], s[2]) for s in t.inputs)
            node = Node(t.op, ins, t.attrs, t.types)
            same = _existing(st, node, matched, reads)
            if same is not None:
                refs.append(same)
                continue
            nid = next(self.ids)
            refs.append(nid)
            c = t.constant or (t.compute and bool(ins) and all(
                const[r.node] if r.node in const else st.const[r.node] for r in ins))
            const[nid], cost[nid] = c, 0.0 if c else t.cost
            sig.first[nid] = sigs_of(t.base, t.commutative, [sig[r.node] for r in ins], [r.index for r in ins])
            new.append((nid, node))
        return new, refs, const, cost

    def _finish(self, st, match, new, const, cost, replace, matched, reads) -> Plan:
        kept = {r.node for _, n in new for r in n.inputs} | {t.node for t in replace.values()}
        removed = _dead(st, matched, kept, reads)
        redirected = {}
        for old in replace:
            for u in st.users.get(old.node, ()):
                if u not in removed and u not in redirected:
                    n = st.nodes[u]
                    if any(r in replace for r in n.inputs):
                        redirected[u] = Node(n.op, tuple(replace.get(r, r) for r in n.inputs), n.attrs, n.types)
                        reads.add(u)
        exact = all((const[v.node] if v.node in const else st.const[v.node]) == st.const[k.node]
                    for k, v in replace.items())
        dcost = sum(cost.values()) - sum(st.ncost[i] for i in removed)
        sigs = _resign(st, new, redirected, removed, reads)
        dsum = sum(s[DEPTH] for s in sigs.values()) - sum(st.sigs[i][DEPTH] for i in removed)
        dsum -= sum(st.sigs[i][DEPTH] for i in sigs if i in st.sigs)
        return Plan(match, new, const, cost, replace, removed, redirected, sigs, dcost, dsum, exact, None)

    # ---- applying ------------------------------------------------------------------------
    def apply(self, st: State, plan: Plan) -> State:
        """The child state of ``st`` after ``plan``."""
        c = State()
        c.nodes, c.users, c.sigs = dict(st.nodes), dict(st.users), dict(st.sigs)
        c.const, c.ncost, c.rank = st.const, st.ncost, st.rank  # shared: see State
        _remove(c, st, plan.removed)
        for nid, node in plan.new:
            c.nodes[nid], c.users[nid] = node, ()
            c.const[nid], c.ncost[nid] = plan.new_const[nid], plan.new_cost[nid]
            c.rank[nid] = max((c.rank[r.node] for r in node.inputs), default=-1.0) + 1e-6
            for p in dict.fromkeys(r.node for r in node.inputs):
                c.users[p] += (nid,)
        ranks_ok = _rewire(c, st, plan.redirected)
        c.sigs.update(plan.sigs)
        c.outputs, c.data = tuple(plan.replace.get(r, r) for r in st.outputs), st.data
        c.cost, c.key_sum = st.cost + plan.dcost, (st.key_sum + plan.dsum) & MASK
        c.out_hash = output_hash(c.outputs, c.sigs)
        c.key = hash((c.key_sum, c.out_hash))
        c.plans = _inherit(st, plan) if ranks_ok and plan.exact else {}
        if not ranks_ok:
            c.rank = topo_ranks(c.nodes)
        if not plan.exact:
            c.recompute(self.cost)
        c.parent, c.depth = st, st.depth + 1
        c.step = Step(self.rules.patterns[plan.match.pattern].rule_id, plan.match.pattern,
                      describe(st, plan.match, self.rules), st.cost, c.cost)
        c.matches = self._child_matches(st, c, plan)
        return c

    def _child_matches(self, st: State, c: State, plan: Plan) -> list[Match]:
        removed = plan.removed
        bad = removed | set(plan.redirected)
        kept = [m for m in st.matches if bad.isdisjoint(m.nodes) and removed.isdisjoint(map(_node_of, m.binds))]
        touched = [nid for nid, _ in plan.new] + list(plan.redirected)
        fresh = match_near(c, self.rules, touched)
        return list(dict.fromkeys(kept + fresh))


_node_of = itemgetter(0)


def _freeze(reads: set | None) -> frozenset | None:
    return None if reads is None else frozenset(reads)


def _changed(st: State, plan: Plan) -> set:
    """Nodes of ``st`` whose node, users, signature or output status the plan changes."""
    out = set(plan.removed) | set(plan.redirected) | set(plan.sigs)
    for i in plan.removed:
        out.update(r.node for r in st.nodes[i].inputs)
    for _, n in plan.new:
        out.update(r.node for r in n.inputs)
    for u, n in plan.redirected.items():
        out.update(r.node for r in n.inputs)
        out.update(r.node for r in st.nodes[u].inputs)
    out.update(v.node for k, v in plan.replace.items() if k in st.outputs)
    return out


def _inherit(st: State, plan: Plan) -> dict:
    """The parent's plans (and rejections) that the rewrite did not invalidate."""
    changed = _changed(st, plan)
    return {m: p for m, p in st.plans.items() if p.deps is not None and p.deps.isdisjoint(changed)}


class _Overlay:
    """Read ``first``, falling back to ``second`` (a two-level mapping without copying)."""

    __slots__ = ("first", "second")

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __getitem__(self, k):
        v = self.first.get(k)
        return self.second[k] if v is None else v


def _existing(st: State, node: Node, matched: set, reads: set) -> int | None:
    """An existing node outside the match equal to ``node`` (same op, attrs and inputs)."""
    if not node.inputs or node.inputs[0].node not in st.nodes:
        return None
    reads.add(node.inputs[0].node)
    for u in st.users.get(node.inputs[0].node, ()):
        if u not in matched and st.nodes[u] == node:
            reads.add(u)
            return u
    return None


def _contained(st: State, matched: set, outs: set, reads: set) -> bool:
    """No value made inside the match escapes it, except the rule's outputs."""
    for m in matched:
        for u in st.users[m]:
            if u not in matched:
                reads.add(u)
                if any(r.node == m and r not in outs for r in st.nodes[u].inputs):
                    return False
    return all(r in outs for r in st.outputs if r.node in matched)


def _output_nodes(pat, match: Match) -> set:
    return {match.nodes[j] for j, _ in pat.outputs}


def _cycle(st: State, match: Match, outs: set) -> bool:
    """True when a bound variable depends on a node making a rule output (the rewrite would
    close a cycle). Other matched nodes are used inside the match only, so no path leaves the
    match through them, and a single output node cannot be an ancestor of its own inputs."""
    low = min(st.rank[m] for m in outs)
    stack = [r.node for r in match.binds if st.rank[r.node] > low]
    seen = set(stack)
    while stack:
        p = stack.pop()
        if p in outs:
            return True
        for r in st.nodes[p].inputs:
            if r.node not in seen and st.rank[r.node] >= low:
                seen.add(r.node)
                stack.append(r.node)
    return False


def _dead(st: State, matched: set, kept: set, reads: set) -> set:
    """The matched nodes plus the operators only they used (sources always stay)."""
    removed = set(matched)
    frontier = [r.node for m in matched for r in st.nodes[m].inputs]
    out_nodes = {r.node for r in st.outputs}
    while frontier:
        p = frontier.pop()
        if p in removed or p in kept or p in out_nodes or st.nodes[p].name is not None:
            continue
        reads.add(p)
        if all(u in removed for u in st.users[p]):
            removed.add(p)
            frontier.extend(r.node for r in st.nodes[p].inputs)
    return removed


def _resign(st: State, new: list, redirected: dict, removed: set, reads: set) -> dict:
    """New signatures: the new nodes, and every node within DEPTH-1 hops below a re-wired one."""
    sigs: dict = {}
    get = _Overlay(sigs, st.sigs)
    for nid, node in new:
        sigs[nid] = node_sigs(node, [get[r.node] for r in node.inputs])
    affected, frontier = set(redirected), list(redirected)
    for _ in range(DEPTH - 1):
        nxt = []
        for i in frontier:
            for u in st.users[i]:
                if u not in affected and u not in removed:
                    affected.add(u)
                    nxt.append(u)
        frontier = nxt
    for i in sorted(affected, key=st.rank.__getitem__):
        node = redirected.get(i) or st.nodes[i]
        reads.add(i)
        reads.update(r.node for r in node.inputs)
        sigs[i] = node_sigs(node, [get[r.node] for r in node.inputs])
    return sigs


def _remove(c: State, st: State, removed: set) -> None:
    for i in removed:
        for p in dict.fromkeys(r.node for r in st.nodes[i].inputs):
            if p not in removed:
                c.users[p] = tuple(u for u in c.users[p] if u not in removed)
    for i in removed:
        for table in (c.nodes, c.users, c.sigs):
            del table[i]


def _rewire(c: State, st: State, redirected: dict) -> bool:
    """Point re-wired nodes at their new inputs; False when the ranks stop being topological."""
    ok = True
    for u, node in redirected.items():
        before = {r.node for r in st.nodes[u].inputs}
        after = {r.node for r in node.inputs}
        c.nodes[u] = node
        for p in before - after:
            if p in c.users:
                c.users[p] = tuple(x for x in c.users[p] if x != u)
        for p in after - before:
            c.users[p] += (u,)
        ok = ok and all(c.rank[p] < c.rank[u] for p in after)
    return ok


def describe(st: State, match: Match, rules: RuleSet) -> str:
    """Where a match is, for people: its operators and the named sources it binds."""
    pat = rules.patterns[match.pattern]
    ops = "+".join(f"{st.nodes[m].op}#{m}" for m in match.nodes)
    named = [f"{pat.var_names[v]}={st.nodes[r.node].name}" for v, r in enumerate(match.binds)
             if st.nodes[r.node].name is not None]
    return ops + (f" ({', '.join(named)})" if named else "")
