"""Extraction by an integer program (Tensat's, tightened), solved by HiGHS (scipy's: :mod:`.highs`).

A binary per e-node, a binary per costly multi-output application (paid once for all its
outputs), and order variables where cycles remain. Before the solver the program is shrunk
(:class:`Reduced`): classes that can be computed for free (weights, compile-time values, views
of them) are fixed to a free pick and leave the program; e-nodes that use their own class are
dropped, and so is an e-node *dominated* by another of its class (it uses a subset of the
other's classes and costs no less), which can only be picked where the other could be.

The rows: a root picks one e-node, every class at most one, and for every pair of classes
(user ``c``, used ``d``) the e-nodes of ``c`` that use ``d`` weigh no more than ``d``'s picks.
Tensat writes that row per e-node; with at most one pick per class the row per class pair is
as valid and much tighter: where alternatives of a class all use one value, per-e-node rows let
the relaxation pay a tenth of that value in each of ten alternatives (SqueezeNet's relaxation
was 29 against an optimum of 253, and HiGHS branched for seconds). Order constraints forbid
cycles among the classes that are still on one (:func:`ilp_choice`). HiGHS gets no starting
point (given the local search's pick as one, NASNet-A's program under the Inductor model took
2.7 s against 2.4 s without, the relaxation being weak: 953 against 1693): the program asks for
a pick cheaper than the local search's by more than the gap, and where there is none that pick is proven within the gap; the solver's lower bound
gives the gap otherwise.

**Part by part.** Some classes are in every pick (the roots, and what every alternative of such
a class needs, at any depth: :meth:`Reduced.parts`). Once those are known picked, the rows that
say "a user's pick needs them" always hold, and the program falls apart into independent parts
that meet only in them: on the zoo 12-430 parts, the largest 17-223 classes of 134-2,212
(NASNet-A: 97 of 2,212). Each part is its own program, asked as the whole was, against the known
pick's part; a part whose classes have one e-node left is forced and needs no solver. HiGHS's
time goes into the cuts at the root node, which grow faster than the program: NASNet-A's
program under the Inductor model took 1.6 s whole and 0.3 s in parts (0.12 s of it in 137
solver calls). The
whole pick's gap is shared out among the parts asked (see :func:`_by_parts`), so the answer
keeps its promise: the known pick within the gap, or a cheaper pick within the gap of the sum of
the parts' lower bounds. On the zoo (2 cores) the program then took 0.05-1.0 s (Inception-v3
under the Inductor model the slowest: two parts of 131 classes whose relaxations paid a third
of each merged convolution, 0.4 s each, until the cover rows below).

**Cover rows** (:func:`_covers`, programs of :data:`COVER_MIN` columns or more). The rows above
let the relaxation reach one value several ways at a fraction each, all ending in one shared
class picked at that fraction: Inception-v3's merged convolutions are reached as the
convolution, with its bias and after the ReLU, a third each (relaxation 124 against an optimum
of 426). A cover row says that a picked class holds one of a set of e-nodes (a *cover*, found by
walking down from it through cheap e-nodes), or picks its *anchor* class: ``picks(c) <=
picks(anchor) + sum(cover)``, valid for every acyclic pick (:func:`_walk` says why). With them
that relaxation is 407 (the other part of 131 classes 135 -> 465 of 479), and the two parts
took 0.07-0.1 s each against 0.4-0.5 s.
"""

from __future__ import annotations

import time
from collections import defaultdict

from .choice import Problem, on_cycles
from .highs import Result, SolverMissing, highs_core, run_highs
from ..pattern.egraph import ENode, scc_ranks

__all__ = ["SolverMissing", "ilp_choice", "EAGER_ORDER", "Reduced"]


#: at most this many classes on the reduced program's cycles are ordered from the first round on
EAGER_ORDER = 400
#: the share of the node budget spent asking for a pick more than the gap cheaper than the known one
PROVE_SHARE = 0.6
#: branch-and-bound nodes the program may take (all its solves together): the limit that decides
NODES = 2000
#: how far below a class :meth:`Reduced.required` looks for the classes all its e-nodes need
REQUIRED_DEPTH = 8
#: a program with at least this many e-node columns gets the cover rows: on the zoo, the parts of
#: Inception-v3 (332 and 662 columns) and ResNet-50 (559) whose relaxations were weak; the
#: smaller parts (BERT-base's 173, NASNet-A's up to 277) are decided at once and took a few
#: milliseconds longer each with the rows
COVER_MIN = 300
#: the cover rows walk through e-nodes costing at most this share of the part's dearest one
COVER_CHEAP = 0.01
#: classes a cover's walk may visit
COVER_CLASSES = 200


