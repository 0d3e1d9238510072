"""The cost model: what a graph costs on a device, from measured profiles or a roofline.

>>> from superopt.cost import CostModel
>>> CostModel("h100").device.name
'h100'
"""

from .analytic import analytic_time, cost_facts, is_view, op_bytes, op_flops
from .devices import DEVICES, Device, device_key, get_device
from .errors import CostError, ProfileError, UnknownDeviceError
from .fusion import Group, fusion_groups
from .model import MODES, CostModel, constant_nodes, is_constant_op
from .profile import PRECISIONS, Profile, ProfileEntry, load_profile, op_key, precision_dtype
from .select import TARGETS, choose_cost_model, shipped_profile, shipped_profiles, visible_gpu

__all__ = [
    "analytic_time", "cost_facts", "is_view", "op_bytes", "op_flops", "DEVICES", "Device", "device_key", "get_device",
    "CostError", "ProfileError", "UnknownDeviceError", "Group", "fusion_groups", "MODES", "CostModel",
    "constant_nodes", "is_constant_op", "PRECISIONS", "Profile", "ProfileEntry", "load_profile", "op_key",
    "precision_dtype", "TARGETS", "choose_cost_model", "shipped_profile", "shipped_profiles", "visible_gpu",
    "open_profile",
]


def open_profile(spec: str, device: str, precision: str | None = None) -> Profile:
    """A profile file, or a shipped profile by name (``h100``, ``h100-bf16``), checked to be for
    ``device`` (and ``precision`` when given)."""
    from pathlib import Path
    if Path(spec).exists() or "/" in spec or spec.endswith(".json"):
        return load_profile(spec, device=device, precision=precision)
    prof = shipped_profile(spec)
    if prof.device != device:
        raise ProfileError(f"the shipped profile {spec!r} is for {prof.device!r}, costs are asked for {device!r}; "
                           f"pass --device {prof.device}")
    if precision is not None and prof.precision != precision:
        raise ProfileError(f"the shipped profile {spec!r} is for {prof.precision}, costs are asked for {precision}; "
                           f"pass --dtype {prof.precision}")
    return prof
