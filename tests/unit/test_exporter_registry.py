"""Collectors register by name; the address grammar is one (ranksight.address) for the agent and the hooks."""
import pytest

from ranksight import catalog as C
from ranksight import config
from ranksight.exporter.agent import AgentSettings
from ranksight.exporter.collectors import FACTORIES, Context, build, register
from ranksight.exporter.ranks import RankSettings, RankTable
from ranksight.address import Address, parse_address

from support.nvml_standin import NvmlStandin


def test_every_collector_name_builds_the_collector_of_that_name():
    s = AgentSettings(node="n")
    ctx = Context(s, table=RankTable(s.ranks), nvml=NvmlStandin(count=1))
    try:
        for name in C.COLLECTOR_NAMES:
            c = build(name, ctx)
            if name == "gpu":
                ctx.gpu = c
            assert c.name == name and name in FACTORIES
    finally:
        ctx.gpu.stop()
    with pytest.raises(ValueError, match="COLLECTOR_NAMES"):
        register("bogus")


def test_settings_defaults_are_the_configs():
    d = config.defaults()["agent"]
    s = AgentSettings(node="n")
    assert (s.listen, s.ingest, s.gpu_poll_seconds, s.nic_exclude) == (d["listen"], d["ingest"], d["gpu_poll_seconds"],
                                                                        d["nic_exclude"])
    assert ",".join(s.collectors) == d["collectors"]
    assert RankSettings() == RankSettings.from_config(d)


@pytest.mark.parametrize("s,listen,want", [
    ("udp://127.0.0.1:9946", False, Address("udp", host="127.0.0.1", port=9946)),
    ("udp://[::1]:9946", True, Address("udp", host="::1", port=9946)),
    ("udp://127.0.0.1:0", True, Address("udp", host="127.0.0.1", port=0)),
    ("unix:///run/r.sock", True, Address("unix", path="/run/r.sock")),
    ("off", False, Address("off")),
])
def test_addresses(s, listen, want):
    a = parse_address(s, listen=listen)
    assert a == want
    assert str(a) == (s if s != "udp://[::1]:9946" else "udp://[::1]:9946")


@pytest.mark.parametrize("s,listen,what", [
    ("udp://127.0.0.1:0", False, "agent address"), ("off", True, "ingest address"),
    ("unix://relative.sock", True, "ingest address"), ("tcp://h:1", True, "ingest address"),
    ("udp://h", False, "agent address"), ("udp://h:99999", True, "ingest address"),
])
def test_bad_addresses_name_the_address(s, listen, what):
    with pytest.raises(ValueError, match=what):
        parse_address(s, listen=listen)