class Reduced:
    """The program's part of a :class:`Problem`: ``fixed`` (class -> its free pick), and per
    class left (``classes``, those the roots reach through the e-nodes kept) its candidate
    e-nodes with the classes they use that are not fixed (``kids``)."""

    def __init__(self, p: Problem):
        self.p = p
        self.fixed = _free_picks(p)
        self.cands: dict[int, list[ENode]] = {}
        self.kids: dict[ENode, frozenset] = {}
        self.instead: dict[ENode, ENode] = {}  # a dominated e-node -> the kept one that dominated it
        stack, seen = [r for r in p.roots if r not in self.fixed], set()
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            self.cands[c] = self._undominated(c)
            stack.extend(d for e in self.cands[c] for d in self.kids[e])
        self.classes = list(self.cands)
        self._ranks: tuple | None = None
        self._need: dict[frozenset, dict] = {}  # picked -> (class, depth) -> what it needs

    def _graph(self) -> tuple[dict[int, list[int]], dict[int, int]]:
        """Each class's used classes and strongly connected part (:func:`scc_ranks`), made once
        for :meth:`cyclic` and :meth:`parts`."""
        if self._ranks is None:
            succ = {c: sorted({d for e in self.cands[c] for d in self.kids[e]}) for c in self.classes}
            self._ranks = succ, scc_ranks(self.classes, succ)
        return self._ranks

    def _undominated(self, c: int) -> list[ENode]:
        p, find, fixed, kept = self.p, self.p.eg.find, self.fixed, []
        options = []
        for e in p.cands[c]:
            kids = {find(k) for k in e.kids}
            if c not in kids:
                options.append((p.app_cost[e.app], e, frozenset(k for k in kids if k not in fixed)))
        options.sort(key=lambda t: (t[0], len(t[2])))
        for cost, e, kids in options:
            by = next((f for kc, f, k in kept
                       if k <= kids and (kc == 0 or (len(f.types) == 1 and len(e.types) == 1 and kc <= cost))), None)
            if by is None:
                kept.append((cost, e, kids))
                self.kids[e] = kids
            else:
                self.instead[e] = by
        return [e for _, e, _ in kept]

    def required(self, classes: list[int] | None = None, picked: frozenset = frozenset(),
                 depth: int = REQUIRED_DEPTH) -> dict[int, set[int]]:
        """Per class with alternatives (of ``classes``, or all), the classes every one of its
        e-nodes needs (within ``depth`` steps) beyond those its e-nodes all use directly, and
        what those need: the cuts ``picks(c) <= picks(d)`` (where the alternatives of a class
        meet again). What is found below a class is kept for later calls (the parts solved ask
        for their own classes only: NASNet-A's 430 parts need a solver in 137). ``picked``:
        classes known picked (:meth:`parts`'s required ones, the same in every call), left
        out with all they need (picked too): a cut ``picks(c) <= 1`` says nothing."""
        memo = self._need.setdefault(picked, {})

        def need(c: int, h: int) -> frozenset:
            if h == 0 or c in picked:
                return frozenset()
            if (c, h) not in memo:
                memo[(c, h)] = frozenset()  # a cycle back to c within ``depth`` adds nothing
                sets = [frozenset().union(*([e_kids - picked] + [need(k, h - 1) for k in e_kids]))
                        for e_kids in (self.kids[e] for e in self.cands[c])]
                memo[(c, h)] = frozenset.intersection(*sets) if sets else frozenset()
            return memo[(c, h)]

        out = {}
        for c in self.classes if classes is None else classes:
            if len(self.cands[c]) > 1:
                common = frozenset.intersection(*(self.kids[e] for e in self.cands[c])) - picked
                implied = common.union(*(need(k, depth - 1) for k in common))
                extra = need(c, depth) - implied - {c}
                if extra:
                    out[c] = extra
        return out

    def parts(self) -> tuple[frozenset, list[list[int]]]:
        """The classes every pick of the program needs (the roots, and what every alternative of
        a needed class needs, at any depth), and the program's independent parts once those are
        known picked: a class that may go unpicked joins the classes that use it and those its
        e-nodes use, and the classes of a multi-output application join; a needed class joins
        nothing above it (the row "a user's pick needs it" holds always). The reduced e-graph
        must be acyclic (:meth:`cyclic` empty)."""
        rank = self._graph()[1]
        bit = {c: 1 << i for i, c in enumerate(self.classes)}
        need: dict[int, int] = {}  # class -> bit set of the classes every pick of it needs
        for c in sorted(self.classes, key=rank.__getitem__):  # the classes it uses first
            common = None
            for e in self.cands[c]:
                acc = 0
                for k in self.kids[e]:
                    acc |= bit[k] | need[k]
                common = acc if common is None else common & acc
            need[c] = common or 0
        roots = [r for r in dict.fromkeys(self.p.roots) if r in bit]
        mask = 0
        for r in roots:
            mask |= bit[r] | need[r]
        required = frozenset(c for c in self.classes if mask & bit[c])
        parent = {c: c for c in self.classes}

        def find(a: int) -> int:
            while parent[a] != a:
                parent[a] = a = parent[parent[a]]
            return a

        apps: dict[tuple, int] = {}
        for c in self.classes:
            for e in self.cands[c]:
                if len(e.types) > 1:
                    parent[find(apps.setdefault(e.app, c))] = find(c)
                for d in self.kids[e]:
                    if d not in required:
                        parent[find(d)] = find(c)
        parts: dict[int, list[int]] = {}
        for c in self.classes:
            parts.setdefault(find(c), []).append(c)
        return required, list(parts.values())

    def cyclic(self) -> set[int]:
        """The classes on a cycle of the reduced e-graph (only these need order variables)."""
        comp = self._graph()[1]
        size = defaultdict(int)
        for c in self.classes:
            size[comp[c]] += 1
        return {c for c in self.classes if size[comp[c]] > 1}


