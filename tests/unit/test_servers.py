"""ranksight.common.servers without Prometheus: the command lines, the binary lookup, and the one line a
server that cannot start gives (a stand-in binary that prints an error and exits)."""
from __future__ import annotations

import stat

import pytest

from ranksight.common import servers


def test_command_lines(tmp_path):
    p = servers.prometheus(tmp_path / "p.yml", tmp_path / "data", tmp_path / "p.log", port=19090, binary="/bin/prom",
                           flags=["--web.enable-lifecycle"])
    assert p.argv() == ["/bin/prom", f"--config.file={tmp_path / 'p.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
                        "--web.listen-address=127.0.0.1:19090", "--web.enable-lifecycle"]
    a = servers.alertmanager(tmp_path / "a.yml", tmp_path / "am", tmp_path / "a.log", port=19093, binary="/bin/am")
    assert a.argv() == ["/bin/am", f"--config.file={tmp_path / 'a.yml'}", f"--storage.path={tmp_path / 'am'}",
                        "--web.listen-address=127.0.0.1:19093", "--cluster.listen-address="]
    assert a.url == "http://127.0.0.1:19093" and servers.prometheus(tmp_path / "x", tmp_path, tmp_path / "l").port > 0


def test_find_binary_override_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("RANKSIGHT_PROMTOOL_BIN", str(tmp_path / "nothing"))
    with pytest.raises(servers.MissingBinary, match=r"apt-get install prometheus\)$"):
        servers.find_binary("promtool")


def test_a_server_that_exits_is_one_line_with_its_log_error(tmp_path):
    fake = tmp_path / "prometheus"
    fake.write_text("#!/bin/sh\necho 'level=info msg=starting'\necho 'level=error msg=\"bad config\"'\n"
                    "echo 'level=info msg=bye'\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    s = servers.prometheus(tmp_path / "p.yml", tmp_path / "data", tmp_path / "p.log", binary=str(fake))
    with pytest.raises(servers.ServerError) as e:
        s.launch(10.0)
    assert str(e.value) == (f"prometheus exited with code 1: level=error msg=\"bad config\" (log: {tmp_path / 'p.log'})")
    assert s.pid() is None
