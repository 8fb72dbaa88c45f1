"""ranksight.common.units: each style prints what the triage text, the report, the dashboards'
descriptions, the lints and the scale benchmark show (the strings are the ones users read)."""
from __future__ import annotations

import pytest

from ranksight.common import units


@pytest.mark.parametrize("v, unit, multiple, want", [
    (None, "ratio", False, "-"),
    (0.1234, "ratio", False, "12.3%"),
    (1.234, "ratio", True, "1.23x"),
    (3.21, "seconds", False, "3.21 s"),
    (300.0, "seconds", False, "5.0 min"),
    (512.0, "bytes", False, "512 B"),
    (2.5e9, "bytes", False, "2.5 GB"),
    (1.5e3, "bytes", False, "1.5 kB"),
    (4.0, "per_minute", False, "4/min"),
    (12345.0, "count", False, "1.234e+04"),
])
def test_value(v, unit, multiple, want):
    assert units.value(v, unit, multiple) == want


@pytest.mark.parametrize("v, unit, want", [
    (0.5, "percentunit", "50.0%"),
    (0.0123, "s", "0.0123 s"),
    (150.4, "s", "150 s"),
    (3e6, "bytes", "3 MB"),
    (3e6, "Bps", "3 MB/s"),
    (12.0, "Bps", "12 B/s"),
    (7.0, "none", "7"),
])
def test_grafana(v, unit, want):
    assert units.grafana(v, unit) == want


@pytest.mark.parametrize("v, unit, want", [
    (0.1, "ratio", "10%"),
    (60.0, "seconds", "60 s"),
    (1.25e9, "bytes", "1.25 GB/s"),
    (3.0, "per_minute", "3 per minute"),
    (1.2, "other", "1.2"),
])
def test_threshold(v, unit, want):
    assert units.threshold(v, unit) == want


@pytest.mark.parametrize("n, want", [(512, "512 B"), (1536, "1.5 KiB"), (3 * 2 ** 30, "3.0 GiB"),
                                     (2 ** 50, "1024.0 TiB")])
def test_binary_bytes(n, want):
    assert units.binary_bytes(n) == want


@pytest.mark.parametrize("n, want", [(500, "0.5 kB"), (4e6, "4.0 MB"), (1.23e10, "12.3 GB")])
def test_size(n, want):
    assert units.size(n) == want