def _free_picks(p: Problem) -> dict[int, ENode]:
    """Per class that some free e-node computes from free classes only, such an e-node (found
    bottom up, so the picks never form a cycle): no program needs to price these."""
    eg, fixed = p.eg, {}
    waiting: dict[int, list] = defaultdict(list)  # class -> free e-nodes waiting on it
    left: dict[tuple, int] = {}
    ready = []
    for c in p.classes:
        for e in p.cands[c]:
            if p.app_cost[e.app] == 0:
                kids = {eg.find(k) for k in e.kids}
                left[(c, e)] = len(kids)
                for k in kids:
                    waiting[k].append((c, e))
                if not kids:
                    ready.append((c, e))
    while ready:
        c, e = ready.pop()
        if c in fixed:
            continue
        fixed[c] = e
        for key in waiting.pop(c, ()):
            left[key] -= 1
            if left[key] == 0:
                ready.append(key)
    return fixed


def ilp_choice(p: Problem, seconds: float, bound: float | None = None, gap: float = 0.0,
               eager: int = EAGER_ORDER, nodes: int = NODES,
               known: dict[int, ENode] | None = None) -> tuple[dict[int, ENode] | None, str, float | None]:
    """The integer program's acyclic pick (or None), the solver's status and its dual bound
    (no graph of the e-graph costs less, by the program's objective).

    Acyclicity: when at most ``eager`` classes lie on the reduced e-graph's cycles, they are
    ordered from the start; else it is lazy: the program is first solved with no order
    constraints, and while its pick has a cycle, solved again with order constraints over the
    classes found on the cycles so far. ``gap``: the relative gap at which HiGHS may stop (0:
    prove optimality). ``bound``: the objective of a known pick (the local search's), in place
    of a warm start. Within :data:`PROVE_SHARE` of the ``nodes`` the program asks for a pick
    more than ``gap`` cheaper than it: where there is none, the answer is None, the status says
    the known pick is within ``gap`` of the optimum and the dual bound is ``bound * (1 - gap)``
    (the proof HiGHS would need with the pick as its incumbent). Where that takes too many
    nodes (the optimum is just under the known pick), the rest go to the program with a pick no
    dearer than the known one, to ``gap``.

    ``nodes`` (branch-and-bound nodes, all rounds together) decides where the solver stops, so
    the answer does not depend on the machine's speed or load; ``seconds`` is a safety net
    only: where it stops the solver, the status says ``time limit``.

    ``known``: the known pick itself (its cost is then ``bound``). Where the reduced e-graph has
    no cycle and the program splits (:meth:`Reduced.parts`), it is solved part by part
    (:func:`_by_parts`), each part within ``nodes`` nodes; the status names the parts.

    >>> from superopt.pattern.egraph import EGraph
    >>> from superopt.cost import CostModel
    >>> from superopt.ir import GraphBuilder
    >>> b = GraphBuilder(); x = b.input("x", (64, 64))
    >>> eg = EGraph(); roots = eg.add_graph(b.build([b.op("relu", x)]))
    >>> choice, status, dual = ilp_choice(Problem(eg, roots, CostModel("h100")), 5.0)
    >>> sorted(e.op for e in choice.values()), status
    (['input', 'relu'], 'optimal')
    """
    highs_core()  # raises SolverMissing before any work
    deadline = time.perf_counter() + seconds
    red = Reduced(p)
    if not red.classes:  # every root computed for free
        return dict(red.fixed), "optimal", 0.0
    on_cycle = red.cyclic()
    if not on_cycle and (known is not None or bound is None):
        required, parts = red.parts()
        mine = None if known is None else _in_program(red, known)
        if len(parts) > 1 and (known is None or mine is not None):
            return _by_parts(red, required, parts, known, mine, gap, deadline, nodes)
    if known is not None:
        bound = sum(_choice_cost(red, known))
    prog = _Program(red)
    # few classes on cycles: order them at once, so the first answer is acyclic and the solver's
    # bound is the program's, not that of a program whose picks may support themselves in a cycle
    ordered: set[int] = on_cycle if len(on_cycle) <= eager else set()
    dual, budget = None, [int(PROVE_SHARE * nodes)]
    if bound is not None and gap > 0:  # first, within a share of the nodes: is the pick within the gap?
        cutoff = bound * (1 - gap)
        choice, status, dual = _rounds(p, prog, ordered, cutoff, gap, deadline, budget)
        if choice is not None:
            return choice, status, dual
        if status == "infeasible":  # no pick under the cutoff: the known one is within the gap
            return None, f"known pick within {100 * gap:g}% of the optimum", cutoff
    budget[0] += nodes - int(PROVE_SHARE * nodes)
    cutoff = None if bound is None else bound * (1 + 1e-9) + 1e-9  # then: one no dearer, to the gap
    choice, status, dual2 = _rounds(p, prog, ordered, cutoff, gap, deadline, budget)
    duals = [d for d in (dual, dual2) if d is not None]
    return choice, "known pick, nothing cheaper" if status == "infeasible" else status, max(duals) if duals else None


