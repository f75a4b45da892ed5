"""The HTTP API in-process (TestClient) on real PostgreSQL: submit, fetch, jobs, admin."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from service import store
from service.api.app import create_app
from service.auth import create_session, create_token
from service.context import ServiceContext
from service.models import JobRow
from service.queue import InProcessQueue
from tests.service.helpers import gpu_target, wire_body

pytestmark = pytest.mark.services

ADMIN = {"Authorization": "Bearer admin-secret"}


def _publish(ctx: ServiceContext, key: str, status: str = "heuristic") -> None:
    with ctx.transaction() as session:
        assert store.publish_schedule(session, key, status, {"format": "kiln.schedule/1",
                                                             "kernels": []}, [], {})


def test_submit_then_fetch_pending_heuristic_and_tuned(client: TestClient, pg_ctx: ServiceContext) -> None:
    r = client.post("/v1/graphs", json=wire_body(tag="mlp"))
    assert r.status_code == 202, r.text
    body = r.json()
    key, job_id = body["key"], body["job_id"]
    assert body["status"] == "pending" and body["schedule"] is None and len(key) == 64
    assert body["job_status"] == "queued"  # read with the schedule: see the job's end below
    assert client.get(f"/v1/schedules/{key}").json() == {"key": key, "status": "pending",
                                                          "job_id": job_id,
                                                          "job_status": "queued"}
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "queued" and job["history"][0]["status"] == "queued"

    _publish(pg_ctx, key)
    r = client.get(f"/v1/schedules/{key}")
    assert r.status_code == 200 and r.json()["status"] == "heuristic"
    assert r.json()["job_status"] == "queued"  # a tuner may still improve it
    assert r.json()["schedule"]["status"] == "heuristic"
    again = client.post("/v1/graphs", json=wire_body())
    assert again.status_code == 202 and again.json()["schedule"]["status"] == "heuristic"
    with pg_ctx.transaction() as session:  # the build ended with no tuner to hand it to
        session.execute(update(JobRow).where(JobRow.id == job_id).values(status="done"))
    assert client.post("/v1/graphs", json=wire_body()).json()["job_status"] == "done"
    # The lookup says so too: a client takes this schedule without sending the graph.
    assert client.get(f"/v1/schedules/{key}").json()["job_status"] == "done"

    _publish(pg_ctx, key, "tuned")
    tuned = client.post("/v1/graphs", json=wire_body())
    assert tuned.status_code == 200 and tuned.json()["status"] == "tuned"


@pytest.mark.slow
def test_identical_concurrent_posts_make_one_job(pg_settings) -> None:  # noqa: ANN001
    # Leases long enough that the upkeep's stale-job rule (a queued job untouched for five
    # leases is enqueued again) cannot fire while 24 posts are validated on a loaded machine.
    settings = pg_settings.model_copy(update={"lease_s": 120.0})
    ctx = ServiceContext(settings, queue=InProcessQueue(settings.lease_s))
    body = wire_body("gpt_block.fwd")
    try:
        with TestClient(create_app(ctx=ctx), base_url="http://127.0.0.1") as client, \
                ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: client.post("/v1/graphs", json=body), range(24)))
        assert {a.status_code for a in answers} == {202}
        assert len({a.json()["job_id"] for a in answers}) == 1
        assert ctx.queue.depth() == {"build": 1}
    finally:
        ctx.close()


@pytest.mark.slow
def test_misses_are_classified_and_hits_counted(client: TestClient, pg_ctx: ServiceContext) -> None:
    first = client.post("/v1/graphs", json=wire_body(target=gpu_target()))
    client.post("/v1/graphs", json=wire_body(target=gpu_target("sm_80", "NVIDIA A100")))
    _publish(pg_ctx, first.json()["key"])
    for _ in range(3):
        assert client.get(f"/v1/schedules/{first.json()['key']}").status_code == 200
    client.app.state.hits.flush(pg_ctx)
    stats = client.get("/v1/admin/stats", headers=ADMIN).json()
    assert stats["misses_by_reason"]["unknown_graph"] == 1
    assert stats["misses_by_reason"]["other_gpu"] == 1
    assert stats["hits"] == 3 and stats["entries_by_status"]["heuristic"] == 1
    assert stats["queue_depth"] == {"build": 2}
    entries = client.get("/v1/admin/entries", headers=ADMIN,
                         params={"status": "heuristic"}).json()
    assert entries["total"] == 1 and entries["items"][0]["hits"] == 3


@pytest.mark.slow
def test_invalidate_and_retune(client: TestClient, pg_ctx: ServiceContext) -> None:
    key = client.post("/v1/graphs", json=wire_body(target=gpu_target())).json()["key"]
    _publish(pg_ctx, key)
    r = client.post(f"/v1/admin/entries/{key}/invalidate", headers=ADMIN)
    assert r.status_code == 200 and r.json()["status"] == "invalidated"
    gone = client.get(f"/v1/schedules/{key}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "invalidated"
    # Submitting the graph again builds it again.
    assert client.post("/v1/graphs", json=wire_body(target=gpu_target())).json()["status"] == "pending"
    _publish(pg_ctx, key)
    r = client.post(f"/v1/admin/entries/{key}/retune", headers=ADMIN)
    assert r.status_code == 202 and r.json()["stage"] == "tune" and r.json()["status"] == "queued"
    assert pg_ctx.queue.depth()["tune:" + "cuda-sm_90-nvidia-h200"] == 1
    detail = client.get(f"/v1/admin/entries/{key}", headers=ADMIN).json()
    assert detail["op_summary"] and detail["jobs"][0]["history"][-1]["message"].startswith("re-tune")


def test_admin_routes_need_an_admin_token(client: TestClient, pg_ctx: ServiceContext) -> None:
    with pg_ctx.transaction() as session:
        client_token = create_token(session, "client")
    for method, path in [("GET", "/v1/admin/entries"), ("GET", "/v1/admin/stats"),
                         ("GET", "/v1/admin/jobs"), ("POST", f"/v1/admin/entries/{'a' * 64}/retune")]:
        assert client.request(method, path).status_code == 401
        r = client.request(method, path, headers={"Authorization": f"Bearer {client_token}"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        assert client.request(method, path, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/v1/admin/jobs", headers=ADMIN).status_code == 200
    client.cookies.set("kiln_admin", "admin-secret")  # the cookie holds a session id, never a token
    assert client.get("/v1/admin/jobs").status_code == 401
    with pg_ctx.transaction() as session:
        sid = create_session(session, "admin-secret")
    client.cookies.set("kiln_admin", sid)
    assert client.get("/v1/admin/jobs").status_code == 200


@pytest.mark.slow
def test_off_loopback_every_endpoint_needs_a_token(pg_ctx: ServiceContext) -> None:
    pg_ctx.settings = pg_ctx.settings.model_copy(update={
        "host": "0.0.0.0", "admin_token": "kiln_a-long-random-admin-token-0123456789"})
    with TestClient(create_app(ctx=pg_ctx), base_url="http://127.0.0.1") as c:
        r = c.get(f"/v1/schedules/{'a' * 64}")
        assert r.status_code == 401 and "token" in r.json()["error"]["message"]
        assert c.post("/v1/graphs", json=wire_body()).status_code == 401
        with pg_ctx.transaction() as session:
            token = create_token(session, "client")
        assert c.post("/v1/graphs", json=wire_body(),
                      headers={"Authorization": f"Bearer {token}"}).status_code == 202


@pytest.mark.slow
def test_rate_limit_per_token(pg_ctx: ServiceContext) -> None:
    pg_ctx.settings = pg_ctx.settings.model_copy(update={"rate_limit_per_s": 1.0,
                                                         "rate_limit_burst": 3})
    with TestClient(create_app(ctx=pg_ctx), base_url="http://127.0.0.1") as c:
        codes = [c.get(f"/v1/schedules/{'b' * 64}").status_code for _ in range(5)]
        assert codes[:3] == [404, 404, 404] and codes[3:] == [429, 429]
        limited = c.get(f"/v1/schedules/{'b' * 64}")
        assert limited.json()["error"]["code"] == "rate_limited" and limited.headers["retry-after"]
        assert c.get("/v1/admin/jobs", headers=ADMIN).status_code == 200  # another identity


def test_health_ready_metrics(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    client.get(f"/v1/schedules/{'c' * 64}")
    metrics = client.get("/metrics").text
    assert 'kiln_http_requests_total{method="GET",route="/v1/schedules/{key}",status="404"}' in metrics
    client.post("/v1/graphs", json=wire_body())
    metrics = client.get("/metrics").text
    assert 'kiln_entries{status="pending"} 1.0' in metrics
    assert 'kiln_jobs{stage="build",status="queued"} 1.0' in metrics


@pytest.mark.slow
def test_metrics_count_workers_with_a_recent_heartbeat(pg_ctx: ServiceContext,
                                                        client: TestClient) -> None:
    with pg_ctx.transaction() as session:
        store.register_worker(session, "gpu-box:cuda0", "cuda:0", "sm_90")
        store.register_worker(session, "cpu-box:cpu", "cpu", "cpu")
    metrics = client.get("/metrics").text
    assert 'kiln_workers_alive{device="cuda"} 1.0' in metrics
    assert 'kiln_workers_alive{device="cpu"} 1.0' in metrics


@pytest.mark.slow
def test_graph_validation_is_warmed_before_the_first_request(client: TestClient) -> None:
    """Startup runs one validation (imports, meta kernels): the first submissions must not
    each wait on them (on an H200 host three together outlasted a client's timeout)."""
    assert client.app.state.validation_warm is True


@pytest.mark.slow
def test_a_known_graph_is_answered_without_running_its_ops(client: TestClient, pg_ctx: ServiceContext,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation runs a graph's ops on meta tensors; a graph whose entry has a schedule
    passed it when first stored, so a resubmission (every rank of every job, at its start)
    is answered from its canonical text alone. A new graph is still validated (in the
    request's intake child, which the API tells whether to)."""
    from service.intake_child import IntakeChild

    known, other = wire_body(), wire_body(target=gpu_target())  # encoding validates too
    key = client.post("/v1/graphs", json=known).json()["key"]
    _publish(pg_ctx, key)
    ran: list[bool] = []
    real = IntakeChild.finish
    monkeypatch.setattr(IntakeChild, "finish",
                        lambda child, validate: ran.append(validate) or real(child, validate))
    again = client.post("/v1/graphs", json=known)
    assert again.status_code == 202 and again.json()["schedule"]["status"] == "heuristic"
    assert ran == [False]
    new = client.post("/v1/graphs", json=other)  # no schedule yet
    assert new.status_code == 202 and ran == [False, True]

    bad = wire_body("gpt_block.fwd")  # unknown, and a declared meta its op does not give
    node = next(n for n in bad["graph"]["nodes"]
                if isinstance(n["meta"], dict) and n["meta"].get("dtype") == "float32")
    node["meta"]["dtype"] = "float64"
    r = client.post("/v1/graphs", json=bad)
    assert r.status_code == 422 and "does not match" in r.text
