"""The cost model: graph cost = sum of operator costs, in microseconds.

An operator's cost comes from a profile where it has an entry, else from the analytic
roofline of the device (scaled, when a profile is given, by the median measured/estimated
ratio of that operator in the profile, so measured and estimated costs stay comparable). Nodes computed from weights and constants alone cost nothing: they
are folded at compile time (:func:`constant_nodes` says which). Costs are cached by
``(op, attrs, input types)``, so pricing a rewritten graph only prices its new nodes.

>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder(); x = b.input("x", (1, 64, 56, 56)); w = b.weight("w", (64, 64, 3, 3))
>>> g = b.build([b.op("relu", b.op("conv2d", x, b.op("transpose", w, perm=(1, 0, 2, 3)), padding=(1, 1)))])
>>> m = CostModel("h100")
>>> sorted(constant_nodes(g))  # the weight and its transpose
[1, 2]
>>> round(m.graph_cost(g), 1)  # conv (0.5 us of memory traffic + 4 us launch) and relu
9.0
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..ir.graph import Graph, Node, Ref, make_node
from ..ir.ops import get_op
from ..ir.types import TensorType
from .analytic import DTYPE_BYTES, analytic_time, cost_facts, is_view, op_bytes
from ..errors import SuperoptError
from .devices import get_device
from .errors import ProfileError
from .fusion import ConvReluChain, Group, conv_relu_chains, fit_kernel_line, fusion_groups, group_bytes, linear_calls
from .layout import CONV_OPS, inductor_channels_last
from .profile import Profile, ProfileEntry, precision_dtype

__all__ = ["CostModel", "MODES", "constant_nodes", "is_constant_op"]

_CONSTANT_KINDS = ("constant",)


def is_constant_op(node: Node) -> bool:
    """A weight or a constant (identity matrix, ones...): known at compile time."""
    return node.op == "weight" or node.opdef.kind in _CONSTANT_KINDS


def constant_nodes(graph: Graph) -> set[int]:
    """Indices of nodes whose value depends only on weights and constants (opaque nodes never)."""
    out: set[int] = set()
    for i, n in enumerate(graph.nodes):
        if is_constant_op(n) or (n.inputs and n.opdef.kind == "compute" and all(r.node in out for r in n.inputs)):
            out.add(i)
    return out


def _calibrate(profile: Profile, model: "CostModel") -> dict[str, float]:
    """Measured / analytic time, median per operator (and over all, under ``*``): operators the
    profile lacks are priced as the analytic estimate times this, so that measured and estimated
    costs stay comparable."""
    import statistics
    ratios: dict[str, list] = {}
    for e in profile.entries.values():
        ins = [TensorType(tuple(s), e.dtype) for s in e.inputs]
        if get_op(e.op).cost is None:
            continue
        try:
            outs = make_node(e.op, [Ref(0, 0)] * len(ins), ins, e.attrs).types
        except SuperoptError:
            continue
        est = model.analytic_us(e.op, e.attrs, ins, outs)
        t = model._measured(e, nhwc=False)
        if est > 0 and t > 0:
            ratios.setdefault(e.op, []).append(t / est)
    out = {op: statistics.median(v) for op, v in ratios.items()}
    if ratios:
        out["*"] = statistics.median(r for v in ratios.values() for r in v)
    return out


MODES = ("eager", "graph", "inductor")
LAYOUTS = ("inductor", "choose")


class CostModel:
    """Prices operators and graphs on one device at one precision (see the module docstring).

    ``mode`` ``eager``: each operator is a kernel plus a launch (a profile's eager time, or
    its CUDA-graph time plus the launch overhead when interpolated; analytic estimates plus
    the device's launch overhead). ``graph``: the kernel alone, as inside a CUDA graph.
    ``inductor``: the graph as Inductor compiles it (:mod:`superopt.cost.fusion`), each fusion
    group one kernel, inside a CUDA graph (reduce-overhead); the search prices nodes one at a
    time, so there a pointwise node costs only the extra operands it reads.
    ``precision`` (``fp32``, ``tf32``, ``bf16``, ``fp16``; default the profile's) is the
    precision the model will run at, whatever the graph's dtypes. ``freezing`` (``inductor``
    only): Inductor's freezing passes run, which merge sibling matmuls on constant weights.

    In ``inductor`` mode a convolution costs its channels-last time when the graph runs
    channels-last: :meth:`channels_last_for` decides that per graph, with ``layout``
    ``inductor`` as Inductor's own rule will (:mod:`superopt.cost.layout`; right for a model
    the user compiles later), with ``choose`` whichever layout is cheaper by the profile, which
    the caller then imposes on Inductor (only with a profile, which measured both layouts;
    the ``superopt`` backend does it: in fp32 cuDNN runs
    channels-last convolutions through transposes, 1.1-1.5x slower than NCHW on an H100, yet
    Inductor's rule picks channels-last for most CNNs). The one-node prices the search adds up
    use the layout of the graph last given to :meth:`assume_layout_of` (the search's input), so
    a rewrite that flips the whole graph's layout is caught by the final :meth:`graph_cost`
    comparison, not by the search.

    ``conv_relu`` (``inductor`` mode, with a profile): the code runs a convolution's bias,
    residual add and ReLU in one cuDNN call (:mod:`superopt.codegen.cudnn`) where the profile's
    measured time of that call is less than Inductor's convolution plus epilogue kernel
    (:meth:`conv_relu_fusions`); only the ``superopt`` backend emits those calls, so the default
    is off.
    """

    def __init__(self, device: str = "h100", profile: Profile | None = None, mode: str = "eager",
                 precision: str | None = None, freezing: bool = True, layout: str = "inductor",
                 conv_relu: bool = False):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        # nothing measured to choose by (no profile, e.g. the CPU model): Inductor's rule stands
        self.layout = layout if profile is not None else "inductor"
        self.conv_relu = conv_relu and profile is not None and mode == "inductor"
        self.device = get_device(device)
        self.profile = profile
        self.mode = mode
        self.freezing = freezing
        self.precision = precision or (profile.precision if profile is not None else "fp32")
        if profile is not None and profile.precision != self.precision:
            raise ProfileError(f"the profile is for {profile.precision}, costs are asked for {self.precision}")
        self.dtype = precision_dtype(self.precision)
        self.itemsize = DTYPE_BYTES[self.dtype]
        self.launch_s = 0.0 if mode != "eager" else self.device.launch_s
        if profile is not None and profile.launch_overhead_us is not None and mode == "eager":
            self.launch_s = profile.launch_overhead_us * 1e-6
        self._cache: dict = {}
        self.channels_last = False  # the layout one-node prices assume (assume_layout_of)
        self.profile_hits = self.interpolated_hits = self.analytic_hits = 0
        self._generated = self._generated_points()
        self.kernel_floor_us, self.bandwidth = self._kernel_line()
        self.calibration = _calibrate(profile, self) if profile is not None else {}

    def _kernel_line(self) -> tuple[float, float]:
        """Floor and bandwidth of a generated (fused) kernel inside a CUDA graph: in ``inductor``
        mode the line measured on Inductor's own kernels where the profile has one
        (``settings.generated_kernel_line``), else fitted to the profile's pointwise operators
        (ATen kernels), else 2 us and 80% of the peak bandwidth. With Inductor's kernels measured
        at several sizes (:meth:`_generated_points`): the smallest one's time, and the bandwidth
        of the two largest."""
        if self._generated:
            (b0, t0), (b1, t1) = self._generated[-2:]
            if t1 > t0:  # (equal: no slope to read a bandwidth off; the line below)
                return self._generated[0][1], 1e6 * (b1 - b0) / (t1 - t0)
        pts = []
        line = self.profile.settings.get("generated_kernel_line") if self.profile is not None else None
        if self.mode == "inductor" and line:
            return float(line[0]), float(line[1])
        if self.profile is not None:
            for e in self.profile.entries.values():
                if e.graph_us is None or e.op in ("transpose", "concat", "enlarge") or get_op(e.op).cost is None:
                    continue
                if get_op(e.op).cost.fusion == "pointwise":
                    nbytes = sum(_numel(s) for s in e.inputs) * self.itemsize * 2
                    pts.append((nbytes, e.graph_us))
        fit = fit_kernel_line(pts)
        return fit if fit is not None else (2.0, 0.8 * self.device.bandwidth)

    def _generated_points(self) -> list[tuple[float, float]]:
        """``inductor`` mode: Inductor's own kernels as measured at several sizes (``(bytes, us)``,
        ``settings.generated_kernel_points``), their times made non-decreasing. Empty without."""
        raw = self.profile.settings.get("generated_kernel_points") if self.profile is not None else None
        if self.mode != "inductor" or not raw or len(raw) < 2:
            return []
        pts, top = [], 0.0
        for nbytes, t in sorted((float(b), float(t)) for b, t in raw):
            top = max(top, t)
            pts.append((nbytes, top))
        return pts

    def generated_us(self, nbytes: float) -> float:
        """One generated kernel that reads and writes ``nbytes``: interpolated between the
        measured sizes (:meth:`_generated_points`), past the largest along its last segment;
        else the line ``floor + bytes / bandwidth``. No line fits both ends: on an H100 a kernel
        took 1.5 us for 3 MB and 17 us for 50 MB (bf16: 1.1 us to 1.5 MB, then 4.3 for 25 MB),
        its bandwidth 4x higher while its data stays in the L2 cache."""
        pts = self._generated
        if not pts:
            return self.kernel_floor_us + 1e6 * nbytes / self.bandwidth
        if nbytes <= pts[0][0]:
            return pts[0][1]
        for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
            if nbytes <= b1:
                return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)
        (b0, t0), (b1, t1) = pts[-2], pts[-1]
        return t1 + (t1 - t0) * (nbytes - b1) / (b1 - b0)

    def assume_layout_of(self, graph: Graph) -> bool:
        """Price single nodes from now on at the convolution layout Inductor picks for ``graph``
        (``inductor`` mode; else nothing changes); returns whether that is channels-last."""
        self.channels_last = self.channels_last_for(graph)
        return self.channels_last

    def channels_last_for(self, graph: Graph, const: set[int] | None = None, groups: list | None = None,
                          layout: str | None = None, conv_relu: bool = True) -> bool:
        """Whether ``graph``'s convolutions run channels-last (``inductor`` mode; see the class
        docstring): Inductor's rule, or with ``layout`` (default :attr:`layout`) ``choose`` the
        cheaper layout, counting one copy kernel per 4-d graph input that channels-last converts
        and what the fused cuDNN calls save in each (``conv_relu=False``: not counted)."""
        return self._layout(graph, const, groups, layout, conv_relu)[0]

    def _layout(self, graph: Graph, const: set[int] | None, groups: list | None, layout: str | None,
                conv_relu: bool) -> tuple[bool, tuple | None]:
        """(:meth:`channels_last_for`, the :meth:`_fusions` in that layout where choosing it
        priced them, else None)."""
        if self.mode != "inductor":
            return False, None
        const = constant_nodes(graph) if const is None else const
        if (layout or self.layout) == "inductor":
            return inductor_channels_last(graph, const), None
        groups = self.groups(graph, const) if groups is None else groups
        convs = [k for k in groups if k.kind == "extern" and graph.nodes[k.nodes[0]].op in CONV_OPS]
        if not convs:
            return False, None
        fusions = {cl: self._fusions(graph, const, groups, cl, conv_relu) for cl in (False, True)}
        nchw, nhwc = (sum(self.group_cost(graph, k, cl) for k in convs) - fusions[cl][1] for cl in (False, True))
        cl = nhwc + self._conversions_us(graph) < nchw
        return cl, fusions[cl]

    def conv_relu_fusions(self, graph: Graph, layout: str | None = None) -> dict[int, ConvReluChain]:
        """The convolution + bias + residual + ReLU chains of ``graph`` (by their ``relu`` node)
        that run as one cuDNN call: with :attr:`conv_relu` on, those whose measured fused time
        (in the layout the graph runs in) is less than Inductor's convolution kernel plus its
        epilogue kernel. The chains sharing one epilogue kernel go together or not at all."""
        return self._plan(graph, layout)[2][0] if self.conv_relu else {}

    def _plan(self, graph: Graph, layout: str | None = None, conv_relu: bool = True) -> tuple:
        """``(groups, channels-last, (chains fused, us saved, kernels saved))``: how ``graph``
        runs under Inductor (``inductor`` mode), as :meth:`graph_cost`, :meth:`kernels` and
        :meth:`breakdown` price it."""
        const = constant_nodes(graph)
        groups = self.groups(graph, const)
        nhwc, fusions = self._layout(graph, const, groups, layout, conv_relu)
        return groups, nhwc, fusions if fusions is not None else self._fusions(graph, const, groups, nhwc, conv_relu)

    def _fusions(self, graph: Graph, const: set[int], groups: list[Group], nhwc: bool,
                 conv_relu: bool = True) -> tuple[dict, float, int]:
        """(chains fused by their relu node, microseconds saved, kernels saved); see
        :meth:`conv_relu_fusions` (nothing with :attr:`conv_relu` or ``conv_relu`` off)."""
        if not (self.conv_relu and conv_relu):
            return {}, 0.0, 0
        group_of = {i: k for k in groups for i in k.nodes}
        fused, saved, kernels = {}, 0.0, 0
        by_kernel: dict[int, tuple] = {}  # id of an epilogue kernel -> (its group, [(chain, conv group, us)])
        for ch in conv_relu_chains(graph, const).values():
            conv, epi = group_of.get(ch.conv), group_of.get(ch.relu)
            if ch.relu == ch.conv:  # conv2d_bias with its relu: one kernel for another
                t = self._conv_relu_us(graph, ch, nhwc) if conv is not None and len(conv.nodes) == 1 else None
                if t is not None and t < self.group_cost(graph, conv, nhwc):
                    fused[ch.relu] = ch
                    saved += self.group_cost(graph, conv, nhwc) - t
                    kernels += 1  # (priced as the convolution and a kernel for its bias and relu)
                continue
            if conv is None or epi is None or conv.kind != "extern" or len(conv.nodes) != 1 or epi.kind != "pointwise":
                continue
            t = self._conv_relu_us(graph, ch, nhwc)
            if t is not None:
                by_kernel.setdefault(id(epi), (epi, []))[1].append((ch, conv, t))
        for epi, items in by_kernel.values():
            gone = {i for ch, _, _ in items for i in ch.nodes}
            rest = [i for i in epi.nodes if i not in gone]
            before = self.group_cost(graph, epi, nhwc) + sum(self.group_cost(graph, conv, nhwc) for _, conv, _ in items)
            after = sum(t for *_, t in items) + (self.group_cost(graph, Group("pointwise", rest), nhwc) if rest else 0.0)
            if after < before:
                fused.update((ch.relu, ch) for ch, _, _ in items)
                saved += before - after
                kernels += 0 if rest else 1
        return fused, saved, kernels

    def _conv_relu_us(self, graph: Graph, ch: ConvReluChain, nhwc: bool) -> float | None:
        """The measured time of one chain's cuDNN call (None where the profile has none), plus
        reading the residual."""
        n = graph.nodes[ch.conv]
        attrs = dict(n.attr, activation="none") if n.op == "conv2d_bias" else n.attr  # measured as conv2d
        e = self.profile.lookup("conv2d", attrs, [graph.type_of(r) for r in n.inputs[:2]])
        t = None if e is None else (e.nhwc_relu_us if nhwc else e.relu_us)
        if t is None:
            return None
        return float(t) + (1e6 * graph.type_of(ch.residual).numel * self.itemsize / self.bandwidth
                           if ch.residual is not None else 0.0)

    def _conversions_us(self, graph: Graph) -> float:
        """Copying the 4-d graph inputs into channels-last memory: one pointwise kernel each."""
        return sum(self.generated_us(2 * graph.nodes[i].types[0].numel * self.itemsize)
                   for i in graph.inputs if len(graph.nodes[i].types[0].shape) == 4)

    def node_time(self, op: str, attrs: tuple, in_types: Sequence[TensorType], out_types: Sequence[TensorType]) -> float:
        """Microseconds for one application; ``attrs`` is a node's normalized attribute tuple."""
        key = (op, attrs, tuple(in_types), self.channels_last)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._node(op, dict(attrs), in_types, out_types)
        return hit

    def _node(self, op: str, attrs: Mapping, ins, outs) -> float:
        if self.mode != "inductor":
            return self.kernel_us(op, attrs, ins, outs)
        facts = cost_facts(op)
        if get_op(op).kind != "compute" and op != "opaque" or is_view(op, attrs, ins):
            return 0.0
        if facts.fusion == "pointwise":  # fused into a neighbour: only its extra operands move
            big = max(range(len(ins)), key=lambda k: ins[k].numel) if ins else None
            extra = sum(t.numel for k, t in enumerate(ins) if k != big) * self.itemsize
            return 1e6 * extra / self.bandwidth
        if facts.fusion == "reduction":
            nbytes = (sum(t.numel for t in ins) + sum(t.numel for t in outs)) * self.itemsize
            return self.generated_us(nbytes)
        return self.kernel_us(op, attrs, ins, outs)

    def kernel_us(self, op: str, attrs: Mapping, ins, outs, channels_last: bool | None = None) -> float:
        """One operator run as one kernel: measured, interpolated, or estimated (in that order).
        A convolution in ``inductor`` mode, channels-last (default: :attr:`channels_last`), costs
        its measured channels-last time where the profile has one. A time not measured at these
        shapes is never below that of a measured application it does all the work of
        (:meth:`Profile.contained`). A ``kernel`` node (superopt's fused kernel) costs the time
        measured for it on the device, which it carries."""
        if op == "kernel" and attrs.get("us"):
            return float(attrs["us"])
        if op == "conv2d_bias" and self.profile is not None:
            return self._conv_bias_us(attrs, ins, outs, channels_last)
        nhwc = op == "conv2d" and self.mode == "inductor" and (
            channels_last if channels_last is not None else self.channels_last)
        if self.profile is None:
            return self._estimate(op, attrs, ins, outs, nhwc)
        e = self.profile.lookup(op, attrs, ins)
        if e is not None:
            self.profile_hits += 1
            return self._measured(e, nhwc)
        t = self.profile.nearby_nhwc(op, attrs, ins) if nhwc else None
        if t is None:
            near = self.profile.nearby(op, attrs, ins)
            if near is not None:
                t = near[0] if self.mode == "eager" or near[1] is None else near[1]
        if t is not None:
            self.interpolated_hits += 1
        else:
            t = self._estimate(op, attrs, ins, outs, nhwc)
        return max(float(t), self._contained_floor(op, attrs, ins, outs, nhwc))

    def _conv_bias_us(self, attrs: Mapping, ins, outs, channels_last: bool | None) -> float:
        """``conv2d_bias`` with a profile, which measures convolutions as ``conv2d``: the plain
        convolution's time (its bias is the library call's epilogue, as for ``conv2d`` and a bias
        ``add``: :mod:`superopt.cost.fusion`; in ``inductor`` mode plus reading the bias, as a bias
        ``add`` node is priced, so that neither form wins ties). In ``inductor`` mode it also
        pays one pointwise kernel over its output, with or without its ReLU: Inductor peels the
        bias off a cuDNN convolution and runs it (and the ReLU) as a Triton kernel of its own,
        where a bias ``add`` node fuses into its neighbours' kernel. Priced as that add, the
        search took it for free and the written ResNeXt-50 (b16, bf16, H100) ran 3% slower
        (1.089-1.090x over RO against 1.122 without it, session 37). Elsewhere the ReLU is one
        pointwise kernel after the call."""
        t = self.kernel_us("conv2d", dict(attrs, activation="none"), ins[:2], outs, channels_last)
        if self.mode == "inductor":  # reading the bias, as the search prices a bias add (:meth:`_node`)
            t += 1e6 * ins[2].numel * self.itemsize / self.bandwidth
            return t + self.generated_us(2.0 * outs[0].numel * self.itemsize)
        if attrs.get("activation", "none") == "none":
            return t
        return t + self.kernel_us("relu", {}, outs, outs)

    def _contained_floor(self, op: str, attrs: Mapping, ins, outs, nhwc: bool) -> float:
        """The most of: a measured application this one does all the work of
        (:meth:`Profile.contained`), plus the roofline time of the work beyond it (so that a
        larger operator never ties with the smaller one it contains), or 0."""
        mine, floor = None, 0.0
        for e in self.profile.contained(op, attrs, ins):
            if mine is None:
                mine = self.analytic_us(op, attrs, ins, outs)
            e_ins = [TensorType(tuple(s), e.dtype) for s in e.inputs]
            try:
                e_outs = make_node(e.op, [Ref(0, 0)] * len(e_ins), e_ins, e.attrs).types
                beyond = max(mine - self.analytic_us(e.op, e.attrs, e_ins, e_outs), 0.0)
            except SuperoptError:
                beyond = 0.0
            floor = max(floor, self._measured(e, nhwc) + beyond)
        return floor

    def _measured(self, e: ProfileEntry, nhwc: bool) -> float:
        """An entry's time in this mode: channels-last where asked and measured, the kernel
        alone in ``graph`` and ``inductor`` modes, launch included in ``eager``."""
        if nhwc and e.nhwc_us is not None:
            return float(e.nhwc_us)
        return float(e.eager_us if self.mode == "eager" or e.graph_us is None else e.graph_us)

    def _estimate(self, op: str, attrs: Mapping, ins, outs, nhwc: bool) -> float:
        """The roofline, calibrated; a convolution no less than the nearest measured one scaled."""
        scale = self.calibration.get(op, self.calibration.get("*", 1.0))
        est = scale * self.analytic_us(op, attrs, ins, outs)
        est = est if self.mode == "eager" or est == 0 else max(est, self.kernel_floor_us)
        if op == "conv2d" and self.profile is not None:  # never below the estimate: a far neighbour scales badly
            t = self._like_nearest_conv(attrs, ins, nhwc)
            if t is not None:
                self.interpolated_hits += 1
                return max(t, est)
        self.analytic_hits += 1
        return est

    def _like_nearest_conv(self, attrs: Mapping, ins, nhwc: bool) -> float | None:
        """An unmeasured convolution at the speed of the nearest measured one
        (:meth:`Profile.nearest_conv`): its kernel time scaled by the FLOPs, plus its launch in
        ``eager`` mode."""
        near = self.profile.nearest_conv(attrs, ins, (lambda e: e.nhwc_us is not None) if nhwc else (lambda e: True))
        if near is None:
            return None
        e, scale = near
        kernel = e.nhwc_us if nhwc else (e.graph_us if e.graph_us is not None else e.eager_us)
        launch = e.eager_us - e.graph_us if self.mode == "eager" and e.graph_us is not None else 0.0
        return float(kernel * scale + max(launch, 0.0))

    def analytic_us(self, op: str, attrs: Mapping, ins, outs) -> float:
        """The roofline estimate in microseconds (opaque operators: their memory traffic)."""
        dtype = "tf32" if self.precision == "tf32" else self.dtype
        if op == "opaque":
            return 1e6 * (op_bytes(op, attrs, ins, outs) / self.device.bandwidth + self.launch_s)
        return 1e6 * analytic_time(op, attrs, ins, outs, self.device, self.launch_s, dtype=dtype)

    def cost_of(self, graph: Graph, i: int) -> float:
        n = graph.nodes[i]
        return self.node_time(n.op, n.attrs, [graph.type_of(r) for r in n.inputs], n.types)

    def graph_cost(self, graph: Graph, layout: str | None = None, conv_relu: bool | None = None) -> float:
        """Microseconds of one run: the sum of the operators' costs (sources and folded nodes
        excluded), or in ``inductor`` mode the sum over fusion groups (convolutions in the
        layout ``layout`` decides, default :attr:`layout`: ``inductor`` prices what Inductor's
        own rule makes of the graph), less what cuDNN's fused calls save (``conv_relu``,
        default :attr:`conv_relu`; ``False`` prices what Inductor alone makes of the graph)."""
        if self.mode == "inductor":
            layout = layout or self.layout
            groups, nhwc, (_, saved, _) = self._plan(graph, layout, conv_relu is not False)
            extra = self._conversions_us(graph) if nhwc and layout == "choose" else 0.0
            return extra + sum(self.group_cost(graph, k, nhwc) for k in groups) - saved
        const, live = constant_nodes(graph), graph.live()
        return sum(self.cost_of(graph, i) for i in graph.compute_nodes() if i not in const and i in live) \
            + self._linear_calls_us(graph, const, live)[1]

    def _linear_calls_us(self, graph: Graph, const: set[int], live) -> tuple[int, float]:
        """``eager``/``graph`` modes: (how many, microseconds added) where the generated code runs
        a matmul and its bias adds as one ``F.linear`` call (:func:`superopt.cost.fusion.linear_calls`):
        the call's measured time (``linear_us``, launch added in ``eager`` mode) in place of the
        nodes' prices. In fp32 cuBLAS runs some of those calls 2x slower than the matmul and add
        apart (H100: BERT's 768x768 projections at batch 1, 26 us against 14), in bf16 and TF32
        mostly as fast as the matmul alone. Calls the profile has no time for keep the nodes' prices."""
        if self.mode == "inductor" or self.profile is None:
            return 0, 0.0
        count, extra = 0, 0.0
        for mm, call in linear_calls(graph).items():
            if mm in const or mm not in live:
                continue
            n = graph.nodes[mm]
            ins = [graph.type_of(r) for r in n.inputs]
            t = self.profile.nearby_field(n.op, n.attr, ins, "linear_us")
            if t is None:
                continue
            if self.mode == "eager":
                e = self.profile.lookup(n.op, n.attr, ins)
                t += self.launch_s * 1e6 if e is None or e.graph_us is None else max(e.eager_us - e.graph_us, 0.0)
            count += 1
            extra += t - sum(self.cost_of(graph, i) for i in call.nodes)
        return count, extra

    def groups(self, graph: Graph, const: set[int] | None = None) -> list[Group]:
        """Inductor's kernels of ``graph`` (:func:`superopt.cost.fusion.fusion_groups`;
        ``const``: its :func:`constant_nodes`, when the caller has them)."""
        return fusion_groups(graph, const, freezing=self.freezing)

    def group_cost(self, graph: Graph, group: Group, channels_last: bool | None = None) -> float:
        """One kernel of Inductor's: a library kernel at its measured time (sibling matmuls
        merged by Inductor: the matmul on their concatenated weights; a convolution in the
        graph's layout, ``channels_last``, default :attr:`channels_last`), a generated one at
        the fitted floor plus its memory traffic over the fitted bandwidth, a bias epilogue nothing."""
        if group.kind == "epilogue":
            return 0.0
        if group.kind in ("extern", "opaque"):
            n = graph.nodes[group.nodes[0]]
            ins, outs = [graph.type_of(r) for r in n.inputs], n.types
            if len(group.nodes) > 1:  # one matmul on [K, N1 + N2 + ...]
                width = sum(graph.nodes[i].types[0].shape[-1] for i in group.nodes)
                ins = [ins[0], TensorType((ins[1].shape[0], width), ins[1].dtype)]
                outs = [TensorType(outs[0].shape[:-1] + (width,), outs[0].dtype)]
            return self.kernel_us(n.op, n.attr, ins, outs, channels_last)
        return self.generated_us(group_bytes(graph, group, self.itemsize))

    def kernels(self, graph: Graph) -> int:
        """How many kernels one run launches in this mode (the launch term counts these)."""
        if self.mode == "inductor":
            groups, _, (_, _, saved) = self._plan(graph)
            return sum(k.kind != "epilogue" for k in groups) - saved
        const, live = constant_nodes(graph), graph.live()
        return sum(1 for i in graph.compute_nodes() if i not in const and i in live and self.cost_of(graph, i) > 0)

    def breakdown(self, graph: Graph) -> dict[str, tuple[int, float]]:
        """Per operator (per group kind in ``inductor`` mode): (count, total microseconds)."""
        out: dict[str, list] = {}
        if self.mode == "inductor":
            groups, nhwc, (fused, saved, _) = self._plan(graph)
            for k in groups:
                acc = out.setdefault(k.kind, [0, 0.0])
                acc[0] += 1
                acc[1] += self.group_cost(graph, k, nhwc)
            if fused:  # what the fused cuDNN calls save on the convolutions and epilogues above
                out["cudnn conv+relu (saved)"] = [len(fused), -saved]
            if nhwc and self.layout == "choose":
                out["layout copy"] = [sum(len(graph.nodes[i].types[0].shape) == 4 for i in graph.inputs),
                                      self._conversions_us(graph)]
            return {k: (c, t) for k, (c, t) in sorted(out.items())}
        const, live = constant_nodes(graph), graph.live()
        for i in graph.compute_nodes():
            if i in const or i not in live:
                continue
            acc = out.setdefault(graph.nodes[i].op, [0, 0.0])
            acc[0] += 1
            acc[1] += self.cost_of(graph, i)
        calls, extra = self._linear_calls_us(graph, const, live)
        if calls:  # the matmuls and bias adds above, run as F.linear calls
            out["F.linear calls (difference)"] = [calls, extra]
        return {k: (c, t) for k, (c, t) in sorted(out.items())}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