def _by_parts(red: Reduced, required: frozenset, parts: list[list[int]], known: dict[int, ENode] | None,
              mine: dict[int, ENode] | None, gap: float, deadline: float,
              nodes: int) -> tuple[dict[int, ENode] | None, str, float | None]:
    """:func:`ilp_choice` part by part (:meth:`Reduced.parts`), each its own program within
    ``nodes`` nodes (solving small parts together was slower: HiGHS's cuts at the root take
    longer on the joint program than on its parts, and the known pick decides most small parts
    in its presolve). With a ``known`` pick, each part is asked as the
    whole program is: a pick of the part more than ``gap`` cheaper than the known pick's part,
    else (node budget spent) one no dearer, to ``gap``; a part without one keeps the known pick's.
    The parts' picks put together; the lower bound is the sum of the parts' (each part within the
    gap of its bound, so is the sum). The answer is None where the known pick is kept whole.

    The gap asked of a part where the known pick is kept is the whole pick's: the parts whose
    pick is forced or costs nothing are exact, and their share of the gap goes to the others in
    proportion to their cost (a part of cost ``k`` is proven within ``gap * total / asked * k``,
    ``asked`` the cost of the parts asked). The whole pick is then within the gap: the parts
    kept lose at most ``gap * total * kept / asked <= gap * (exact + kept)`` (as ``kept <= asked``),
    and the parts solved cheaper are within the gap of their own bounds. Without it, BERT-base's
    twelve layers (its matrix products decided, 1% asked of what is left) took 2.2 s against 1.0."""
    choice, dual, limited, better = dict(red.fixed), 0.0, None, 0
    todo = []  # (part, the known pick's part and its cost)
    for part in parts:
        if all(len(red.cands[c]) == 1 for c in part):  # no alternatives: the pick is forced, and optimal
            pick, cost = _forced(red, required, part)
            choice.update(pick)
            dual += cost
            continue
        has = None if mine is None else {c: mine[c] for c in part if c in mine}
        own = None if has is None else _pick_cost(red, has)
        if own is not None and own <= 0:  # the known pick's part costs nothing: optimal
            choice.update(has)
        else:
            todo.append((part, has, own))
    # the gap is the whole pick's: the parts decided already (forced, free) leave their share of
    # it to the others, in proportion to their cost (see the docstring)
    asked = sum(own for *_, own in todo) if mine is not None else 0.0
    share = 1.0 if asked <= 0 else (dual + asked) / asked
    solved: dict = {}  # a program's every number -> HiGHS's answer (repeated blocks repeat parts)
    for part, has, own in todo:
        budget = [int(PROVE_SHARE * nodes)]
        res, cutoff, prog = None, None, None
        if own is not None and gap > 0:  # more than the gap cheaper than the known pick's part?
            cutoff = own * (1 - min(gap * share, 1.0))
            if _least_cost(red, part, required) > cutoff:  # no pick of the part is that cheap
                choice.update(has)
                dual += cutoff
                continue
            prog = _Program(red, part, required, red.required(part, required))
            res = _solve_part(prog, cutoff, gap, deadline, budget, solved)
            if res is not None and res.status == 2:  # none: the known part is within the gap
                choice.update(has)
                dual += cutoff
                continue
        if res is None or res.x is None:  # then one no dearer (or, with none known, any), to the gap
            budget[0] += nodes - int(PROVE_SHARE * nodes)
            cutoff = None if own is None else own * (1 + 1e-9) + 1e-9
            prog = prog or _Program(red, part, required, red.required(part, required))
            res = _solve_part(prog, cutoff, gap, deadline, budget, solved)
            if res is not None and res.status == 2 and has is not None:
                choice.update(has)
                dual += cutoff / (1 + 1e-9)  # nothing cheaper than the known part
                continue
        if res is None or res.x is None:
            stop = "time" if res is None or res.limit == "time" else "node"
            why = res.message if res is not None and res.status not in (1, 4) else f"{stop} limit, nothing found"
            return None, f"{why} (in a part of {len(part)} classes of {len(parts)} parts)", None
        if res.status != 0:  # a node or time limit, with a pick
            limited = limited or ("time" if res.limit == "time" else "node")
        if dual is not None:
            bound = None if res.mip_dual_bound is None else max(0.0, float(res.mip_dual_bound))
            dual = None if bound is None else dual + (bound if cutoff is None else min(bound, cutoff))
        picked = prog.choice(res.x)
        choice.update((c, picked[c]) for c in part if c in picked)
        better += 1
    status = f"{limited} limit, best found" if limited else "optimal" if gap == 0 else f"optimal within {100 * gap:g}%"
    if known is not None and not better and not limited:
        if sum(_choice_cost(red, choice)) >= sum(_choice_cost(red, known)) - 1e-9:
            return None, f"known pick within {100 * gap:g}% of the optimum ({len(parts)} parts)", dual
    return choice, f"{status} ({len(parts)} parts, {better} solved cheaper)" if known is not None else \
        f"{status} ({len(parts)} parts)", dual


