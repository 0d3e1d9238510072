"""Weight folding computes layout operators in the weights' own dtype: the folded weights must be
the very bits the float64 evaluation gives (cast to the value's dtype), for layout chains, for
arithmetic on top of them, and for mixed dtypes."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from superopt.ir import GraphBuilder
from superopt.search.fold import EXACT_IN_OWN_DTYPE, fold_constants
from superopt.semantics.reference import REFERENCE


def _float64_fold(g):
    """Every folded value as the plain float64 reference gives it (the fold before the change)."""
    vals = {}
    for i, n in enumerate(g.nodes):
        if n.op == "weight":
            vals[i] = (np.asarray(g.data[n.name], dtype=np.float64),)
        elif all(r.node in vals for r in n.inputs) and n.op != "input":
            out = REFERENCE[n.op](n.attr, *(vals[r.node][r.index] for r in n.inputs))
            vals[i] = out if isinstance(out, tuple) else (out,)
    return vals


def _graph(data: list, chain: list[str], dtype: str):
    """matmul(x, f(w0, w1)) with f a chain of layout (and arithmetic) steps over two weights."""
    b = GraphBuilder()
    x = b.input("x", (2, 6), dtype=dtype)
    w = [b.weight(f"w{k}", data=d, dtype=dtype) for k, d in enumerate(data)]
    v = b.op("concat", *w, axis=0)  # (6, 3)
    for step in chain:
        if step == "transpose":
            v = b.op("transpose", b.op("transpose", v, perm=(1, 0)), perm=(1, 0))
        elif step == "reshape":
            v = b.op("reshape", b.op("reshape", v, shape=(18,)), shape=(6, 3))
        elif step == "split":
            a, c = b.op("split", v, axis=1, sizes=(1, 2))
            v = b.op("concat", c, a, axis=1)
        elif step == "mul":
            v = b.op("mul", v, v)
        elif step == "muladd":  # v * v + v: rounded once in float64, twice in float32
            v = b.op("add", b.op("mul", v, v), v)
    return b.build([b.op("matmul", x, v)])


arrays = st.integers(0, 2**31 - 1).map(lambda s: np.random.default_rng(s).standard_normal((3, 3)))


@settings(max_examples=60, deadline=None)
@given(st.lists(arrays, min_size=2, max_size=2), st.lists(st.sampled_from(["transpose", "reshape", "split", "mul", "muladd"]),
                                                        max_size=4),
       st.sampled_from(["float32", "float16", "mixed"]))
def test_folded_bits_match_float64(raw, chain, kind):
    # mixed: data stored in another dtype than the value's (float64 data of a float32 weight)
    dtypes = {"float32": (np.float32, np.float32), "float16": (np.float16, np.float16),
              "mixed": (np.float64, np.float32)}[kind]
    data = [r.astype(dt) for r, dt in zip(raw, dtypes)]
    g = _graph(data, chain, "float16" if kind == "float16" else "float32")
    folded = fold_constants(g)
    (name,) = [n.name for n in folded.nodes if n.op == "weight"]
    got = folded.data[name]
    mm = g.nodes[g.outputs[0].node]  # the matmul is not folded: its weight input is
    want = _float64_fold(g)[mm.inputs[1].node][mm.inputs[1].index].astype(got.dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    assert not any(np.shares_memory(got, d) for d in g.data.values())  # the folded weight is its own


def test_layout_set_is_pure_data_movement():
    """Each operator in the set returns only values taken from its input (or zeros)."""
    assert {"concat", "reshape", "transpose", "split"} <= EXACT_IN_OWN_DTYPE
    assert not EXACT_IN_OWN_DTYPE & {"add", "mul", "matmul", "conv2d", "cast", "batchnorm"}


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["mul", "add"]), st.sampled_from([np.float32, np.float16, np.float64, np.int64]),
       st.integers(0, 2**31 - 1))
def test_the_folds_ufuncs_are_the_reference_semantics(op, dtype, seed):
    """fold's float64 ufuncs give REFERENCE's values, and cast into float32 as they go, the values
    REFERENCE's result cast at the end gives (broadcast operands of mixed dtypes)."""
    from superopt.search.fold import _UFUNCS
    from superopt.semantics.reference import REFERENCE
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    b = (rng.standard_normal((4, 1, 1, 1)) * 8).astype(dtype)
    want = REFERENCE[op]({}, a.astype(np.float64), b.astype(np.float64))
    assert _UFUNCS[op](a, b, dtype=np.float64).tobytes() == want.tobytes()
    into = _UFUNCS[op](a, b, out=np.empty(want.shape, np.float32), dtype=np.float64, casting="unsafe")
    assert into.tobytes() == want.astype(np.float32).tobytes()
