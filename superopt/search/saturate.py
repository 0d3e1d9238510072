"""Equality saturation (Tensat): every proven rule applied in an e-graph of the model, then the
cheapest graph extracted.

Each iteration matches every rule in the e-graph (:mod:`superopt.pattern.ematch`), then applies
the matches: the right side is built at the match's shapes (the same
:class:`~superopt.pattern.instantiate.Instantiator` the backtracking search uses, with its
size-1 axis check), the *instance* (the matched left side and that right side, at the model's
types and attributes) must be admitted by the proof gate, and only then is the right side
added and unioned with the left. Rules that merge unrelated operators (multi-patterns joined
through variables only, and rules that merge matmuls or convolutions through a concat:
:func:`~superopt.search.schedule.merges`) run in ``multi_rounds`` rounds, each after the other rules have stopped
adding anything (so merges see folded batch norms); so do the other rules with several tops
that grow as stated (Tensat's k_multi, which bounds every multi-pattern rule: matched in full at
every iteration, they re-split BERT's merged projections and grew its e-graph by half for
nothing extracted), and no rule with several outputs is applied
where it would make a class depend on itself. A merge is refused where two of its compile-time
operands are made from a common weight on one data class (a convolution and its batch-norm-folded
form: the shared part computed twice), unless the merged operator is priced below one of the
matched ones, and where it merges the same weights on the same data as a merge of an earlier
round (another form of that merge, which the phase between made: :meth:`_Runner._merge`): on
the zoo they were most of the merges, and refusing them lowered no model's reduction
(docs/search.md, round 10). Rules that match too often are banned for a few iterations (egg's
BackoffScheduler; only new matches count: a match seen before at its canonical form is dropped
before the count, and is not applied again).

The schedule reaches a fixed point. A rule *grows* the e-graph when its right side runs at
least as many operators as its left (associativity, commutation, distribution, the reversal of
a fold: :func:`grows`); the others fold. Every class has a *generation*: 0 for the model's,
and a class a growing rewrite makes is one more than the highest of the classes it matched
(folds add none; a union keeps the lower); a growing rewrite that the cost model prices
cheaper at its match than what it matched is a fold there (:func:`~superopt.search.schedule.pays`:
``maxpool(relu(x))`` as ``relu(maxpool(x))``, whose next step, ``maxpool(x + b)`` as
``maxpool(x) + b``, must stay within the bound). A growing rule applies only to matches below
``Limits.growth`` (default 1: growing rewrites of the model's own classes, not of what growth
made; 2 cost 2-7x the time on the zoo: docs/search.md), so growth is
bounded the way merges are by their rounds (Tensat's k_multi; a round applies the largest
merges first and stops once it has grown the e-graph by ``Limits.merge_growth``), and within
an iteration folds and merges go first. The bound is applied while matching: a growing pattern
never binds a class of generation ``growth`` or later, so matches past it are not even
enumerated (``held`` counts the classes refused). Matching is semi-naive: after the first
iteration a single-top pattern is matched only at classes touched since the last search (and
their users up to its height), and a pattern with several tops only when one of its tops
matches there; a top candidate (a class and an e-node) takes its matches from the search that
last matched it where neither its class nor anything within the pattern's height below its
arguments changed since (:class:`~superopt.pattern.ematch.Reuse`: the same list, in the same
order), and a pattern cut at the match limit whose tops match nowhere near a change replays its
last count. Patterns with one match key share their matches, and rules of one form (the
same rewrite at other sizes or names) are compiled once (:func:`~superopt.pattern.compile.rule_form`). The loop stops when the merge rounds are used up and an
iteration adds nothing with no rule banned (``saturated``: no rule can add anything within the
bounds, the merges and the growing rules with several tops aside, which had their rounds; the
report counts the matches the bounds ``held``), or at a limit on iterations,
e-nodes or time; then :mod:`superopt.search.extract` picks the cheapest graph.

The gate is any object with ``admit(rule_id, instance) -> bool`` (the instance an
:class:`~superopt.ir.rule.Rule`); nothing an unadmitted instance would say enters the e-graph.

The e-graph is written here rather than taken from ``egglog``: matching must call into Python
per match (sizes re-derived at the match's shapes, the size-1 axis check, the proof gate), and
classes carry tensor types and compile-time constness that rules must see while matching.
"""