def _solve_part(prog: "_Program", cutoff: float | None, gap: float, deadline: float, budget: list[int],
                solved: dict | None = None) -> Result | None:
    """One part's program with the objective at most ``cutoff``, within ``budget[0]`` nodes
    (taken off it); None where the safety net's time is spent. ``solved``: answers of programs
    solved before, by their every number, reused for an equal program (HiGHS answers one
    program alike each time; ResNeXt-50's 46 parts asked are 19 programs)."""
    left = deadline - time.perf_counter()
    if left <= 0 or budget[0] <= 0:
        return None
    res = prog.solve(set(), left, gap, cutoff, budget[0], solved)
    budget[0] -= max(res.nodes, 1)
    return res


def _pick_cost(red: Reduced, pick: dict[int, ENode]) -> float:
    """:meth:`_Program.cost_of` without the program: each costly application once."""
    cost, apps, total = red.p.app_cost, set(), 0.0
    for e in pick.values():
        if len(e.types) > 1 and cost[e.app] > 0:
            apps.add(e.app)
        else:
            total += cost[e.app]
    return float(total + sum(cost[a] for a in apps))


def _least_cost(red: Reduced, part: list[int], required: frozenset) -> float:
    """A lower bound on a part's every pick: its required classes each pick an e-node, and an
    application of ``n`` outputs serves ``n`` classes at most (so each pays a ``1/n`` share).
    Where it is above the cutoff the part has no cheaper pick, which HiGHS would prove
    (ResNeXt-50: 21 of the 46 parts asked)."""
    cost, total = red.p.app_cost, 0.0
    for c in part:
        if c in required:
            total += min(cost[e.app] / len(e.types) for e in red.cands[c])
    return total


