"""The dashboard in a real headless browser (Debian's chromium driven by Playwright) over a
live service whose entry was built and tuned by the real workers and tuner on the CPU.
(The README's screenshots come from a real `kiln serve` instead: scripts/screenshots.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from service.context import ServiceContext
from service.queue import InProcessQueue
from service.settings import Settings
from tests.dashboard.conftest import ADMIN_TOKEN
from tests.dashboard.live import CHROMIUM, CHROMIUM_ARGS, LiveService

# slow: real builds and tuning behind a live service. A missing browser is an optional tool
# not installed, not a missing service: it skips, under CI too, before any fixture starts.
pytestmark = [pytest.mark.browser, pytest.mark.services, pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing: `make browser` (as root) installs "
                                        "Debian's chromium")]

TUNE_TRIALS = 6


@pytest.fixture
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def live(dash_settings: Settings) -> Iterator[LiveService]:
    settings = dash_settings.model_copy(update={"tune_trials": TUNE_TRIALS, "tune_seconds": 60.0})
    ctx = ServiceContext(settings, queue=InProcessQueue(settings.lease_s))
    try:
        with LiveService(ctx) as service:
            yield service
    finally:
        ctx.close()


def _populate(live: LiveService) -> tuple[str, str]:
    """A tuned entry (real build + real tuning), heuristic ones, hits and misses of each kind."""
    import compiler

    torch.manual_seed(0)
    softmax = (lambda x, r: torch.softmax(x * 0.125, -1) + r,
               [torch.randn(8, 32), torch.randn(8, 32)])
    tuned = live.submit(*softmax, tag="softmax-demo")
    heuristic = live.submit(lambda x, y: torch.relu(x + y) * 2.0,
                            [torch.randn(16, 16), torch.randn(16, 16)], tag="mlp-demo")
    # The same graph for another GPU and for other library versions: misses with a reason.
    live.submit(*softmax, tag="softmax-demo",
                target=compiler.Target.named("sm_90", name="NVIDIA H200").to_json())
    live.submit(*softmax, tag="softmax-demo",
                target={**compiler.Target.detect("cpu").to_json(), "torch": "2.11",
                        "triton": "3.6.0"})
    live.start_worker(device="cpu")
    live.wait_status(tuned["key"], "heuristic", 60)
    live.send_to_tuning(tuned["key"])
    # A worker serving the CPU target's tune stream, running the service's real tuning step.
    live.start_worker(device="cpu", tune_on_cpu=True)
    live.wait_status(tuned["key"], "tuned", 90)
    live.wait_status(heuristic["key"], "heuristic", 60)
    for _ in range(3):  # cache hits, counted by the API
        assert live.schedule_status(tuned["key"])[0] == 200
    return tuned["key"], heuristic["key"]


def test_operator_logs_in_inspects_a_tuned_entry_and_invalidates_it(live, browser, tmp_path):
    tuned_key, heuristic_key = _populate(live)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    console_errors: list[str] = []  # JS errors and Content-Security-Policy violations
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: console_errors.append(str(exc)))

    # Without the cookie every page sends the browser to the login form.
    page.goto(f"{live.url}/admin/entries/{tuned_key}")
    assert page.url.startswith(f"{live.url}/admin/login")
    assert "softmax-demo" not in page.content() and "@triton.jit" not in page.content()
    page.fill("#token", ADMIN_TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live.url}/admin/entries/{tuned_key}")
    assert ADMIN_TOKEN not in page.url
    cookie = next(c for c in context.cookies() if c["name"] == "kiln_admin")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    # Overview: counts and plots from the live database.
    page.goto(f"{live.url}/admin")
    assert page.locator("#plot-status svg[role=img]").is_visible()
    assert page.locator("#plot-hit-rate svg[role=img]").is_visible()
    assert "tuned: 1" in page.locator("#plot-status figcaption").inner_text()
    page.wait_for_timeout(1200)  # the API flushes hit counters once a second
    page.reload()
    misses = page.locator("#plot-misses").inner_text()
    assert "other GPU" in misses and "other triton/torch" in misses
    page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)

    # Entries: search by key prefix, open the tuned entry.
    page.goto(f"{live.url}/admin/entries")
    page.fill("input[name=q]", tuned_key[:8])
    page.click("form.filters button[type=submit]")
    rows = page.locator("#entries tbody tr")
    assert rows.count() == 1 and "tuned" in rows.first.inner_text()
    assert heuristic_key[:12] not in page.content()
    rows.first.locator("a").first.click()
    page.wait_for_url(f"{live.url}/admin/entries/{tuned_key}")

    # Entry: named by its tag, a kernel summary first, sources collapsed until asked for
    # (highlighted), a candidate plot with every measured candidate.
    assert page.locator("#entry-status").inner_text() == "tuned"
    assert page.locator("h1").inner_text().startswith("softmax-demo")
    summary = page.locator("#kernel-summary tbody tr")
    assert summary.count() >= 1 and summary.first.is_visible()
    assert "%" in summary.first.inner_text()  # its share of the graph's kernel time
    source = page.locator(".kernel .source").first
    assert not source.is_visible()
    page.locator(".kernel details.source-block summary").first.click()
    assert source.is_visible() and "@triton.jit" in source.inner_text()
    assert source.locator("span").count() > 10  # highlighted tokens, not plain text
    plot = page.locator("figure.candidates svg[role=img]").first
    assert plot.is_visible()
    page.locator(".kernel details.measurements summary").first.click()
    measured = page.locator(".kernel details.measurements tbody tr")
    assert measured.count() >= 1
    assert page.locator("#op-summary").inner_text().count("aten.") >= 2
    siblings = page.locator("#siblings").inner_text()  # why other targets' lookups missed
    assert "name: NVIDIA H200" in siblings and "triton: 3.6.0" in siblings
    page.locator(".kernel details.source-block summary").first.click()  # closed again
    page.locator(".kernel details.measurements summary").first.click()
    page.screenshot(path=str(tmp_path / "entry.png"), full_page=True)

    # Jobs: the tuning job with its stage, progress and history.
    page.goto(f"{live.url}/admin/jobs")
    job_row = page.locator(f"tr:has(a[href='/admin/entries/{tuned_key}'])").first
    assert "tune" in job_row.inner_text() and "100%" in job_row.inner_text()
    assert "tuned: " in job_row.inner_text()  # the worker's note in the history
    assert job_row.locator("td.num").first.inner_text().endswith(" s")  # its duration
    page.goto(f"{live.url}/admin/entries/{tuned_key}")

    # Invalidate, confirming the browser's dialog; the API then answers 404 invalidated.
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("form[action$='/invalidate'] button")
    page.wait_for_url(f"{live.url}/admin/entries/{tuned_key}?done=invalidate")
    assert page.locator("#entry-status").inner_text() == "invalidated"
    code, body = live.schedule_status(tuned_key)
    assert code == 404 and body["error"]["code"] == "invalidated"
    code, _ = live.schedule_status(heuristic_key)
    assert code == 200

    assert console_errors == []

    # A second browser without the cookie still sees no data, page or API.
    stranger = browser.new_context().new_page()
    stranger.goto(f"{live.url}/admin")
    assert stranger.url.startswith(f"{live.url}/admin/login")
    assert "softmax-demo" not in stranger.content()
    api = stranger.goto(f"{live.url}/v1/admin/entries")
    assert api is not None and api.status == 401 and "softmax-demo" not in stranger.content()

    for name in ("overview.png", "entry.png"):
        assert (tmp_path / name).stat().st_size > 20_000  # a rendered page, not a blank one