from __future__ import annotations

import gc
import hashlib
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

from ..cost.model import CostModel, constant_nodes
from ..ir.graph import Graph, Node, Ref
from ..ir.rule import Rule
from ..pattern import (EGraph, EMatch, Instantiator, Match, RuleSet, ematch_pattern as match_pattern,
                       index_by_op, instance_of, real_attrs)
from ..pattern.eindex import anchor_keys, candidates, indexed, narrowed
from ..pattern.ematch import Reuse, near_match
from .compiled import Compiled, code_digest, compile_rules
from .errors import SearchError
from .extract import extract, value_classes
from .report import SaturationReport, StopReason
from .schedule import DEFAULT_LIMITS, Limits, grows, pays

__all__ = ["Gate", "Limits", "SaturationResult", "saturate", "DEFAULT_LIMITS"]


def _self_digest() -> str | None:
    """This module's own code, part of what names an instance (:meth:`_Runner._made`); None
    where it cannot be read (then instances are built and looked up as built)."""
    try:
        return hashlib.blake2b(Path(__file__).read_bytes(), digest_size=16).hexdigest()
    except OSError:
        return None


_SELF_DIGEST = [_self_digest()]
_VERSION: list = []  # the code that names instances, as a short digest (:meth:`_Runner._made`)


class Gate(Protocol):
    def admit(self, rule_id: str, instance: Rule) -> bool: ...


@dataclass
class SaturationResult:
    """The extracted graph (not yet folded), the report and the e-graph."""

    graph: Graph
    report: SaturationReport
    egraph: EGraph = field(repr=False, default=None)
    source: Graph | None = field(repr=False, default=None)  # the graph saturated

    def classes(self) -> tuple[dict, dict]:
        """The e-class of every value of the graph saturated and of the extracted one (Ref ->
        class, None where not found): values of one class were proven equal, which is what the
        output check of the rewritten regions compares (:mod:`superopt.driver.regions`)."""
        if self.egraph is None or self.source is None:
            return {}, {}
        old = value_classes(self.egraph, self.source, marks=True)
        opaque = {(n.op, n.attrs, tuple(old.get(r) for r in n.inputs)): i
                  for i, n in enumerate(self.source.nodes) if n.op == "opaque"}
        return old, value_classes(self.egraph, self.graph, opaque=opaque, source=old)


class _View:
    """What the Instantiator reads of a match: the types and attributes of the matched nodes."""

    __slots__ = ("nodes", "types")

    def __init__(self, apps, eg: EGraph):
        self.nodes = {j: Node(e.op, (), e.attrs, e.types) for j, e in enumerate(apps)}
        self.types = eg.types

    def type_of(self, r: Ref):
        return self.types[r.node]