def _in_program(red: Reduced, known: dict[int, ENode]) -> dict[int, ENode] | None:
    """The known pick as a pick of the program: the classes it makes live outside the fixed
    ones, each e-node the program dropped as dominated replaced by the one that dominated it
    (no dearer, over fewer classes: the pick stays acyclic and costs no more); None where the
    pick holds an e-node the program does not know (not a candidate of the problem)."""
    out, stack = {}, [r for r in red.p.roots if r not in red.fixed]
    while stack:
        c = stack.pop()
        if c in out:
            continue
        e = known.get(c)
        e = red.instead.get(e, e)
        if e not in red.kids or e not in red.cands.get(c, ()):
            return None
        out[c] = e
        stack.extend(red.kids[e])
    return out


def _forced(red: Reduced, required: frozenset, part: list[int]) -> tuple[dict[int, ENode], float]:
    """The pick of a part whose classes have one e-node each (the part's required classes and
    the classes of the part they use), and its cost (each application once)."""
    inside, pick, paid = set(part), {}, {}
    stack = [c for c in part if c in required]
    while stack:
        c = stack.pop()
        if c in pick:
            continue
        pick[c] = e = red.cands[c][0]
        paid[e.app] = red.p.app_cost[e.app]
        stack.extend(d for d in red.kids[e] if d in inside)
    return pick, sum(paid.values())


def _choice_cost(red: Reduced, choice: dict[int, ENode]):
    """The DAG costs of what a pick makes live (each application once)."""
    p, seen, paid = red.p, set(), set()
    stack = list(dict.fromkeys(p.roots))
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        e = choice[c]
        if e.app not in paid:
            paid.add(e.app)
            yield p.app_cost[e.app]
        stack.extend(p.eg.find(k) for k in e.kids)


def _rounds(p: Problem, prog: "_Program", ordered: set[int], cutoff: float | None, gap: float,
            deadline: float, budget: list[int]) -> tuple[dict[int, ENode] | None, str, float | None]:
    """:func:`ilp_choice`'s rounds with the objective at most ``cutoff`` (``ordered`` grows in
    place), within ``budget[0]`` nodes (the nodes used are taken off it); the status
    ``infeasible`` where no pick is under the cutoff."""
    dual = None
    for rounds in range(1, len(prog.red.classes) + 2):
        left = deadline - time.perf_counter()
        if left <= 0 or budget[0] <= 0:
            return None, f"{'time' if left <= 0 else 'node'} limit, no acyclic pick in {rounds - 1} rounds", dual
        res = prog.solve(ordered, left, gap, cutoff, budget[0])
        budget[0] -= max(res.nodes, 1)
        if getattr(res, "mip_dual_bound", None) is not None and res.status in (0, 1):
            dual = float(res.mip_dual_bound)  # a bound of this round's program: valid for later rounds
            if cutoff is not None:  # a bound of the picks under the cutoff: the others cost more
                dual = min(dual, cutoff)
        if res.status == 2 and cutoff is not None:  # none under the cutoff (a relaxation if lazy)
            return None, "infeasible", cutoff
        stop = "time" if res.limit == "time" else "node"
        if res.x is None:
            return None, res.message if res.status != 1 else f"{stop} limit, nothing found", dual
        choice = prog.choice(res.x)
        cyc = on_cycles(p, choice)
        if not cyc:
            done = "optimal" if gap == 0 else f"optimal within {100 * gap:g}%"
            status = done if res.status == 0 else f"{stop} limit, best found" if res.status == 1 else res.message
            return choice, status + (f" ({rounds} rounds)" if rounds > 1 else ""), dual
        ordered |= cyc
    return None, "no acyclic pick", dual  # unreachable: each round orders a new class


