"""Peak dense tensor-core FLOP/s per GPU, by NVML device name and dtype: the denominator of MFU.

Dense figures only. NVIDIA's datasheets print the 2:4 structured-sparsity figure first for Hopper
("with sparsity"); it is twice the dense one, and an MFU against it would read half. Sources (dense,
TFLOPS, boost clock):

- A100 (SXM4 and PCIe, 40 and 80 GB): NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 312, TF32 156;
  no FP8.
- H100 SXM5 ("NVIDIA H100 80GB HBM3"): NVIDIA H100 Tensor Core GPU datasheet, half the sparse
  figures: BF16/FP16 989 (1,979 sparse), TF32 495 (989 sparse), FP8 1,979 (3,958 sparse).
- H100 PCIe: BF16/FP16 756 (1,513 sparse), TF32 378 (756 sparse), FP8 1,513 (3,026 sparse).
- H100 NVL: BF16/FP16 835 (1,671 sparse), TF32 418 (835 sparse), FP8 1,670 (3,341 sparse).
- H200 SXM ("NVIDIA H200"): NVIDIA H200 datasheet, the H100 SXM figures: BF16/FP16 989, TF32 495,
  FP8 1,979.

A device missing here (or a dtype missing for it) has no peak: the agent logs it once and exposes
no ``ranksight_gpu_peak_flops`` series for it, so the rules read no MFU on it. ``agent.peak_tflops``
(one figure for every GPU of the node) or ``agent.peak_tflops_by_name`` (NVML name -> figure) set
it, for the configured ``agent.peak_flops_dtype``.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional

TERA = 1e12

_A100 = {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0}
_H100_SXM = {"bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp8": 1979.0}
_H100_PCIE = {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp8": 1513.0}
_H100_NVL = {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp8": 1670.0}

# NVML device name (nvmlDeviceGetName) -> dtype -> dense TFLOPS
DENSE_TFLOPS: Dict[str, Dict[str, float]] = {
    "NVIDIA A100-SXM4-40GB": _A100,
    "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA A100-PCIE-40GB": _A100,
    "NVIDIA A100 80GB PCIe": _A100,
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100 PCIe": _H100_PCIE,
    "NVIDIA H100 NVL": _H100_NVL,
    "NVIDIA H200": _H100_SXM,
}


def peak_flops(name: str, dtype: str, single_tflops: float = 0.0,
               by_name: Optional[Mapping[str, float]] = None) -> Optional[float]:
    """Peak dense FLOP/s of the NVML device ``name`` for ``dtype``: ``by_name[name]`` when given,
    else ``single_tflops`` when non-zero, else the table; None when none of them knows it."""
    if by_name and name in by_name:
        return float(by_name[name]) * TERA
    if single_tflops > 0:
        return single_tflops * TERA
    t = DENSE_TFLOPS.get(name, {}).get(dtype)
    return t * TERA if t is not None else None
