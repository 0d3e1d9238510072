"""Faster, equal implementations of the fingerprint semantics' window operators.

The field's convolution and pooling (``superopt.semantics.field``) pad with ``np.pad`` and
contract a 7-axis einsum: clear, but about 130 µs per call on the generator's tiny tensors,
and the generator evaluates hundreds of thousands of them. Here the windows are gathered with
cached index arrays and contracted with an int64 matmul (16-bit limbs, exact like the field's),
several times faster. The results are identical (``tests/test_generate.py`` compares both on
random inputs); the field's table stays the source of truth for every other operator.

>>> from superopt.semantics import Field
>>> import numpy as np
>>> f = Field(0); t = fast_table(f); rng = np.random.default_rng(0)
>>> x, w = rng.integers(0, 2**31 - 1, (1, 2, 4, 4)), rng.integers(0, 2**31 - 1, (2, 2, 3, 3))
>>> a = {"stride": (1, 1), "padding": (1, 1), "groups": 1, "activation": "relu"}
>>> bool(np.array_equal(t["conv2d"](a, x, w), f.table["conv2d"](a, x, w)))
True
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..semantics import P

__all__ = ["fast_table", "gather_windows"]

_LIMB = 1 << 16


@lru_cache(maxsize=None)
def _window_index(h, w, kernel, stride):
    (kh, kw), (sh, sw) = kernel, stride
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    rows = (np.arange(oh)[:, None] * sh + np.arange(kh)[None, :])[:, None, :, None]
    cols = (np.arange(ow)[:, None] * sw + np.arange(kw)[None, :])[None, :, None, :]
    return rows, cols


def gather_windows(x: np.ndarray, kernel, stride, padding, fill=0) -> np.ndarray:
    """[N,C,H,W] -> [N,C,OH,OW,kh,kw], like ``semantics.reference.windows``."""
    n, c, h, w = x.shape
    ph, pw = padding
    if ph or pw:
        xp = np.full((n, c, h + 2 * ph, w + 2 * pw), fill, dtype=x.dtype)
        xp[:, :, ph:ph + h, pw:pw + w] = x
    else:
        xp = x
    rows, cols = _window_index(xp.shape[2], xp.shape[3], tuple(kernel), tuple(stride))
    return xp[:, :, rows, cols]


def _conv_exact(x, w, stride, padding, groups):
    n, c = x.shape[:2]
    o, ci, kh, kw = w.shape
    win = gather_windows(x, (kh, kw), stride, padding)
    oh, ow = win.shape[2:4]
    cols = win.reshape(n, groups, ci, oh, ow, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
    cols = cols.reshape(groups, n * oh * ow, ci * kh * kw)
    wg = w.reshape(groups, o // groups, ci * kh * kw).transpose(0, 2, 1)
    hi = np.matmul(cols, wg >> 16) % P
    y = (hi * _LIMB + np.matmul(cols, wg & (_LIMB - 1))) % P
    return y.reshape(groups, n, oh, ow, o // groups).transpose(1, 0, 4, 2, 3).reshape(n, o, oh, ow)


def fast_table(field) -> dict:
    """``field.table`` with conv2d, conv2d_bias, avgpool2d and maxpool2d replaced by the faster versions."""
    table = dict(field.table)

    def conv(a, x, w, b=None):  # conv2d, and conv2d_bias with its bias b
        y = _conv_exact(np.asarray(x, dtype=np.int64), np.asarray(w, dtype=np.int64),
                        a["stride"], a["padding"], a["groups"])
        if b is not None:
            y = (y + np.asarray(b, dtype=np.int64).reshape(-1, 1, 1)) % P
        return field.fn("relu", y) if a["activation"] == "relu" else y

    def avgpool(a, x):
        s = gather_windows(x, a["kernel"], a["stride"], a["padding"]).sum(axis=(4, 5)) % P
        inv = pow(a["kernel"][0] * a["kernel"][1], P - 2, P)
        return (s * inv) % P

    def maxpool(a, x):
        return gather_windows(x, a["kernel"], a["stride"], a["padding"], -1).max(axis=(4, 5))

    table.update(conv2d=conv, conv2d_bias=conv, avgpool2d=avgpool, maxpool2d=maxpool)
    return table