def _walk(red: Reduced, c: int, inside: set[int], cheap: float, anchor: int | None = None,
          toward: set[int] = frozenset()) -> list[tuple[int, ENode]] | None:
    """A cover of class ``c``: e-nodes of the part one of which every acyclic pick that picks
    ``c`` holds, unless it picks ``anchor`` (None: no anchor). The walk starts at ``c``; of
    each class it visits, an e-node that uses ``anchor`` is covered by it, an e-node costing
    more than ``cheap`` (or using no class of the part) joins the cover, and any other leads
    the walk into one of its classes (one only: any is picked with it; one reaching the
    anchor, ``toward``, if any). A pick that picks ``c`` follows its own e-nodes through the
    visited classes; as it is acyclic, it meets the anchor or an e-node of the cover. None
    where the walk passes :data:`COVER_CLASSES` classes."""
    cost = red.p.app_cost
    seen, stack, cover = {c}, [c], []
    while stack:
        v = stack.pop()
        for e in red.cands[v]:
            kids = red.kids[e]
            if anchor in kids:
                continue
            inner = [k for k in kids if k in inside]
            if cost[e.app] > cheap or not inner:
                cover.append((v, e))
            elif not any(k in seen for k in inner):
                k = min(inner, key=lambda k: (k not in toward, k))
                seen.add(k)
                stack.append(k)
        if len(seen) > COVER_CLASSES:
            return None
    return cover


def _covers(red: Reduced, classes: list[int], inside: set[int],
            required: frozenset) -> list[tuple[int, list[tuple[int, ENode]], int | None]]:
    """The cover rows of a part (see :class:`_Program`): per class with alternatives, its cover
    through the part's cheap e-nodes, and covers anchored at the class that the costly
    e-nodes of that cover use most (by cost), through cheap e-nodes and through any."""
    cost = red.p.app_cost
    cheap = COVER_CHEAP * max((cost[e.app] for c in classes for e in red.cands[c]), default=0.0)
    users: dict[int, set[int]] = defaultdict(set)
    for c in classes:
        for e in red.cands[c]:
            for k in red.kids[e]:
                users[k].add(c)
    out = []
    for c in classes:
        if len(red.cands[c]) < 2:
            continue
        cover = _walk(red, c, inside, cheap)
        if not cover:
            continue
        out.append((c, cover, None))
        weight: dict[int, float] = defaultdict(float)
        for _, e in cover:
            for k in red.kids[e]:
                if k in inside and k not in required:
                    weight[k] += cost[e.app]
        if not weight:
            continue
        d = max(sorted(weight), key=weight.__getitem__)
        toward, stack = {d}, [d]  # the classes that reach the anchor
        while stack:
            for u in users[stack.pop()]:
                if u not in toward:
                    toward.add(u)
                    stack.append(u)
        for through in (cheap, float("inf")):
            more = _walk(red, c, inside, through, d, toward)
            if more is not None:
                out.append((c, more, d))
    return out


