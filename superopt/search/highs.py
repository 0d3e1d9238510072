"""HiGHS, the integer-program solver of the extraction, called without importing ``scipy.optimize``.

scipy bundles HiGHS as the extension module ``scipy.optimize._highspy._core`` (scipy >= 1.14),
but importing ``scipy.optimize`` to reach it took 0.67 s of every ``superopt optimize`` run
(2 cores, after torch), about what the program itself takes on most zoo models. The extension
needs nothing of the package around it, so it is loaded from its file alone (12 ms) and called
the way ``scipy.optimize.milp`` calls it: the same solver, options and answers. Where that is
not possible (an older scipy, a build laid out otherwise, or ``scipy.optimize`` already
imported or blocked), ``scipy.optimize`` is imported and its ``_core`` or, failing that, its
``milp`` is used.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass

import numpy as np

__all__ = ["SolverMissing", "highs_core", "run_highs", "Result"]

_CORE = "scipy.optimize._highspy._core"
#: HiGHS's sub-MIP heuristics, off: the extraction gives the program the local search's pick as
#: a cutoff, and at the root they took half of Inception-v3's proof that no pick is 1% cheaper
#: (4.7 -> 2.6 s, the same answer; the other zoo programs' answers and times unchanged)
NO_SUBMIP = ("mip_heuristic_run_rins", "mip_heuristic_run_rens")
#: rounds a cut of HiGHS's pool may go unused before it leaves the pool (HiGHS's default: 30):
#: the extraction's programs are decided by the cuts at the root node, and the parts whose
#: relaxation is weak (merged convolutions reached three ways) make thousands; with 2, on the
#: 14 zoo programs (7 models, two cost models; the same answers) the program took 2.9 s of CPU
#: against 3.3 (Inception-v3 under the Inductor model 0.79 against 0.98, ResNet-50 0.16 against
#: 0.35; 5 or 10 were slower on ResNet-50, and the LP's own age limit gained nothing more)
CUT_POOL_AGE = 2
_loaded: list = []  # the extension loaded from its file, once


class SolverMissing(RuntimeError):
    """scipy (HiGHS) is not installed; greedy extraction is used."""


@dataclass
class Result:
    """What the extraction reads of a solve, as ``scipy.optimize.milp`` names it: ``status``
    0 optimal, 1 time limit, 2 infeasible, 3 unbounded, 4 other; ``x`` None without a
    solution."""

    status: int
    message: str
    x: np.ndarray | None = None
    fun: float | None = None
    mip_dual_bound: float | None = None
    limit: str | None = None  # "nodes" or "time" where that limit stopped the solver
    nodes: int = 0  # branch-and-bound nodes the solve took


def highs_core():
    """HiGHS's extension module, or None where only ``scipy.optimize.milp`` can be used;
    raises :class:`SolverMissing` without scipy."""
    if "scipy.optimize" in sys.modules:  # imported already (or blocked): nothing to save
        return _from_package()
    if not _loaded:
        _loaded.append(_from_file() or _from_package())
    return _loaded[0]


def _from_file():
    """The extension module loaded from its file, without its package (None if not found)."""
    try:
        spec = importlib.util.find_spec("scipy")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        raise SolverMissing("the integer program needs scipy (pip install 'superopt[ilp]'); "
                            "extraction by greedy and local search only")
    folder = os.path.join(os.path.dirname(spec.origin), "optimize", "_highspy")
    try:
        name = next(f for f in sorted(os.listdir(folder)) if f.startswith("_core.") and not f.endswith(".py"))
        core_spec = importlib.util.spec_from_file_location(_CORE, os.path.join(folder, name))
        core = importlib.util.module_from_spec(core_spec)
        core_spec.loader.exec_module(core)
    except (OSError, StopIteration, ImportError, AttributeError):
        return None
    return core if hasattr(core, "_Highs") else None


def _from_package():
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        raise SolverMissing("the integer program needs scipy (pip install 'superopt[ilp]'); "
                            "extraction by greedy and local search only") from None
    try:
        from scipy.optimize._highspy import _core
    except ImportError:
        return None
    return _core if hasattr(_core, "_Highs") else None


def run_highs(obj: np.ndarray, coo: tuple, lo: np.ndarray, hi: np.ndarray, integrality: np.ndarray,
              seconds: float, gap: float, nodes: int | None = None) -> Result:
    """Minimize ``obj @ x`` subject to ``lo <= A x <= hi`` (``coo``: A's rows, columns and
    values), ``0 <= x <= 1``, integer where ``integrality`` is 1, to the relative ``gap``,
    within ``nodes`` branch-and-bound nodes (the budget that decides: the same answer on a
    loaded machine as on an idle one) and ``seconds`` (the safety net: ``Result.limit`` says
    which limit stopped it)."""
    core = highs_core()
    if core is None:
        return _by_milp(obj, coo, lo, hi, integrality, seconds, gap, nodes)
    n, m = len(obj), len(lo)
    start, index, value = _csc(coo, n)
    lp = core.HighsLp()
    lp.num_col_, lp.num_row_ = n, m
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n, m
    lp.a_matrix_.format_ = core.MatrixFormat.kColwise
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = obj, np.zeros(n), np.ones(n)
    lp.row_lower_, lp.row_upper_ = _inf(lo, core), _inf(hi, core)
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = start, index, value
    lp.integrality_ = [core.HighsVarType(int(i)) for i in integrality]
    h = core._Highs()
    for key, val in (("output_flag", False), ("time_limit", float(seconds)), ("mip_rel_gap", float(gap)),
                     ("mip_max_nodes", int(min(nodes, 2**31 - 1)) if nodes is not None else 2**31 - 1),
                     ("mip_pool_age_limit", CUT_POOL_AGE), *((name, False) for name in NO_SUBMIP)):
        h.setOptionValue(key, val)  # (an option this HiGHS lacks is refused, not raised)
    h.passModel(lp)
    h.run()
    return _result(core, h, bool(np.any(integrality)))


def _result(core, h, mip: bool) -> Result:
    """The solve as :class:`Result` (statuses and messages as ``milp`` maps them; the dual
    bound of a program with integer columns)."""
    status, info = h.getModelStatus(), h.getInfo()
    s = core.HighsModelStatus
    nodes = getattr(s, "kSolutionLimit", None)  # the node limit (HiGHS counts it a solution limit)
    code = {s.kOptimal: 0, s.kTimeLimit: 1, s.kIterationLimit: 1, nodes: 1, s.kInfeasible: 2, s.kUnbounded: 3,
            s.kModelError: 2}.get(status, 4)
    message = f"{h.modelStatusToString(status)} (HiGHS status {int(status)})"
    limit = "time" if status == s.kTimeLimit else "nodes" if status in (nodes, s.kIterationLimit) else None
    found = status == s.kOptimal or (limit is not None and info.objective_function_value != core.kHighsInf)
    used = int(info.mip_node_count) if mip else 0
    if not found:
        return Result(code, message, limit=limit, nodes=used)
    x = np.array(h.getSolution().col_value)
    return Result(code, message, x, info.objective_function_value, info.mip_dual_bound if mip else None, limit, used)


def _csc(coo: tuple, n: int) -> tuple:
    """Compressed columns of a matrix given by (rows, columns, values), duplicates summed."""
    rows, cols, vals = coo
    key = cols * (int(rows.max()) + 1 if len(rows) else 1) + rows
    uniq, inv = np.unique(key, return_inverse=True)
    summed = np.zeros(len(uniq))
    np.add.at(summed, inv, vals)
    height = int(rows.max()) + 1 if len(rows) else 1
    ucols, urows = uniq // height, uniq % height
    start = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(ucols, minlength=n), out=start[1:])
    return start, urows.astype(np.int32), summed


def _inf(x: np.ndarray, core) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64).copy()
    x[np.isinf(x)] = np.sign(x[np.isinf(x)]) * core.kHighsInf
    return x


def _by_milp(obj, coo, lo, hi, integrality, seconds, gap, nodes=None) -> Result:
    """An older scipy: ``scipy.optimize.milp``."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix
    rows, cols, vals = coo
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), len(obj))).tocsr()
    res = milp(obj, constraints=LinearConstraint(a, lo, hi), integrality=integrality,
               bounds=Bounds(np.zeros(len(obj)), np.ones(len(obj))),
               options={"time_limit": seconds, "disp": False, "mip_rel_gap": gap,
                        **({"node_limit": int(nodes)} if nodes is not None else {})})
    limit = None if res.status != 1 else "time" if "time" in str(res.message).lower() else "nodes"
    return Result(res.status, res.message, res.x, res.fun, getattr(res, "mip_dual_bound", None), limit,
                  int(getattr(res, "mip_node_count", 0) or 0))
