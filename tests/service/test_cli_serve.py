"""`kiln serve` on a busy port fails before it registers anything; the embedded default
keeps its admin token across restarts and ends its start with where the dashboard is."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, inspect, text

from service.migrate import current_revision
from tests import processes
from tests.service.helpers import Proc, free_port, service_env, start_api, wait_for


def test_busy_port_fails_at_once_and_registers_no_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = Proc(["serve", "--port", str(port)], service_env(KILN_DATABASE_URL=url),
                    tmp_path / "serve.log")
        proc.popen.wait(60)
        proc.stop()
    log = proc.log()
    assert proc.popen.returncode == 1, log
    assert f"cannot listen on 127.0.0.1:{port}" in log and "Traceback" not in log
    assert "make serve PORT=8001" in log  # how to choose another port with make, too
    assert "serving on" not in log
    engine = create_engine(url)
    if "workers" in inspect(engine).get_table_names():
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM workers")).scalar_one() == 0
    engine.dispose()


@pytest.mark.slow
def test_admin_token_survives_a_restart_and_the_dashboard_url_is_printed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    tokens, logs = [], []
    for _ in range(2):
        port = free_port()
        proc, base = start_api(tmp_path, port, KILN_DATABASE_URL=url)
        try:
            wait_for(lambda p=proc: "kiln: stop with Ctrl-C" in p.log(), 30)
            log = proc.log()
            # The banner comes once the app has started, after uvicorn's own lines.
            banner = log[log.index("Uvicorn running on"):]
            assert f"kiln: ready: API http://127.0.0.1:{port}, dashboard " \
                   f"http://127.0.0.1:{port}/admin" in banner
            assert "kiln: stop with Ctrl-C" in banner
            token = (tmp_path / "admin-token").read_text().strip()
            answer = httpx.get(base + "/v1/admin/stats", timeout=10,
                               headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 200
            tokens.append(token)
            logs.append(proc.log())  # a moment after the banner: nothing came after it
            assert logs[-1].rstrip().endswith("kiln: stop with Ctrl-C"), logs[-1]
        finally:
            proc.stop()
    assert tokens[0] == tokens[1]
    # The new database is one line, the restart's none; Alembic's lines are left for debug.
    head = current_revision(url)
    assert f"kiln: database {url} created, now at revision {head}" in logs[0]
    assert "kiln: database" not in logs[1]
    assert "alembic" not in logs[0] + logs[1]
    assert f"log in with the new admin token (kept in {tmp_path / 'admin-token'}): " \
           f"{tokens[0]}" in logs[0]
    assert tokens[0] not in logs[1]  # a restart says where the token is, not the token
    assert f"(print it: cat {tmp_path / 'admin-token'})" in logs[1]
    assert stat.S_IMODE((tmp_path / "admin-token").stat().st_mode) == 0o600


@pytest.mark.slow
def test_ctrl_c_stops_the_server_its_worker_and_fork_servers(tmp_path: Path) -> None:
    import signal
    import subprocess

    port = free_port()
    proc, base = start_api(tmp_path, port, KILN_DATABASE_URL=f"sqlite:///{tmp_path / 'k.db'}")
    try:
        wait_for(lambda: "kiln: stop with Ctrl-C" in proc.log(), 30)
        assert httpx.get(base + "/healthz", timeout=10).status_code == 200
        servers = subprocess.run(["pgrep", "-f", "-P", str(proc.popen.pid), "_serve_forks"],
                                 capture_output=True, text=True).stdout.split()
        assert servers, "the intake fork server runs once the app has started"
    finally:
        proc.stop(signal.SIGINT, timeout=60)
    assert proc.popen.returncode == 0, proc.log()
    assert proc.log().rstrip().endswith("kiln: stopped"), proc.log()
    for pid in map(int, servers):  # ended with the server, not left behind
        wait_for(lambda p=pid: processes.ended(p), 10, f"fork server {pid} outlived kiln serve")