class _Program:
    """The integer program of a :class:`Reduced` problem (see the module docstring): the rows
    that do not depend on the ordered classes are built once."""

    def __init__(self, red: Reduced, part: list[int] | None = None, required: frozenset = frozenset(),
                 cuts: dict[int, set[int]] | None = None):
        """The program of ``red``, or of one of its independent ``part``s (see :meth:`Reduced.parts`),
        where the ``required`` classes are picked and the rows of a class outside the part are
        left out (it is required: they hold); ``cuts``: :meth:`Reduced.required`'s, if known."""
        import numpy as np
        self.red, cost = red, red.p.app_cost
        classes = red.classes if part is None else part
        inside = set(classes)
        self.enodes = [(c, e) for c in classes for e in red.cands[c]]
        self.col = {(c, e): i for i, (c, e) in enumerate(self.enodes)}
        apps = list(dict.fromkeys(e.app for _, e in self.enodes if len(e.types) > 1 and cost[e.app] > 0))
        self.app_col = {a: len(self.enodes) + i for i, a in enumerate(apps)}
        self.base = len(self.enodes) + len(apps)
        self.obj = np.zeros(self.base)
        for (c, e), i in self.col.items():
            if e.app not in self.app_col:
                self.obj[i] = cost[e.app]
        for a, i in self.app_col.items():
            self.obj[i] = cost[a]
        self.rows, self.cols, self.vals, self.lo, self.hi = [], [], [], [], []
        picks = {c: [(self.col[(c, e)], 1.0) for e in red.cands[c]] for c in classes}
        for c in dict.fromkeys(r for r in red.p.roots if r in picks):
            self._row(picks[c], 1.0, 1.0)
        self.uses: dict[tuple[int, int], list[int]] = defaultdict(list)  # (user, used) -> e-node columns
        for c in classes:
            self._row(picks[c], 1.0 if c in required else 0.0, 1.0)
            for e in red.cands[c]:
                for d in red.kids[e]:
                    if d in inside:
                        self.uses[(c, d)].append(self.col[(c, e)])
                if e.app in self.app_col:
                    self._row([(self.col[(c, e)], 1.0), (self.app_col[e.app], -1.0)], -np.inf, 0.0)
        for (c, d), cols in self.uses.items():
            self._row([(i, 1.0) for i in cols] + [(j, -v) for j, v in picks[d]], -np.inf, 0.0)
        cuts = red.required() if cuts is None else cuts
        for c in classes:
            for d in cuts.get(c, ()):
                if d in inside:
                    self._row(picks[c] + [(j, -v) for j, v in picks[d]], -np.inf, 0.0)
        if len(self.enodes) >= COVER_MIN:
            for c, cover, d in _covers(red, classes, inside, required):
                self._row([(self.col[x], 1.0) for x in cover] + [(j, -v) for j, v in picks[c]]
                          + ([] if d is None else picks[d]), 0.0, np.inf)

    def _row(self, entries, low, high, into=None):
        rows, cols, vals, lo, hi = into or (self.rows, self.cols, self.vals, self.lo, self.hi)
        r = len(lo)
        for j, v in entries:
            rows.append(r), cols.append(j), vals.append(v)
        lo.append(low), hi.append(high)

    def solve(self, ordered: set[int], seconds: float, gap: float = 0.0, cutoff: float | None = None,
              nodes: int | None = None, solved: dict | None = None) -> Result:
        """HiGHS on the program with order variables for the classes in ``ordered`` (a class
        that picks an e-node using another ordered class comes after it) and the objective at
        most ``cutoff``; ``solved``: earlier answers by the program's numbers (an answer the
        time limit cut is not kept)."""
        import numpy as np
        extra = ([], [], [], [], [])
        order = {c: self.base + i for i, c in enumerate(sorted(ordered))}
        n = self.base + len(order)
        eps, big = 1.0 / (len(order) + 1), 2.0
        rows0 = len(self.lo)
        for (c, d), cols in self.uses.items():
            if c in order and d in order:
                self._row([(order[c], 1.0), (order[d], -1.0)] + [(i, -big) for i in cols], eps - big, np.inf, extra)
        if cutoff is not None:
            self._row([(j, v) for j, v in enumerate(self.obj) if v], -np.inf, cutoff, extra)
        rows = np.array(self.rows + [r + rows0 for r in extra[0]], dtype=np.int64)
        cols = np.array(self.cols + extra[1], dtype=np.int64)
        vals = np.array(self.vals + extra[2], dtype=np.float64)
        integrality = np.ones(n)
        integrality[self.base:] = 0
        obj = np.concatenate([self.obj, np.zeros(len(order))])
        lo, hi = np.array(self.lo + extra[3]), np.array(self.hi + extra[4])
        key = None
        if solved is not None:
            key = b"".join(a.tobytes() for a in (obj, rows, cols, vals, lo, hi, integrality)) + \
                repr((len(obj), len(lo), len(rows), gap, nodes)).encode()
            if key in solved:
                return solved[key]
        res = run_highs(obj, (rows, cols, vals), lo, hi, integrality, seconds, gap, nodes)
        if key is not None and res.limit != "time":
            solved[key] = res
        return res

    def cost_of(self, pick: dict[int, ENode]) -> float:
        """The objective of a pick of this program's classes (each costly application once)."""
        apps = {e.app for e in pick.values() if e.app in self.app_col}
        return float(sum(self.obj[self.col[(c, e)]] for c, e in pick.items()) + sum(self.obj[self.app_col[a]] for a in apps))

    def choice(self, x) -> dict[int, ENode]:
        """The picked e-node of each class of the program, and the fixed classes' free picks."""
        out = dict(self.red.fixed)
        for (c, e), i in self.col.items():
            if x[i] > 0.5:
                out[c] = e
        return out
