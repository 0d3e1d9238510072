"""Named operator sets with the input tensors they are enumerated over (``--ops NAME``).

A *family* is a small operator set and an input set that speak one kind of model, each
enumerated on its own to N=3 (the space grows about 50x per operator, and a family of five or
six operators at N=3 takes seconds to a minute), so that the shipped database covers CNNs and
transformers without one enumeration of every operator together. Sizes are distinct per role
(batch 2, channels 4 in and 6 out, a 5x7 image; batch 2, sequence 3, features 5 in and 7 out),
so that no two dimensions of a rule are equal by accident: a size a rule shares between two
tensors is one the rule needs shared.

``taso`` and ``transformer`` are the older matrix-level presets (rank-2 data), kept for the CLI
and for the classic rules of TASO's paper.

>>> sorted(FAMILIES) == sorted(SHIPPED)
True
>>> [(s.name, s.shape) for s in INPUT_SETS["linear"]][:3]
[('x0', (2, 3, 5)), ('x1', (2, 3, 5)), ('y0', (2, 3, 14))]
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.types import TensorType

__all__ = ["InputSpec", "Family", "FAMILIES", "SHIPPED", "OP_PRESETS", "INPUT_SETS", "PRESET_INPUTS",
           "PRESET_WEIGHT_OPS"]


@dataclass(frozen=True)
class InputSpec:
    """One input tensor of the generated graphs."""

    name: str
    shape: tuple[int, ...]
    weight: bool = False

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape)


def _inputs(*items) -> tuple[InputSpec, ...]:
    """``(name, shape)`` for data, ``(name, shape, True)`` for a weight."""
    return tuple(InputSpec(it[0], tuple(it[1]), *it[2:]) for it in items)


@dataclass(frozen=True)
class Family:
    """An operator set, its inputs, its N, and the operators that take weights only there."""

    name: str
    ops: tuple[str, ...]
    inputs: tuple[InputSpec, ...]
    max_ops: int = 3
    weight_ops: tuple[str, ...] = ()
    doc: str = ""


# CNN tensors: image [N=2, C=4, H=5, W=7], kernels [O=6, C=4, kh, kw], bias or scale [O,1,1], an
# input-channel vector [C,1,1], the output of two merged convolutions [N, 2*O, H, W], and a bias
# vector [O] as conv2d_bias takes it
_IMG2 = (2, 12, 5, 7)
_IMG, _K3, _K1, _K13, _K31, _BIAS, _CVEC = (2, 4, 5, 7), (6, 4, 3, 3), (6, 4, 1, 1), (6, 4, 1, 3), (6, 4, 3, 1), \
    (6, 1, 1), (4, 1, 1)
# sequence tensors: [B=2, S=3, D=5], weights [D, E=7], biases [E], feature vectors [D], the output
# of two merged linears [B, S, 2*E];
# channels-last images [N=2, H=3, W=5, C=7] with weights [C, 11] and biases [11], and a linear's
# output [N, H, W, 11]
_SEQ2, _NHWC2 = (2, 3, 14), (2, 3, 5, 11)
# rank-2 activations [B=3, D=5] (MLPs, classifier heads, flattened features) and two merged
# linears' output [B, 2*E]: the search matches a rule only at its own rank by default
_ROWS, _ROWS2 = (3, 5), (3, 14)
_SEQ, _W, _B, _G, _NHWC, _W4, _B4 = (2, 3, 5), (5, 7), (7,), (5,), (2, 3, 5, 7), (7, 11), (11,)
# rank-1 vectors [6] and two of them concatenated [12]; a second linear's weight [7, 4] (chains)
_VEC, _VEC2, _W2 = (6,), (12,), (7, 4)
# grouped kernels on a 4-channel image: depthwise [4, 1, 3, 3] (groups 4), [6, 2, 3, 3] (groups 2)
_DW, _G2 = (4, 1, 3, 3), (6, 2, 3, 3)
_OVEC = (6,)

_FAMILIES = (
    Family("cnn", ("conv2d", "add", "relu", "concat", "split", "enlarge"),
           _inputs(("x0", _IMG), ("x1", _IMG), ("y0", _IMG2, ), ("w0", _K3, True), ("w1", _K3, True),
                   ("k0", _K1, True), ("b0", _BIAS, True), ("b1", _BIAS, True)),
           doc="convolutions with a bias epilogue and a fused relu: conv of a sum, sum of convs, two convs of "
               "one image as one (same or 1x1 and 3x3 kernels), bias and relu through concat and split"),
    Family("cnn_scale", ("conv2d", "mul", "add", "reshape"),
           _inputs(("x0", _IMG), ("x1", _IMG), ("w0", _K3, True), ("s0", _BIAS, True), ("c0", _CVEC, True)),
           weight_ops=("reshape",),
           doc="per-channel scales folded into kernels (batch norm, layer scale): mul(conv(x, w), s) = "
               "conv(x, w * s), conv(x * c, w) = conv(x, w * c)"),
    Family("cnn_bias", ("conv2d", "conv2d_bias", "add", "relu", "reshape"),
           _inputs(("x0", _IMG), ("w0", _K3, True), ("b0", _BIAS, True)),
           weight_ops=("reshape",),
           doc="a convolution with a bias operand (conv2d_bias: one kernel) made from a convolution and the "
               "per-channel add after it (a folded batch norm's shift), and taken back apart. One bias, "
               "[O,1,1]: with an [O] bias too, add(conv(x, w), reshape(v)) = conv2d_bias(x, w, v) taken apart "
               "and made again stacks reshapes on the bias, a new e-class per convolution per iteration (the "
               "search never rewrites what reads weights alone, so no rule folds them back)"),
    Family("cnn_bias_relu", ("conv2d_bias", "relu"),
           _inputs(("x0", _IMG), ("w0", _K3, True), ("v0", _OVEC, True)),
           doc="the relu after a conv2d_bias fused into it, whatever computes its bias"),
    Family("cnn_kernels", ("conv2d", "add", "concat", "enlarge"),
           _inputs(("x0", _IMG), ("x1", _IMG), ("w0", _K3, True), ("k0", _K1, True), ("k1", _K13, True),
                   ("k2", _K31, True)),
           doc="1x1, 1x3, 3x1 and 3x3 kernels on one image merged through enlarge"),
    Family("eltwise", ("add", "mul", "relu", "concat", "split"),
           _inputs(("x0", _IMG), ("x1", _IMG), ("x2", _IMG), ("c0", _CVEC, True), ("c1", _CVEC, True)),
           doc="rank-4 elementwise algebra with per-channel operands: distributivity, associativity, "
               "relu, bias and scale through concat and split"),
    Family("eltwise1", ("add", "mul", "relu", "concat", "split"),
           _inputs(("x0", _VEC), ("x1", _VEC), ("x2", _VEC), ("y0", _VEC2)),
           doc="rank-1 elementwise algebra: distributivity, associativity, relu, through concat and split"),
    Family("eltwise2", ("add", "mul", "relu", "concat", "split"),
           _inputs(("x0", _ROWS), ("x1", _ROWS), ("x2", _ROWS), ("g0", _G, True), ("g1", _G, True)),
           doc="rank-2 elementwise algebra with feature vectors: the same at [B, D] (MLPs, heads)"),
    Family("cnn_groups", ("conv2d", "add", "relu", "concat", "split"),
           _inputs(("x0", _IMG), ("x1", _IMG), ("d0", _DW, True), ("d1", _DW, True), ("k0", _G2, True),
                   ("c0", _CVEC, True)),
           doc="grouped and depthwise convolutions (groups 2 and 4, from the kernels' shapes): sums, biases, "
               "relu, batch concat and split through them"),
    Family("matmul_chain", ("matmul", "add", "transpose"),
           _inputs(("x0", _SEQ), ("x1", _SEQ), ("w0", _W, True), ("w1", _W2, True), ("w2", _W, True),
                   ("b0", _B, True)),
           doc="chains of linear layers: associativity (x w0) w1 = x (w0 w1), with the weight product folded "
               "at compile time, distributivity and transposes"),
    Family("linear", ("matmul", "add", "mul", "gelu", "concat", "split"),
           _inputs(("x0", _SEQ), ("x1", _SEQ), ("y0", _SEQ2), ("w0", _W, True), ("w1", _W, True),
                   ("b0", _B, True), ("b1", _B, True)),
           doc="linear layers with bias on [B,S,D] sequences: two linears of one input as one, biases and "
               "activations through last-axis concat and split, a scale after a linear into its weight"),
    Family("linear2d", ("matmul", "add", "gelu", "concat", "split"),
           _inputs(("x0", _ROWS), ("x1", _ROWS), ("y0", _ROWS2), ("w0", _W, True), ("w1", _W, True),
                   ("b0", _B, True), ("b1", _B, True)),
           doc="the same linear layers on rank-2 [B,D] activations (MLPs, classifier heads)"),
    Family("linear_scale", ("matmul", "mul", "add", "reshape"),
           _inputs(("x0", _SEQ), ("x1", _SEQ), ("w0", _W, True), ("g0", _G, True), ("s0", _B, True)),
           weight_ops=("reshape",),
           doc="feature scales before and after a linear folded into its weight"),
    Family("norm", ("layernorm", "softmax", "concat", "split", "add", "mul"),
           _inputs(("x0", _SEQ), ("x1", _SEQ), ("g0", _G, True), ("g1", _G, True)),
           doc="last-axis layer norm and softmax with concat and split over the other axes, affine parts"),
    Family("nhwc", ("matmul", "add", "mul", "gelu"),
           _inputs(("x0", _NHWC), ("y0", _NHWC2), ("w0", _W4, True), ("w1", _W4, True), ("b0", _B4, True),
                   ("b1", _B4, True)),
           doc="linear layers on channels-last images (ConvNeXt's pointwise convolutions), layer scale"),
)

#: the families of the shipped rule database, by name
FAMILIES: dict[str, Family] = {f.name: f for f in _FAMILIES}
#: the family names ``scripts/make_default_rules.py`` runs by default (all of them)
SHIPPED: tuple[str, ...] = tuple(FAMILIES)

_TASO_INPUTS = _inputs(("x0", (2, 4)), ("x1", (2, 4)), ("x2", (2, 4)), ("w0", (4, 4), True), ("w1", (4, 4), True),
                       ("i0", (2, 4, 5, 5)), ("k0", (4, 4, 3, 3), True), ("k1", (4, 4, 3, 3), True),
                       ("k2", (4, 4, 1, 3), True), ("k3", (4, 4, 3, 1), True), ("d0", (4, 1, 3, 3), True),
                       ("s0", (), True))

#: named input sets; ``--inputs`` takes one of these names or an explicit list
INPUT_SETS: dict[str, tuple[InputSpec, ...]] = {
    "taso": _TASO_INPUTS,
    "transformer": _inputs(("x0", (2, 4)), ("x1", (2, 4)), ("x2", (2, 4)), ("w0", (4, 4), True),
                           ("w1", (4, 4), True)),
    "all": _TASO_INPUTS,
    **{f.name: f.inputs for f in _FAMILIES},
}

#: named operator sets; ``--ops`` takes one of these names or a comma list
OP_PRESETS: dict[str, tuple[str, ...]] = {
    "taso": ("conv2d", "matmul", "add", "mul", "smul", "relu", "transpose", "concat", "split", "avgpool2d",
             "maxpool2d", "enlarge", "identity_matrix", "identity_conv", "pool_kernel"),
    "transformer": ("matmul", "add", "mul", "gelu", "softmax", "layernorm", "transpose", "reshape", "concat",
                    "split"),
    **{f.name: f.ops for f in _FAMILIES},
}

#: the input set a preset is enumerated over when ``--inputs`` is not given
PRESET_INPUTS: dict[str, tuple[InputSpec, ...]] = {name: INPUT_SETS[name] for name in OP_PRESETS}
#: the operators that take weights only under a preset
PRESET_WEIGHT_OPS: dict[str, tuple[str, ...]] = {f.name: f.weight_ops for f in _FAMILIES}
