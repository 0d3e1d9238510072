"""The cost model: what a graph costs on a device, from measured profiles or a roofline.

>>> from superopt.cost import CostModel
>>> CostModel("h100").device.name
'h100'
"""

from .analytic import analytic_time, is_view, op_bytes, op_flops
from .devices import DEVICES, Device, device_key, get_device
from .errors import CostError, ProfileError, UnknownDeviceError
from .model import CostModel, constant_nodes, is_constant_op
from .profile import Profile, ProfileEntry, load_profile, op_key

__all__ = [
    "analytic_time", "is_view", "op_bytes", "op_flops", "DEVICES", "Device", "device_key", "get_device",
    "CostError", "ProfileError", "UnknownDeviceError", "CostModel", "constant_nodes", "is_constant_op",
    "Profile", "ProfileEntry", "load_profile", "op_key", "shipped_profile", "open_profile",
]


def shipped_profile(name: str = "h100") -> Profile:
    """A profile shipped with superopt (``h100``: measured with ``scripts/profile_zoo.py``)."""
    from importlib.resources import files
    path = files(__package__).joinpath("profiles", f"{name}.json")
    if not path.is_file():
        have = sorted(p.name[:-5] for p in files(__package__).joinpath("profiles").iterdir() if p.name.endswith(".json"))
        raise ProfileError(f"no shipped profile named {name!r}; shipped: {', '.join(have) or 'none'}")
    return load_profile(path)


def open_profile(spec: str, device: str) -> Profile:
    """A profile file, or a shipped profile by name (``h100``), checked to be for ``device``."""
    from pathlib import Path
    if Path(spec).exists() or "/" in spec or "." in spec:
        return load_profile(spec, device=device)
    prof = shipped_profile(spec)
    if prof.device != device:
        raise ProfileError(f"the shipped profile {spec!r} is for {prof.device!r}, costs are asked for {device!r}; "
                           f"pass --device {prof.device}")
    return prof
