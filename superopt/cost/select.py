"""Which cost model ``optimize`` uses: the device the model will run on, at its precision.

``--device auto`` (the default) models the GPU torch sees, else this machine's CPU, and says
so; ``cuda`` insists on a visible GPU; ``h100``/``h200``/``cpu`` name a device whatever this
machine has. A GPU is priced from the shipped profile measured on it at the asked precision
(``h100-bf16.json``...), a profile file replaces it (refused when measured on another device
or at another precision), fp16 is priced by the bf16 profile where no fp16 one is shipped
(:data:`STAND_INS`), and a device without one falls back to the roofline; the description says
which. ``target`` picks the model: ``eager`` (kernels plus launches),
``cudagraph`` (kernels alone) or ``inductor`` (fusion groups, reduce-overhead).

>>> model, said = choose_cost_model("cpu", "fp32", "eager")
>>> model.device.name, said
('cpu', 'cpu (generic multi-core CPU (assumed: 200 GFLOP/s fp32 GEMM, 20 GB/s), roofline), fp32, eager model')
"""

from __future__ import annotations

from importlib.resources import files

from .devices import DEVICES, device_key
from .errors import CostError, ProfileError
from .model import CostModel
from .profile import PRECISIONS, Profile, load_profile

__all__ = ["DEVICE_STAND_INS", "STAND_INS", "TARGETS", "choose_cost_model", "shipped_profile", "shipped_profiles", "visible_gpu"]

#: optimize --target -> CostModel mode
TARGETS = {"eager": "eager", "cudagraph": "graph", "inductor": "inductor"}

#: a precision without a shipped profile -> the one whose profile prices it: fp16 and bf16 have
#: the same width and tensor-core rate on the H100 and H200. Measured on an H100 (h100-bf16's 681
#: convolutions and 45 linear calls at fp16, 2026-11-23; scripts/results/fp16_vs_bf16_h100.json),
#: the median fp16 time was 0.975-1.01x the bf16 one in each layout and epilogue; in total the
#: fp16 convolutions ran 0.90 (channels-last) to 0.99x (NCHW + ReLU), so fp16 is priced up to 10%
#: high, where the roofline, the last resort, is off by 3-4x at batch 1.
STAND_INS = {"fp16": "bf16"}

#: a GPU without a shipped profile of its own -> the GPU whose profile prices it. The H200 is the
#: H100's chip (the same tensor-core and vector rates) with faster HBM (4.8 against 3.35 TB/s), so
#: the H100's times rank its graphs as the H100 ranks them, memory-bound ones priced up to 1.43x
#: high; the roofline ranked them otherwise (Llama-3-8B decode b1 bf16: another graph, whose
#: regions no kernel was measured for, so an H200 got none of the kernels its own timings chose).
DEVICE_STAND_INS = {"h200": "h100"}


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped with superopt (``h100-fp32``, ``h100-bf16``...)."""
    folder = files(__package__).joinpath("profiles")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def shipped_profile(name: str = "h100-fp32") -> Profile:
    """A profile shipped with superopt (measured with ``scripts/profile_zoo.py``); ``h100``
    means ``h100-fp32``."""
    have = shipped_profiles()
    if name not in have and f"{name}-fp32" in have:
        name = f"{name}-fp32"
    if name not in have:
        raise ProfileError(f"no shipped profile named {name!r}; shipped: {', '.join(have) or 'none'}")
    return load_profile(files(__package__).joinpath("profiles", f"{name}.json"))


def visible_gpu() -> str | None:
    """The name of the GPU torch sees, or None."""
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # a broken CUDA install is no GPU
        return None


def _resolve_device(device: str) -> tuple[str, str]:
    """(device key, a note on how it was chosen)."""
    if device in ("auto", "cuda"):
        gpu = visible_gpu()
        if gpu is None:
            if device == "cuda":
                raise CostError("--device cuda: torch sees no GPU here; name the device the model will run on "
                                "(--device h100) or model this machine (--device cpu)")
            return "cpu", "no GPU visible here: modelling this machine's CPU; pass --device h100 to optimize for an H100"
        return device_key(gpu), f"the visible GPU ({gpu})"
    if device not in DEVICES:
        raise CostError(f"unknown device {device!r}; known: auto, cuda, {', '.join(DEVICES)}")
    return device, ""


def _shipped_for(key: str, precision: str, have: list[str]) -> tuple[Profile, str, str] | None:
    """The shipped profile that prices ``key`` at ``precision``, what the description says of it
    and the precision it was measured at: the device's own at that precision, else at its stand-in
    precision (:data:`STAND_INS`), else its stand-in GPU's (:data:`DEVICE_STAND_INS`) likewise."""
    for dev in (key, DEVICE_STAND_INS.get(key)):
        for at in (precision, STAND_INS.get(precision)):
            if dev is None or at is None or f"{dev}-{at}" not in have:
                continue
            why = [f"for {precision}: same width and tensor-core rate"] if at != precision else []
            if dev != key:
                why.append(f"for the {key}: the same chip and compute rates, faster memory (memory-bound "
                           f"operators priced high)")
            said = f"shipped profile {dev}-{at}" + (f" standing in {', '.join(why)}" if why else "")
            return shipped_profile(f"{dev}-{at}"), said, at
    return None