class _Replayed:
    """A pattern's matches not enumerated again: only their count (see :meth:`_Runner._search`)."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n


class _Near(dict):
    """Level -> the index of the classes within that many steps of a change, built when a pattern
    first asks for it (the e-graph does not change while matching; no pattern asks for level 0)."""

    __slots__ = ("eg", "levels")

    def __init__(self, eg: EGraph, levels: list[set[int]]):
        super().__init__()
        self.eg, self.levels = eg, levels

    def __missing__(self, h: int) -> dict:
        top = len(self.levels) - 1  # the widest level (they are nested): the others are parts of it
        got = self[h] = index_by_op(self.eg, self.levels[h]) if h == top else narrowed(self[top], self.levels[h])
        return got


class _Search:
    """One search's state: the indexes near the changes (per level), the index of every e-node
    (built when a pattern needs it), the held count and the matches shared by match key."""

    __slots__ = ("eg", "it", "first", "merging", "near", "stats", "shared", "_all")

    def __init__(self, eg: EGraph, it: int, merging: bool):
        self.eg, self.it, self.first, self.merging = eg, it, it == 0, merging
        self.near: dict[int, dict] = {}
        self.stats: dict = {}  # classes past the growth bound that growing patterns were refused at
        self.shared: dict = {}  # match_key (and where matched) -> the matches
        self._all = None

    def index(self) -> dict:
        if self._all is None:
            self._all = index_by_op(self.eg)
        return self._all


class _Runner:
    def __init__(self, compiled: Compiled, cost: CostModel, gate: Gate, limits: Limits, rep: SaturationReport):
        self.rules, self.cost, self.gate, self.limits, self.rep = compiled.ruleset, cost, gate, limits, rep
        self.inst = Instantiator(cost)
        self.templates: dict = {}  # what an instance is built from -> [its right side (Instantiator.template),
        #                            whether the gate admits the instance (None until asked)]
        self.keyed = callable(getattr(gate, "admit_keyed", None)) and _SELF_DIGEST[0] is not None  # named, not built
        c = compiled  # the schedule classes (search/compiled.py says what each holds)
        self.multi, self.skipped_merges, self.tops, self.top = c.multi, c.skipped_merges, c.tops, c.top
        self.maybe, self.grows, self.height, self.same = c.maybe, c.grows, c.height, c.same
        self.rounds = self.multi | {i for i in self.tops if i in self.grows or i in self.maybe}  # run in rounds
        self.grows_at: dict = {}  # (pattern, which variables are compile-time) -> grows
        self.depth = max(self.height.values(), default=0)
        self.by_key: dict = {}  # an index key -> the patterns whose first top is filed under it
        for p in self.rules.patterns:
            for k in anchor_keys(p, self.top[p.index]):
                self.by_key.setdefault(k, []).append(p.index)
        self.weight_memo: dict = {}  # class -> weights it is made from (reset each iteration)
        self.seen: set = set()  # matches applied (or refused) at their canonical form: applying one
        #                         again adds nothing, and the dirty classes re-find most of them
        self.rank: dict = {}  # class -> its strongly connected part's topological rank (merge rounds)
        self.truncated: set[int] = set()  # patterns cut short or banned: matched everywhere next time
        self.last: dict[int, tuple] = {}  # pattern -> (iteration, matches, held) of its last search
        self.searched = -1  # the last single-pattern search's iteration
        self.reuse: dict[int, dict] = {}  # pattern -> its top candidates' matches (ematch.Reuse)
        self.changed: list[dict] = [{} for _ in range(self.depth + 2)]  # level -> class -> last search
        #                         that saw a change within that many steps below it
        self.ban_until: dict[int, int] = {}  # pattern -> first iteration it runs again (backoff)
        self.bans: Counter = Counter()  # pattern -> times banned
        self.merged: dict = {}  # weights merged -> {the data classes merged with them: the round}
        self.round = 0  # the merge rounds done

    def run(self, eg: EGraph, t0: float) -> StopReason:
        """Single-pattern rules until nothing changes, then one round of merges (and of the
        growing rules with several tops), and again, until the merge rounds are used up and the
        other rules add nothing (saturated). The
        growth bound keeps every phase finite, so rules that would never saturate
        (associativity, distributivity) cannot starve the merges of room."""
        lim, rep = self.limits, self.rep
        merges_left = lim.multi_rounds
        merging = False
        phases = {m: [p for p in self.rules.patterns
                      if (p.index in self.rounds) == m and p.index not in self.skipped_merges] for m in (False, True)}
        for it in range(lim.iterations):
            pats = phases[merging]
            ti = time.perf_counter()
            found = self._search(eg, pats, t0, it, merging)
            if found is None:
                return StopReason.TIME_LIMIT
            rep.iterations = it + 1
            if merging:  # the largest merges first: the e-node limit may stop the round early
                found.sort(key=lambda m: -self._work(eg, m))
            n0 = sum(self.rep.by_rule.values())
            stop, changed = self._apply_all(eg, found, t0, merging)
            rep.trace.append({"phase": "merge" if merging else "single", "enodes": len(eg),
                              "classes": eg.class_count, "matches": len(found),
                              "rewrites": sum(self.rep.by_rule.values()) - n0, "changed": changed,
                              "seconds": round(time.perf_counter() - ti, 4)})
            if stop is not None:
                return stop
            if merging:
                self.round += 1
                merges_left -= 1
                merging = False
            elif not changed:
                if not changed and self._unban(it):  # egg: banned rules run before the phase ends
                    continue
                if not merges_left:
                    return StopReason.SATURATED
                merging = True
        return StopReason.ITERATION_LIMIT

    def _work(self, eg: EGraph, m: EMatch, running: bool = False) -> float:
        """What the matched operators cost to run (a merge of costly operators saves the most);
        ``running``: those computed at compile time left out."""
        return sum(self._times(eg, m, running))

    def _times(self, eg: EGraph, m: EMatch, running: bool = False) -> list[float]:
        """What each matched operator costs to run (see :meth:`_work`)."""
        out, const, find = [], eg.const, eg.find
        for e in m.apps:
            if e.k == 0 and e.op not in ("input", "weight", "opaque") and not (running and const[eg.lookup(e)]):
                ins = [eg.types[find(c)] for c in e.kids]
                out.append(self.cost.node_time(e.op, real_attrs(e.attrs), ins, e.types))
        return out or [0.0]

    def _search(self, eg: EGraph, pats, t0: float, it: int, merging: bool) -> list[EMatch] | None:
        """Matches of ``pats``: single-top patterns only where the e-graph changed since the last
        single-pattern search, up to the pattern's height plus its variables' level (their
        older matches were applied already), merges everywhere; each pattern's count then
        decides its bans and cut (:meth:`_keep`)."""
        t = time.perf_counter()
        s = _Search(eg, it, merging)
        if not (s.first or merging):
            levels = eg.take_dirty_levels(self.depth + 1)
            s.near = _Near(eg, levels)
            for h, dirty in enumerate(levels):
                self.changed[h].update(dict.fromkeys(dirty, it))
        if s.first:
            eg.touched = set()
        found: list[EMatch] = []
        partial = not (s.first or merging)
        tops, truncated, height, near = self.tops, self.truncated, self.height, s.near
        present: dict[int, set] = {}  # level -> the patterns with an e-node near a change under a top key
        for pat in pats:
            i = pat.index
            if not merging and self.ban_until.get(i, 0) > it:
                continue
            if partial and i not in tops and i not in truncated:
                h = height[i] + 1
                at = present.get(h)
                if at is None:
                    at = present[h] = self._present(near[h])
                if i not in at:
                    continue  # its top is no e-node near a change: no match (match_pattern's first test)
                if not candidates(eg, pat, self.top[i], near[h]):
                    continue  # none whose arguments fit (its matching's first step, memoized per top's needs)
            tp = time.perf_counter()
            got, held, whole = self._match_one(s, pat)
            fresh = [] if isinstance(got, _Replayed) else self._fresh(eg, got)
            self.rep.rule_seconds[self.rep.label(pat.rule_id)] += time.perf_counter() - tp
            if self._keep(pat.index, len(got), len(fresh), held, whole, it, merging):
                found += fresh
            if time.perf_counter() - t0 > self.limits.seconds:
                return None
        if not merging:
            self.searched = it
        self.rep.held += s.stats.get("held", 0)
        self.rep.seconds["match"] += time.perf_counter() - t
        return found

    def _present(self, index: dict) -> set:
        """The patterns with some e-node of ``index`` under one of their top's keys."""
        out: set = set()
        by_key = self.by_key
        for k in index:
            got = by_key.get(k)
            if got is not None:
                out.update(got)
        return out

    def _match_one(self, s: "_Search", pat) -> tuple[list, int, bool]:
        """One pattern's matches in this search, the classes the growth bound refused it, and
        whether it was matched everywhere with no filter. A pattern cut at the match limit at the
        last single-pattern search whose tops match nowhere near a change has the same matches
        as then, all applied or refused already: its count is replayed (:meth:`_replay`)."""
        eg, i, stats, limit = s.eg, pat.index, s.stats, self.limits.matches_per_rule
        full = s.first or s.merging or i in self.tops or i in self.truncated
        cap = self.limits.growth if i in self.grows else \
            self.limits.growth + 1 if i in self.maybe else None  # folds there: one further
        pre = s.near[self.height[i] + 1] if full and not (s.first or s.merging) else None
        whole = not s.merging and (s.first or i in self.truncated)  # matched everywhere, no filter
        last = self.last.get(i)
        if pre is not None and i in self.truncated and last and last[0] == self.searched \
                and not near_match(eg, pat, pre, cap):
            stats["held"] = stats.get("held", 0) + last[2]
            return self._replay(i, last), last[2], whole  # nothing new: as matched last time
        where = -1 if full else self.height[i] + 1
        key = (self.same[i], cap, where, pre is None or i in self.truncated)  # same match key, same matches
        got, held0 = s.shared.get(key), stats.get("held", 0)
        if got is not None:
            return [m._replace(pattern=i) for m in got], 0, whole
        if pre is not None and i not in self.truncated and not any(indexed(pat, j, pre) for j in self.tops[i]):
            got = []  # no top near a change: no new match (match_pattern's own test)
        else:  # a top candidate whose surroundings did not change matches as it did (Reuse)
            reuse = None if s.merging else Reuse(self.reuse.setdefault(i, {}), self.changed, s.it, self.height[i])
            got = match_pattern(eg, pat, s.index() if full else s.near[where], limit, cap, stats,
                                None if i in self.truncated else pre, reuse)
        s.shared[key] = got
        return got, stats.get("held", 0) - held0, whole

    def _fresh(self, eg: EGraph, got: list[EMatch]) -> list[EMatch]:
        """The matches not applied (or refused) before at their canonical form: only those can
        add anything (semi-naive, as egglog counts them)."""
        seen, find, canonical, parent = self.seen, eg.find, eg.canonical, eg.parent
        out = []
        for m in got:
            binds = tuple([c if parent[c] == c else find(c) for c in m.binds])
            if (m.pattern, binds, tuple([canonical(e) for e in m.apps])) in seen:
                self.rep.repeats += 1
            else:
                out.append(m)
        return out

    def _keep(self, i: int, n: int, new: int, held: int, whole: bool, it: int, merging: bool) -> bool:
        """Whether pattern ``i``'s matches are applied: outside merge rounds a pattern with more
        than ``ban_matches`` new matches (``new`` of its ``n``: those not applied before; doubled
        at each ban) is banned for ``ban_iterations`` iterations (doubled likewise) and its
        matches dropped: egg's BackoffScheduler, so that rules that never saturate
        (associativity) do not starve the others of time and room; old matches add nothing, so
        they ban nothing (egglog). A pattern with ``matches_per_rule`` matches is matched
        everywhere next time."""
        limit = self.limits.matches_per_rule
        (self.truncated.add if n >= limit else self.truncated.discard)(i)
        ban = None if merging else min(self.limits.ban_matches << self.bans[i], limit)
        if ban is not None and new > ban:
            self.ban_until[i] = it + (self.limits.ban_iterations << self.bans[i])
            self.bans[i] += 1
            self.rep.bans += 1
            self.truncated.add(i)  # the dirty classes of its ban are not kept
            self.last.pop(i, None)  # its matches are dropped, not applied: none may be replayed
            return False
        if whole:
            self.last[i] = (it, n, held)  # all of them applied (or refused) next
        return True

    def _replay(self, i: int, last: tuple) -> "_Replayed":
        """The matches of pattern ``i`` at the last search, which nothing since has changed: as
        many as then (for the match limit and the bans), none to apply (each was applied, found
        seen, or refused for a reason that still holds)."""
        self.rep.replayed += 1
        return _Replayed(last[1])

    def _unban(self, it: int) -> bool:
        """Lift the bans (True if any was on): the phase is not over while a rule is banned."""
        on = [p for p, until in self.ban_until.items() if until > it]  # skipped or dropped at ``it``
        for p in on:
            self.ban_until[p] = it + 1
        return bool(on)

    def _apply_all(self, eg: EGraph, found: list[EMatch], t0: float,
                   merging: bool = False) -> tuple[StopReason | None, bool]:
        """Apply ``found`` (a merge round: the largest merges first, until the round has grown
        the e-graph by ``Limits.merge_growth``; the merges left are counted as held)."""
        self.weight_memo = {}
        self.rank = eg.ranks() if any(m.pattern in self.tops for m in found) else {}
        t, gate0 = time.perf_counter(), self.rep.seconds["proof gate"]
        before, changed, stop = len(eg), False, None
        room = before * (1 + self.limits.merge_growth) if merging else float("inf")
        found.sort(key=lambda m: m.pattern in self.grows)  # stable: folds and merges before growth
        for k, m in enumerate(found):
            if len(eg) > room:
                self.rep.held += len(found) - k
                break
            changed |= self._apply(eg, m)
            if len(eg) > self.limits.nodes:
                stop = StopReason.NODE_LIMIT
                break
            if time.perf_counter() - t0 > self.limits.seconds:
                stop = StopReason.TIME_LIMIT
                break
        eg.rebuild()
        self.rep.seconds["apply"] += time.perf_counter() - t - (self.rep.seconds["proof gate"] - gate0)
        return stop, changed or len(eg) != before

    def _apply(self, eg: EGraph, m: EMatch) -> bool:
        """Add the right side of one match and union it with the left; True if anything changed."""
        find, canonical = eg.find, eg.canonical
        binds = tuple([find(c) for c in m.binds])  # earlier matches may have merged them
        key = (m.pattern, binds, tuple([canonical(e) for e in m.apps]))
        if key in self.seen:
            self.rep.repeats += 1
            return False
        m = m._replace(binds=binds)
        pat = self.rules.patterns[m.pattern]
        lookup, apps = eg.lookup, m.apps
        found = [lookup(e) for e in apps]  # the matched e-nodes' classes
        lhs = [found[j] if apps[j].k == k else lookup(apps[j]._replace(k=k)) for j, k in pat.outputs]
        if None in lhs:  # not yet seen: found again after the rebuild
            return self._reject("matched e-node gone (merged since the match)")
        gen = self._gen(eg, m, found)
        growing = pat.index in self.grows or (pat.index in self.maybe and self._grows_at(eg, pat, m))
        if growing and gen >= self.limits.growth:  # not seen: a union may lower a generation
            self.rep.held += 1
            return False
        self.seen.add(key)  # what follows answers the same for the same canonical match
        label = self.rep.label(pat.rule_id)
        const = [eg.const[c] for c in m.binds]  # binds are canonical (found above)
        if all(const):
            return self._reject("folded at compile time")
        types = eg.types
        var_t = tuple([types[c] for c in m.binds])
        at = (pat.index, var_t, tuple([(e.types, e.attrs) for e in m.apps]))  # what the instance is built from
        known = self.templates.get(at)  # [its right side, whether the gate admits it (None: not asked)]
        if known is None:  # (the Instantiator's own key reads fewer attributes, through a view of the match)
            view = _View(m.apps, eg)
            known = self.templates[at] = [self.inst.template(
                pat, view, Match(pat.index, tuple(range(len(m.apps))), tuple(Ref(c) for c in m.binds))), None]
        tpl = known[0]
        if tpl is None:
            return self._reject("right side does not fit the match's shapes")
        if pat.index in self.tops and eg.depends_on(m.binds, set(lhs), self.rank):
            return self._reject("would create a cycle")
        merged = None  # a merge's weights and data (:meth:`_merge`)
        if pat.index in self.multi:
            merged, why = self._merge(eg, m, tpl, const)
            if why is not None:
                return self._reject(why)
        if not self._admit(pat, m, at, known):
            return self._reject("instance not proven")
        if growing and pays(self._work(eg, m, True), tpl, const):
            growing = False  # cheaper at this match: a fold here (its classes keep the generation)
            self.rep.paying += 1
        made: list[list[int]] = []
        for t in tpl.nodes:
            kids = [m.binds[s[1]] if s[0] == "v" else made[s[1]][s[2]] for s in t.inputs]
            made.append(eg.add_app(t.op, t.attrs, kids, t.types, origin=label, gen=gen + (growing or pat.index in self.maybe)))
        changed = False
        for c, spec in zip(lhs, tpl.outputs):
            changed |= eg.union(c, m.binds[spec[1]] if spec[0] == "v" else made[spec[1]][spec[2]])
        if merged is not None:
            self.merged.setdefault(merged[0], {}).setdefault(merged[1], self.round)
        self.rep.by_rule[label] += 1
        return changed

    def _grows_at(self, eg: EGraph, pat, m: EMatch) -> bool:
        """Whether the rule grows at this match, its compile-time variables known."""
        key = (pat.index, tuple(eg.const[eg.find(c)] for c in m.binds))
        if key not in self.grows_at:
            known = frozenset(name for name, k in zip(pat.var_names, key[1]) if k)
            self.grows_at[key] = grows(pat.rule, known)
        return self.grows_at[key]

    @staticmethod
    def _gen(eg: EGraph, m: EMatch, found: list) -> int:
        """The generation of a match: the highest of its classes' (bound, and ``found``: the
        matched e-nodes' classes, None where one is gone)."""
        gen = eg.gen
        g = max((gen[eg.find(c)] for c in m.binds), default=0)
        for c in found:
            if c is not None and gen[c] > g:
                g = gen[c]
        return g

    def _merge(self, eg: EGraph, m: EMatch, tpl, const: list[bool]) -> tuple[tuple | None, str | None]:
        """What a merge merges (the weights its compile-time operands are made from, and its
        data classes; None where it has no compile-time operand) and why it is refused (None
        where it is not). A merge is refused where

        * two of its compile-time operands are made from a common weight and its data
          operands are one class: ``conv(x, w)`` and ``conv(x, w * s)``, a convolution before
          and after a batch norm was folded into it, or a merged kernel and one of its parts.
          The merged operator computes the shared part twice on the same data, for a value the
          graph needs once, so it pays only where it is priced below one of the matched
          operators alone (a wider kernel the cost model prices cheaper: then even half of it
          pays; :func:`~superopt.search.schedule.pays`). On other data (``conv(x0, w)`` and
          ``conv(x1, w)``) both are needed, and the merge stands;
        * the same weights were merged on the same data in an earlier merge round: the
          operators it merges are those merged then, in another form that the phase between
          made of that round's products (SqueezeNet: ``conv(x, enlarge(k))``, the 1x1
          convolution ``conv(x, k)`` at 3x3, merged again with ``conv(x, w)``), so it computes
          what that merge computes, in another layout.

        ``const``: which of the match's (canonical) binds are known at compile time."""
        names: set = set()
        shared = False
        for c, k in zip(m.binds, const):
            if k:
                got = eg.weights_in(c, self.weight_memo)
                shared = shared or not names.isdisjoint(got)
                names |= got
        if not names:
            return None, None
        key = frozenset(names), frozenset([c for c, k in zip(m.binds, const) if not k])
        if shared and len(key[1]) <= 1 and not pays(max(self._times(eg, m, True)), tpl, const):
            return None, "merge of operators sharing a weight"
        find = eg.find
        for data, r in self.merged.get(key[0], {}).items():
            if r < self.round and frozenset([find(c) for c in data]) == key[1]:
                return None, "merged in an earlier round"
        return key, None

    def _reject(self, why: str) -> bool:
        self.rep.rejected[why] += 1
        return False

    @staticmethod
    def _made(pat, var_t, apps) -> str | None:
        """What the instance of ``pat`` at a match is built from, as a digest (None where an
        attribute prints with an address): the code that builds it (:func:`code_digest`: the
        pattern and IR packages, and this module), the rule, its lift, the variables' types and
        the matched e-nodes' operators, attributes and types: one digest, one instance. The name
        starts with the code's version, ``VERSION:DIGEST``, so that the gate reads only the
        names stored by this version (:func:`~superopt.search.instance_proofs._part`: the rows
        of every earlier version were 60% of the store after a day's work on the code)."""
        if not _VERSION:
            _VERSION.append(hashlib.blake2b(repr((code_digest(), _SELF_DIGEST[0])).encode(), digest_size=6).hexdigest())
        text = repr((code_digest(), _SELF_DIGEST[0], pat.rule_id, pat.max_lift,
                     [(t.shape, t.dtype) for t in var_t],
                     [(e.op, e.k, e.attrs, [(t.shape, t.dtype) for t in e.types]) for e in apps]))
        if " at 0x" in text:
            return None
        return _VERSION[0] + ":" + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def _admit(self, pat, m: EMatch, key: tuple, known: list) -> bool:
        """Whether the gate admits the instance at a match; ``key``: (pattern, variables' types,
        the matched e-nodes' types and attributes), what it is built from; ``known``: its entry
        in ``templates`` (the right side, and the gate's answer once asked)."""
        if known[1] is None:
            t = time.perf_counter()
            var_t, tpl = key[1], known[0]
            build = lambda: instance_of(pat, var_t, [e.attrs for e in m.apps], tpl)  # noqa: E731
            made = self._made(pat, var_t, m.apps) if self.keyed else None
            known[1] = bool(self.gate.admit(pat.rule_id, build()) if made is None else
                            self.gate.admit_keyed(pat.rule_id, made, build))
            self.rep.seconds["proof gate"] += time.perf_counter() - t
            self.rep.instances_checked += 1
        return known[1]


