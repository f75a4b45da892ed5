"""What an operator reads: live workers counted as the metric counts them, the entry page's
kernel summary, job durations. Runs the real app on PostgreSQL, logged in as admin."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.context import ServiceContext
from service.models import WorkerRow, utcnow
from tests.dashboard.conftest import ADMIN_TOKEN, seed_entry

pytestmark = pytest.mark.services


@pytest.fixture
def admin(dash_ctx: ServiceContext) -> Iterator[tuple[TestClient, ServiceContext]]:
    with TestClient(create_app(ctx=dash_ctx), base_url="http://127.0.0.1",
                    follow_redirects=False) as client:
        page = client.get("/admin/login")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
        client.post("/admin/login", data={"token": ADMIN_TOKEN, "csrf_token": csrf,
                                          "next": "/admin"})
        yield client, dash_ctx


def test_dead_and_stopped_workers_leave_the_live_count(admin) -> None:
    client, ctx = admin
    now = utcnow()
    with ctx.transaction() as session:
        for wid, status, age in (("alive", "running", 1), ("ghost", "running", 600),
                                 ("gone", "stopped", 5)):
            session.add(WorkerRow(id=wid, device="cpu", queue_class="cpu", status=status,
                                  started_at=now - timedelta(seconds=900),
                                  heartbeat_at=now - timedelta(seconds=age)))
    page = client.get("/admin").text
    assert re.search(r'<span class="big">1</span> live workers', page), page
    assert "2 stopped or dead in the last hour" in page
    rows = dict(re.findall(r"<code>(alive|ghost|gone)</code></td><td>(?:<strong>)?(\w+)", page))
    assert rows == {"alive": "live", "ghost": "dead", "gone": "stopped"}
    metrics = client.get("/metrics").text
    assert 'kiln_workers_alive{device="cpu"} 1.0' in metrics  # the same count


def test_entry_page_opens_with_a_kernel_summary_and_collapsed_sources(admin) -> None:
    client, ctx = admin
    key = seed_entry(ctx, tag="SeedMLP forward")
    page = client.get(f"/admin/entries/{key}").text
    assert "<h1>SeedMLP forward" in page
    summary = page.index('id="kernel-summary"')
    assert summary < page.index("<details")  # the table first, sources after, collapsed
    assert "<details open" not in page
    row = re.search(r'<tr id="sum-k0">(.*?)</tr>', page, re.S).group(1)
    assert "fused_add_relu_0" in row and "pointwise" in row and "X128" in row
    assert "0.2 ms" in row and "100%" in row
    # A CPU target's interpreter times are no speed: no speedup shown.
    assert "– (interpreter)" in page and "Triton interpreter" in page


def test_an_unmeasured_kernel_gets_no_empty_chart(admin) -> None:
    client, ctx = admin
    from service import store
    from tests.dashboard.conftest import fake_submission

    submission = fake_submission()
    kernel = {"name": "fused_mul_0", "kind": "pointwise", "variant": "pointwise",
              "config": {"XBLOCK": 64}, "nodes": ["n0"], "ops": ["aten.mul.Tensor"],
              "source": "pass", "source_hash": "cd" * 32, "heuristic_ms": 0.1}
    with ctx.transaction() as session:
        store.submit(session, submission)
        store.publish_schedule(session, submission.key, "heuristic",
                               {"format": "kiln.schedule/1", "kernels": [kernel]}, [kernel], {})
    page = client.get(f"/admin/entries/{submission.key}").text
    assert "No candidates measured" in page and "no candidates measured" not in page
    assert 'class="plot candidates"' not in page and 'id="plot-timings"' not in page
    assert "<h1>graph of add, relu" in page  # no tag: named by its ops


def test_jobs_show_their_duration(admin) -> None:
    from service.dashboard.views import job_duration

    job = {"status": "done", "created_at": "2026-01-01T00:00:00+00:00",
           "finished_at": "2026-01-01T00:01:30+00:00",
           "history": [{"status": "queued", "at": "2026-01-01T00:00:00+00:00"},
                       {"status": "running", "at": "2026-01-01T00:00:10+00:00"}]}
    assert job_duration(job) == 80.0
    assert job_duration({**job, "finished_at": None}) is None
    client, ctx = admin
    seed_entry(ctx)
    page = client.get("/admin/jobs").text
    assert '<th scope="col" class="num">duration</th>' in page
