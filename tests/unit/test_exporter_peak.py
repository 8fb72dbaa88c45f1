"""The peak FLOP/s per GPU (exporter/peak.py): dense figures by NVML device name and dtype, the
agent config's overrides, and the GPU collector's ranksight_gpu_peak_flops (NVML stand-in fed the
recorded H200 samples)."""
from __future__ import annotations

import logging

import pytest

from ranksight import catalog as C
from ranksight import config as cfgmod
from ranksight.exporter.collectors.gpu import GpuCollector
from ranksight.exporter.peak import DENSE_TFLOPS, peak_flops
from support.nvml_standin import NvmlStandin

from test_exporter_collectors import _run_agent, exposed
from test_exporter_helpers import one, series

T = 1e12


@pytest.mark.parametrize("name, dtype, tflops", [
    ("NVIDIA A100-SXM4-80GB", "bf16", 312), ("NVIDIA A100 80GB PCIe", "fp16", 312), ("NVIDIA A100-SXM4-40GB", "tf32", 156),
    ("NVIDIA H100 80GB HBM3", "bf16", 989), ("NVIDIA H100 PCIe", "bf16", 756), ("NVIDIA H100 NVL", "bf16", 835),
    ("NVIDIA H200", "bf16", 989), ("NVIDIA H200", "fp8", 1979), ("NVIDIA H100 80GB HBM3", "tf32", 495),
])
def test_the_table_holds_the_dense_figures(name, dtype, tflops):
    """Dense, never the 2:4 sparse datasheet figures (H100 SXM BF16 1,979 sparse is 989 dense)."""
    assert peak_flops(name, dtype) == tflops * T


def test_fp16_is_bf16_and_no_sparse_figure_slipped_in():
    for name, t in DENSE_TFLOPS.items():
        assert t["fp16"] == t["bf16"], name
        assert t["bf16"] < 1000, f"{name}: {t['bf16']} TFLOPS BF16 is a sparse figure"


def test_an_unknown_device_or_dtype_has_no_peak_unless_configured():
    assert peak_flops("Tesla T4", "bf16") is None
    assert peak_flops("NVIDIA A100-SXM4-80GB", "fp8") is None, "A100 has no FP8"
    assert peak_flops("Tesla T4", "bf16", single_tflops=65) == 65 * T
    assert peak_flops("Tesla T4", "bf16", by_name={"Tesla T4": 65.0}) == 65 * T
    # the per-name map wins over the single figure, which wins over the table
    assert peak_flops("NVIDIA H200", "bf16", 500, {"NVIDIA H200": 900.0}) == 900 * T
    assert peak_flops("NVIDIA H200", "bf16", 500) == 500 * T


def test_the_collector_exposes_the_peak_for_its_dtype():
    gc = GpuCollector("n1", nvml=NvmlStandin(count=2))
    gc.start(threads=False)
    got = exposed(gc.collect())
    assert one(got, C.GPU_PEAK_FLOPS.name, gpu="0", dtype="bf16") == 989 * T
    assert one(got, C.GPU_PEAK_FLOPS.name, gpu="1", dtype="bf16") == 989 * T
    gc.stop()
    gc = GpuCollector("n1", nvml=NvmlStandin(count=1), peak_dtype="fp8", peak_by_name={"NVIDIA H200": 1500.0})
    gc.start(threads=False)
    assert one(exposed(gc.collect()), C.GPU_PEAK_FLOPS.name, gpu="0", dtype="fp8") == 1500 * T
    gc.stop()


def test_an_unknown_device_has_no_series_and_is_logged_once(caplog):
    nv = NvmlStandin(count=2)
    nv.gpu_name = "NVIDIA Made-Up GPU"
    gc = GpuCollector("n1", nvml=nv)
    with caplog.at_level(logging.WARNING, logger="ranksight.exporter.gpu"):
        gc.start(threads=False)
        for _ in range(3):
            got = exposed(gc.collect())
    assert not series(got, C.GPU_PEAK_FLOPS.name)
    assert one(got, C.GPU_UP.name, gpu="1") == 1, "the rest of the collector works"
    lines = [r.getMessage() for r in caplog.records if "peak" in r.getMessage()]
    assert len(lines) == 1 and "NVIDIA Made-Up GPU" in lines[0] and "agent.peak_tflops_by_name" in lines[0]
    gc.stop()


def test_config_values():
    a = cfgmod.load(env={})["agent"]
    assert (a["peak_flops_dtype"], a["peak_tflops"], a["peak_tflops_by_name"]) == ("bf16", 0.0, {})
    got = cfgmod.load(env={"RANKSIGHT__agent__peak_tflops_by_name": "NVIDIA L40S=362, Tesla T4=65"})["agent"]
    assert got["peak_tflops_by_name"] == {"NVIDIA L40S": 362.0, "Tesla T4": 65.0}


def test_bad_peak_settings_exit_2_with_one_line(tmp_path):
    cfg = tmp_path / "agent.yml"
    for text, key in (("agent:\n  peak_flops_dtype: int8\n", "agent.peak_flops_dtype"),
                      ("agent:\n  peak_tflops: -3\n", "agent.peak_tflops"),
                      ("agent:\n  peak_tflops_by_name: {NVIDIA H200: fast}\n", "agent.peak_tflops_by_name"),
                      ("agent:\n  peak_tflops_by_name: [989]\n", "agent.peak_tflops_by_name")):
        cfg.write_text(text)
        rc, lines, err = _run_agent(["--config", str(cfg), "--listen", "127.0.0.1:0", "--ingest", "udp://127.0.0.1:0"])
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (text, err)
        assert key in lines[0], lines
