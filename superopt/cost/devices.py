"""Analytic device descriptions: peak rates, memory bandwidth and per-kernel launch overhead.

The numbers are the vendors' published peaks (dense, no sparsity); an analytic estimate is a
roofline, so what matters is their ratio, not their absolute accuracy. Measured profiles
replace the estimate wherever they have an entry.

H100 SXM5 (NVIDIA H100 datasheet): 989 TFLOP/s dense fp16/bf16 tensor, 495 TFLOP/s TF32
tensor, 67 TFLOP/s fp32 without tensor cores, 3.35 TB/s HBM3. torch runs fp32 convolutions
with TF32 (``torch.backends.cudnn.allow_tf32`` defaults to True) but fp32 matmuls without it
(``torch.backends.cuda.matmul.allow_tf32`` defaults to False), hence the two fp32 rates.
Launch overhead: about 4 us per kernel for torch eager (dispatch plus launch).

Generic CPU (our assumption for a 2-8 core desktop/server core complex running torch):
200 GFLOP/s fp32 for matmul/conv (oneDNN, AVX2/AVX-512 FMA), 20 GFLOP/s for elementwise
work, 20 GB/s effective memory bandwidth, 5 us per operator (eager dispatch).

>>> get_device("h100").bandwidth
3350000000000.0
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UnknownDeviceError

__all__ = ["Device", "DEVICES", "get_device", "device_key"]


@dataclass(frozen=True)
class Device:
    """Peak rates in FLOP/s by dtype, bandwidth in bytes/s, launch overhead in seconds."""

    name: str
    description: str
    matmul_flops: dict = field(default_factory=dict)
    conv_flops: dict = field(default_factory=dict)
    vector_flops: float = 1e12
    bandwidth: float = 1e11
    launch_s: float = 5e-6

    def rate(self, kind: str, dtype: str) -> float:
        """FLOP/s for ``kind`` ``matmul``, ``conv`` or ``vector`` at ``dtype``."""
        table = {"matmul": self.matmul_flops, "conv": self.conv_flops}.get(kind)
        if table is None:
            return self.vector_flops
        return table.get(dtype, table.get("float32", self.vector_flops))


_T = 1e12
DEVICES: dict[str, Device] = {
    "h100": Device("h100", "NVIDIA H100 SXM5 (80 GB HBM3)",
                   matmul_flops={"float32": 67 * _T, "tf32": 495 * _T, "float16": 989 * _T, "bfloat16": 989 * _T,
                                 "float64": 67 * _T},
                   conv_flops={"float32": 495 * _T, "tf32": 495 * _T, "float16": 989 * _T, "bfloat16": 989 * _T,
                               "float64": 67 * _T},
                   vector_flops=67 * _T, bandwidth=3.35e12, launch_s=4e-6),
    "h200": Device("h200", "NVIDIA H200 SXM (141 GB HBM3e)",
                   matmul_flops={"float32": 67 * _T, "tf32": 495 * _T, "float16": 989 * _T, "bfloat16": 989 * _T,
                                 "float64": 67 * _T},
                   conv_flops={"float32": 495 * _T, "tf32": 495 * _T, "float16": 989 * _T, "bfloat16": 989 * _T,
                               "float64": 67 * _T},
                   vector_flops=67 * _T, bandwidth=4.8e12, launch_s=4e-6),
    "cpu": Device("cpu", "generic multi-core CPU (assumed: 200 GFLOP/s fp32 GEMM, 20 GB/s)",
                  matmul_flops={"float32": 200e9, "float64": 100e9},
                  conv_flops={"float32": 200e9, "float64": 100e9},
                  vector_flops=20e9, bandwidth=20e9, launch_s=5e-6),
}  # fmt: skip


def get_device(name: str) -> Device:
    """The description of a device by key (``h100``, ``h200``, ``cpu``)."""
    try:
        return DEVICES[name]
    except KeyError:
        raise UnknownDeviceError(f"no analytic description of device {name!r}; known devices: "
                                 f"{', '.join(DEVICES)} (or give a profile measured on it)") from None


def device_key(full_name: str) -> str:
    """A short key for a device's marketing name, as profiles store it.

    >>> device_key("NVIDIA H100 80GB HBM3"), device_key("cpu")
    ('h100', 'cpu')
    """
    low = full_name.lower()
    for key in DEVICES:
        if key in low.replace(" ", "").replace("-", ""):
            return key
    return "".join(c if c.isalnum() else "_" for c in low).strip("_") or "unknown"
