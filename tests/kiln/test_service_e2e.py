"""Training through the real embedded service (`kiln serve` as a subprocess): forward and
backward schedules and the models' plans land in the service, a second process with an
empty cache fetches all of them without computing any (nor running AOTAutograd), and a
service that dies mid-run costs one warning, not the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import kiln
from compiler.wire.plan import parse_plan
from examples.models import SeedMLP
from kiln import session
from tests.kiln.helpers import assert_close_losses, causes, train_gpt, train_mlp
from tests.kiln.service_proc import ROOT, ServiceProcess

# slow: whole models trained through service processes.
pytestmark = [pytest.mark.usefixtures("kiln_state"), pytest.mark.slow]


@pytest.fixture
def service(tmp_path):
    svc = ServiceProcess(tmp_path).start()
    yield svc
    svc.stop()


def test_mlp_and_gpt_train_through_the_service_and_a_second_process_fetches_every_schedule(
        service, kiln_warnings, tmp_path):
    kiln.configure(url=service.url, mode="wait", wait_timeout=120, poll_interval=0.1)
    assert_close_losses(train_mlp(), train_mlp(backend=None))
    assert_close_losses(train_gpt(), train_gpt(backend=None), rtol=1e-3)
    assert not causes(kiln_warnings), service.log()

    graphs = session.compiled_graphs()
    assert {g.kind for g in graphs} == {"forward", "backward"}
    assert len(graphs) == 4  # MLP and GPT, forward and backward each
    stats = kiln.stats()
    assert stats["schedules_fetched"] == 4 and stats["schedules_local"] == 0, stats
    for g in graphs:  # the service holds a schedule for every graph, forward and backward
        status, body = service.get(f"/v1/schedules/{g.key}")
        assert status == 200 and body["status"] in ("heuristic", "tuned"), (g, body)
        assert g.origin == "service"

    # Both models' plans (kiln.plans) reached the service.
    assert session.wait_plans(timeout=60) and kiln.stats()["plans_sent"] == 2

    # A second process, empty KILN_CACHE_DIR: every schedule from the service, none local,
    # and the GPT's plan from it too: AOTAutograd never runs.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(KILN_URL=service.url, KILN_CACHE_DIR=str(tmp_path / "second-cache"),
               KILN_KERNEL_DIR=str(tmp_path / "second-kernels"), TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_gpt.py"),
                          "--steps", "5"], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("OK")
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("stats: ")]
    second = json.loads(line.removeprefix("stats: "))
    assert second["graphs"] == 2 and second["schedules_fetched"] == 2, second
    # Both were lookups' hits (their jobs done): neither graph was sent again.
    assert second["schedules_probed"] == 2, second
    assert second["schedules_local"] == 0 and second["eager"] == 0, second
    assert second["plans_used"] == 1 and "seconds:aot" not in second, second
    assert "kiln [" not in out.stderr  # no fallback warning
    # The plan it fetched is kept in its cache as the service sent it, and parses there.
    (kept,) = (tmp_path / "second-cache").glob("plans/??/*.json")
    assert parse_plan(kept.read_bytes()).key == kept.stem


def test_service_dying_mid_run_costs_one_warning_and_training_continues(service,
                                                                        kiln_warnings):
    # A generous request timeout: on a loaded 2-core machine the live service can take
    # seconds to answer, and this test is about its death, not its speed.
    kiln.configure(url=service.url, mode="wait", poll_interval=0.1, retries=0,
                   request_timeout=60.0)
    torch.manual_seed(0)
    model = SeedMLP(16, 32, 10)
    reference = SeedMLP(16, 32, 10)
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="kiln", dynamic=False)  # recompile per shape
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    # Batch 8 twice with the service up, then it dies; batch 4 compiles new graphs after.
    batches = [(torch.randn(n, 16), torch.randint(0, 10, (n,))) for n in (8, 8, 4, 4, 8)]
    for step, (x, y) in enumerate(batches):
        if step == 2:
            service.kill()
        losses = []
        for fn, opt in ((compiled, opts[0]), (reference, opts[1])):
            opt.zero_grad()
            loss = F.cross_entropy(fn(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        assert_close_losses(losses[:1], losses[1:])
    assert causes(kiln_warnings) == {"unreachable": 1}
    stats = kiln.stats()
    assert stats["schedules_fetched"] == 2  # batch 8: forward and backward, before the death
    assert stats["schedules_local"] >= 2 and stats["eager"] == 0  # batch 4: built locally
