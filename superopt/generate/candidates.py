"""From candidate pairs to pruned rules (see :mod:`superopt.generate.prune` for the steps).

Every pair ``member -> representative`` of a fingerprint class is rebuilt from its locators,
run through the cheap pruning steps on the compact graphs (common subgraph, common supergraph,
renaming), turned into a :class:`~superopt.ir.Rule`, checked under an independent field seed
(a disagreement is a fingerprint collision, dropped), and finally tested against the rules kept
so far, smallest first, for being an instance of one of them. The result is sorted by size and
is the same for the same settings, whatever the workers.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from ..ir import Rule
from ..pattern.attrs import PARAMETERS
from ..pattern.family import covers, shape_key
from .checkpoint import Store
from .expand import Expander, expander_for
from .graphs import Compact, fields_agree, level0_graphs, make_rule
from .instances import InstanceIndex, rule_size
from .levels import load_rows
from .parallel import Runner, SerialRunner
from .prune import common_subgraph, common_supergraph, operand_permutation, renaming_key
from .settings import Settings

__all__ = ["PruneStat", "collect_candidates", "screen_pair", "screen_chunk", "check_chunk"]

#: candidate pairs per worker task
_CHUNK = 2048


@dataclass
class PruneStat:
    """How many candidates each pruning step removed, in the order they run."""

    pairs: int = 0
    mismatched: int = 0
    common_subgraph: int = 0
    common_supergraph: int = 0
    renaming: int = 0
    collisions: int = 0
    instances: int = 0
    permutations: int = 0
    covered: int = 0
    rules: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    def steps(self) -> list[tuple[str, int, int]]:
        """``(step, removed, left)`` rows for the report."""
        left, rows = self.pairs, []
        for name in ("mismatched", "common_subgraph", "common_supergraph", "renaming", "collisions", "instances",
                     "permutations", "covered"):
            left -= getattr(self, name)
            rows.append((name.replace("_", " "), getattr(self, name), left))
        return rows


class _Graphs:
    """Rebuilds the compact graph of a locator from the stored frontiers and the records that
    the candidate pairs name (only those are read)."""

    def __init__(self, settings: Settings, store: Store, pairs: np.ndarray):
        self.frontiers = [store.get(f"level-{k}/frontier") for k in range(settings.max_ops)]
        self.rows, self.instances = [None], {}
        for k in range(1, settings.max_ops + 1):
            wanted = np.concatenate([pairs[pairs[:, 0] == k, 1], pairs[pairs[:, 2] == k, 3]])
            rows, inst = load_rows(store, k, wanted)
            self.rows.append(rows)
            self.instances.update(inst)
        self.level0 = level0_graphs(settings)

    def get(self, level: int, row: int) -> Compact:
        if level == 0:
            return Compact((), self.level0[row])
        parent, inst, ins = self.rows[level][row]
        op, attrs = self.instances[inst]
        return Compact(self.frontiers[level - 1][parent] + ((op, attrs, ins),))


def _outputs(p, c: Compact) -> list[int]:
    outs = list(c.sources) if not c.nodes else sorted(p.unused)
    return sorted(outs, key=lambda v: p.vh[v])


def _sources(c: Compact, n_src: int) -> set[int]:
    return {v for _, _, ins in c.nodes for v in ins if v < n_src} | set(c.sources)


def screen_pair(ex: Expander, a: Compact, b: Compact):
    """The cheap steps for one pair: ``(verdict, key, outputs of a, outputs of b)``, verdict
    ``"ok"`` or the name of the step (a :class:`PruneStat` field) that removes it."""
    if _sources(a, ex.n_src) != _sources(b, ex.n_src):
        return "mismatched", 0, None, None
    pa, pb = ex.unpack(a.nodes, values=False), ex.unpack(b.nodes, values=False)
    if common_subgraph(pa, pb, ex.n_src):
        return "common_subgraph", 0, None, None
    pa, pb = ex.unpack(a.nodes), ex.unpack(b.nodes)
    oa, ob = _outputs(pa, a), _outputs(pb, b)
    if [pa.vh[v] for v in oa] != [pb.vh[v] for v in ob]:
        return "mismatched", 0, None, None
    if common_supergraph(ex, pa, oa, pb, ob):
        return "common_supergraph", 0, None, None
    return "ok", renaming_key(ex, pa, oa, pb, ob), oa, ob


def screen_chunk(settings: Settings, chunk: int, items: list) -> tuple[int, list]:
    """Worker task: :func:`screen_pair` over ``(member, representative)`` compact pairs."""
    ex = expander_for(settings)
    return chunk, [screen_pair(ex, a, b) for a, b in items]


def check_chunk(settings: Settings, chunk: int, items: list) -> tuple[int, list]:
    """Worker task: for each survivor, whether it makes a rule that holds under independent
    fingerprints (False: the sides use different inputs, or a fingerprint collision)."""
    ex = expander_for(settings)
    out = []
    for a, oa, b, ob in items:
        rule = make_rule(ex, a, oa, b, ob)
        out.append("mismatched" if rule is None else "ok" if fields_agree(rule) else "collisions")
    return chunk, out


def _in_order(runner: Runner, fn, settings, chunks, total: int, desc: str, progress: bool) -> list:
    """Map ``fn`` over ``chunks`` (an iterable of item lists, made as they are sent) on the
    runner; the per-item results, in item order."""
    done: dict = {}
    bar = tqdm(total=total, desc=desc, unit="pair", disable=not progress, leave=False)
    n = 0
    for c, res in runner.map(fn, ((settings, c, chunk) for c, chunk in enumerate(chunks))):
        done[c] = res
        n = max(n, c + 1)
        bar.update(len(res))
    bar.close()
    return [r for c in range(n) for r in done[c]]


def _screen(settings, runner, graphs: _Graphs, pairs, stat: PruneStat, progress: bool) -> list:
    """The steps on compact graphs; returns the survivors ``(key, member, outs, rep, outs)``."""
    def chunks():
        for i in range(0, len(pairs), _CHUNK):
            yield [(graphs.get(ml, mr), graphs.get(rl, rr)) for ml, mr, rl, rr in pairs[i:i + _CHUNK]]

    seen, out = set(), []
    verdicts = _in_order(runner, screen_chunk, settings, chunks(), len(pairs), "prune", progress)
    for (ml, mr, rl, rr), (verdict, key, oa, ob) in zip(pairs, verdicts):
        if verdict != "ok":
            setattr(stat, verdict, getattr(stat, verdict) + 1)
        elif key in seen:
            stat.renaming += 1
        else:
            seen.add(key)
            out.append((key, graphs.get(ml, mr), oa, graphs.get(rl, rr), ob))
    return out


def _finish(settings, runner, survivors: list, stat: PruneStat, progress: bool) -> list[Rule]:
    """Rules from the survivors: collision check, then instances of smaller rules."""
    ex = expander_for(settings)
    items = [s[1:] for s in survivors]
    chunks = (items[i:i + _CHUNK] for i in range(0, len(items), _CHUNK))
    verdicts = _in_order(runner, check_chunk, settings, chunks, len(items), "check", progress)
    rules = []
    for (key, a, oa, b, ob), verdict in zip(survivors, verdicts):
        if verdict != "ok":
            setattr(stat, verdict, getattr(stat, verdict) + 1)
        else:
            rule = make_rule(ex, a, oa, b, ob)
            rules.append((rule_size(rule), key, rule))
    rules.sort(key=lambda t: t[:2])
    index, kept = InstanceIndex(), []
    weights = frozenset(s.name for s in settings.inputs if s.weight)
    for *_, rule in rules:
        if index.find(rule) is not None:
            stat.instances += 1
            continue
        index.add(rule)  # still prunes its instances
        if operand_permutation(rule, weights):
            stat.permutations += 1
        else:
            kept.append(rule)
    kept = collapse(kept, stat)
    stat.rules = len(kept)
    return kept


#: the parameters rules are collapsed over: all but the windows
EXACT_WINDOWS = tuple(k for k in PARAMETERS if k != "window")


def collapse(rules: list[Rule], stat: PruneStat | None = None) -> list[Rule]:
    """One rule per parametric family: a rule whose family an earlier (smaller) rule's covers
    (same shape, sizes and parameter attributes an assignment of the other's; see
    :func:`superopt.pattern.family.covers`) is dropped, since the search matches the family and proves
    each instance where it applies it. Rules at other windows (stride, padding, groups) are kept:
    they are the evidence the search reads to take a window as a parameter
    (:class:`superopt.pattern.compile.RuleSet`)."""
    kept, by_shape = [], {}
    for rule in rules:
        group = by_shape.setdefault(shape_key(rule), [])
        if any(covers(k, rule, EXACT_WINDOWS) for k in group):
            if stat is not None:
                stat.covered += 1
            continue
        group.append(rule)
        kept.append(rule)
    return kept


def collect_candidates(settings: Settings, store: Store, progress: bool = True,
                       runner: Runner | None = None) -> tuple[list[Rule], PruneStat]:
    """The pruned candidate rules of a finished enumeration (cached in ``store``); the
    per-pair work runs on ``runner``, the order-dependent steps here."""
    if store.has("candidates"):
        doc = store.get("candidates")
        return [Rule.from_json(d) for d in doc["rules"]], PruneStat(**doc["stat"])
    t0 = time.perf_counter()
    runner = runner or SerialRunner()
    pairs = [store.get(f"level-{k}/merged")["pairs"] for k in range(1, settings.max_ops + 1)]
    pairs = np.concatenate(pairs) if pairs else np.zeros((0, 4), np.int64)
    graphs = _Graphs(settings, store, pairs)
    stat = PruneStat(pairs=len(pairs))
    survivors = _screen(settings, runner, graphs, pairs.tolist(), stat, progress)
    rules = _finish(settings, runner, survivors, stat, progress)
    stat.seconds = time.perf_counter() - t0
    store.put("candidates", {"rules": [r.to_json() for r in rules], "stat": stat.to_json()})
    return rules, stat