def saturate(graph: Graph, rules: Sequence[Rule] | RuleSet, cost: CostModel, gate: Gate,
             limits: Limits = DEFAULT_LIMITS, labels: dict | None = None, use_ilp: bool = True) -> SaturationResult:
    """Equality saturation from ``graph`` under ``rules`` and extraction of the cheapest equal
    graph (see the module docstring); every rule instance used passes ``gate`` first."""
    if gate is None or not callable(getattr(gate, "admit", None)):
        raise SearchError("saturate needs a proof gate (an object with admit(rule_id, instance) -> bool)")
    limits.check()
    paused = gc.isenabled()
    gc.disable()  # the search allocates millions of small objects next to a large rule set:
    try:          # the cyclic collector's passes over them took a third of BERT's time
        return _saturate(graph, rules, cost, gate, limits, labels, use_ilp)
    finally:
        if paused:
            gc.enable()


def _saturate(graph, rules, cost, gate, limits, labels, use_ilp) -> SaturationResult:
    t0 = time.perf_counter()
    compiled = compile_rules(rules, graph)
    ruleset = compiled.ruleset
    rep = SaturationReport(limits=asdict(limits), rules=len(ruleset), rules_skipped=len(ruleset.skipped),
                           labels=dict(labels or {}))
    eg = EGraph()
    roots = eg.add_graph(graph)
    cost.assume_layout_of(graph)  # one-node prices at the convolution layout Inductor picks for it
    rep.nodes_before, rep.cost_before = _running(graph, cost), cost.graph_cost(graph)
    rep.stop_reason = _Runner(compiled, cost, gate, limits, rep).run(eg, t0)
    rep.enodes, rep.eclasses = len(eg), eg.class_count
    t = time.perf_counter()
    best, how = extract(eg, roots, graph, cost, limits.ilp_seconds if use_ilp else None, limits.ilp_gap,
                        limits.ilp_nodes)
    rep.seconds["extract"] = time.perf_counter() - t
    rep.extraction, rep.ilp_status, rep.gap, rep.dropped_for_cycles = how.method, how.status, how.gap, how.dropped
    rep.greedy_cost, rep.kept_original = how.greedy_cost, how.kept_original
    rep.cost_after = cost.graph_cost(best)
    if rep.cost_after > rep.cost_before:  # a greedy pick may be worse than the start
        best, rep.cost_after, rep.extraction = graph, rep.cost_before, rep.extraction + " (kept the input)"
    rep.nodes_after = _running(best, cost)
    rep.rules_applied = dict(how.origins) if best is not graph else {}
    rep.seconds["total"] = time.perf_counter() - t0
    return SaturationResult(best, rep, eg, graph)


def _running(g: Graph, cost: CostModel) -> int:
    const = constant_nodes(g)
    return sum(1 for i in g.compute_nodes() if i not in const)