def _precision_said(precision: str, key: str) -> str:
    """fp32 on a GPU says that TF32 is off: torch runs cuDNN convolutions in TF32 unless told
    not to, and a choice made for one can lose in the other (H100, SqueezeNet b1: a rewrite
    measured 1.07x with TF32 off ran 0.56x with it on)."""
    if precision == "fp32" and key != "cpu":
        return "fp32 with TF32 off (torch.backends.cudnn.allow_tf32 = False; --dtype tf32 models TF32)"
    return precision


def choose_cost_model(device: str = "auto", precision: str = "fp32", target: str = "inductor",
                      profile: str | None = None, freezing: bool = True,
                      layout: str = "inductor", conv_relu: bool = False) -> tuple[CostModel, str]:
    """The cost model and a line saying what it models (device, profile, precision, target;
    ``freezing``: the Inductor target runs Inductor's freezing passes; ``layout``: ``choose``
    prices convolutions in the cheaper layout, which the caller imposes on Inductor; ``conv_relu``:
    the caller emits cuDNN's fused convolution + ReLU where the profile says it is cheaper)."""
    if precision not in PRECISIONS:
        raise CostError(f"unknown --dtype {precision!r}; known: {', '.join(PRECISIONS)}")
    if target not in TARGETS:
        raise CostError(f"unknown --target {target!r}; known: {', '.join(TARGETS)}")
    key, note = _resolve_device(device)
    if key not in DEVICES:
        raise CostError(f"the visible GPU is {key!r}, which superopt has no description of; "
                        f"pass --device h100 or --profile FILE measured on it")
    prof, source, priced_at, have = None, "roofline", precision, shipped_profiles()
    if profile is not None:
        prof = shipped_profile(profile) if profile in have or f"{profile}-fp32" in have else load_profile(profile)
        if prof.device != key:
            raise ProfileError(f"profile {profile} was measured on {prof.device!r}, the model is for {key!r}; "
                               f"pass --device {prof.device} or a profile measured on {key}")
        if prof.precision != precision:
            raise ProfileError(f"profile {profile} was measured at {prof.precision}, the model is for {precision}; "
                               f"pass --dtype {prof.precision} or a profile measured at {precision}")
        source = f"profile {profile}"
    else:
        prof, source, priced_at = _shipped_for(key, precision, have) or (None, source, precision)
    if prof is not None:
        source += f", torch {prof.torch_version}" + (f", CUDA {prof.cuda_version}" if prof.cuda_version else "")
    model = CostModel(key, prof, TARGETS[target], priced_at, freezing=freezing, layout=layout, conv_relu=conv_relu)
    said = f"{key} ({prof.device_name if prof is not None else DEVICES[key].description}, {source}), " \
           f"{_precision_said(precision, key)}, {target} model" + ("" if freezing or target != "inductor" else " without freezing") \
           + (", layout chosen by cost" if model.layout == "choose" and target == "inductor" else "") \
           + (", cuDNN conv+ReLU fusion" if model.conv_relu else "") \
           + (f"; {note}" if note else "")
    return model, said
