"""The backend without the real service: local builds, the disk cache, and each fault the
client must survive (service down, garbage, hash mismatch, a schedule that lands late),
with results equal to eager and one warning per cause."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
import torch

import compiler
import kiln
from examples.models import SeedMLP
from kiln import progress, session
from kiln.cache import ScheduleCache
from kiln.compiled import CompiledGraph
from tests.kiln.fake_http import FakeServer, json_reply
from tests.kiln.helpers import (
    assert_close_losses,
    causes,
    check_grads_per_batch,
    free_port,
    train_mlp,
)

pytestmark = pytest.mark.usefixtures("kiln_state")


def _graphs_by_kind() -> dict[str, int]:
    kinds: dict[str, int] = {}
    for g in session.compiled_graphs():
        kinds[g.kind] = kinds.get(g.kind, 0) + 1
    return kinds


def test_backend_is_registered_under_the_name_kiln():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("kiln") is kiln.remote_compile


def test_each_graph_is_resolved_with_a_short_switch_interval(monkeypatch):
    """A graph's search installs binaries, loads kernels and waits on the service beside
    other threads' Python (compiler/runtime/gil.py); the interval comes back after it."""
    import sys

    from compiler.runtime.gil import SHORT_SWITCH_INTERVAL
    from kiln.resolve import Resolver

    seen = []
    real = Resolver.search

    def search(self, entry):
        seen.append(sys.getswitchinterval())
        return real(self, entry)

    monkeypatch.setattr(Resolver, "search", search)
    kiln.configure(url=None)
    before = sys.getswitchinterval()
    train_mlp(steps=1)
    assert len(seen) == 2  # forward and backward
    assert seen == [pytest.approx(min(before, SHORT_SWITCH_INTERVAL), rel=0.05)] * 2
    assert sys.getswitchinterval() == before


def test_training_without_a_service_builds_locally_and_the_cache_serves_a_restart(
        kiln_warnings, kiln_state):
    kiln.configure(url=None)
    want = train_mlp(steps=3, backend=None)
    assert_close_losses(train_mlp(steps=3), want)
    stats = kiln.stats()
    assert _graphs_by_kind() == {"forward": 1, "backward": 1}
    assert stats["schedules_local"] == 2 and stats["builds"] == 2 and stats["eager"] == 0
    assert all(g.level == "heuristic" and g.built.kernels for g in session.compiled_graphs())
    assert not causes(kiln_warnings)  # no service configured: nothing to warn about

    # A restart (fresh dynamo, fresh counters) finds both schedules on disk.
    torch._dynamo.reset()
    kiln.degrade.reset()
    assert_close_losses(train_mlp(steps=3), want)
    stats = kiln.stats()
    assert stats["schedules_cached"] == 2 and stats["schedules_local"] == 0


def test_service_down_at_start_trains_correctly_with_one_warning(kiln_warnings):
    kiln.configure(url=f"http://127.0.0.1:{free_port()}", retries=0)
    want = train_mlp(backend=None)
    start = time.monotonic()
    assert_close_losses(train_mlp(), want)
    assert time.monotonic() - start < 120
    assert causes(kiln_warnings) == {"unreachable": 1}
    stats = kiln.stats()
    assert stats["schedules_local"] == 2 and stats["eager"] == 0
    assert stats["fallback:unreachable"] >= 2  # forward and backward both met it


def test_service_answering_garbage_trains_correctly_with_one_warning(kiln_warnings):
    def garbage(method, path, body):
        return 200, {"Content-Type": "application/json"}, b'{"key": 12, "schedule": [}'

    with FakeServer(garbage) as srv:
        kiln.configure(url=srv.url, retries=0)
        want = train_mlp(backend=None)
        assert_close_losses(train_mlp(), want)
        session.shutdown()  # the poller keeps asking the garbage server; stop it first
    assert causes(kiln_warnings) == {"malformed": 1}
    assert kiln.stats()["schedules_local"] == 2


def _schedule_for(body: dict, status: str, corrupt_hashes: bool = False) -> dict:
    """A real schedule for the submitted graph, as a service would compute it."""
    graph = compiler.from_wire(body["graph"])
    target = compiler.Target.from_json(body["target"])
    built = compiler.build(graph, compiler.heuristic_schedule(graph, target))
    schedule = built.schedule.to_json()
    schedule["status"] = status
    if corrupt_hashes:
        for kernel in schedule["kernels"]:
            kernel["source_hash"] = "0" * 64
    return schedule


class TunedLater:
    """A fake service: pending for the first `pending_polls` polls of a key, then tuned."""

    def __init__(self, pending_polls: int, corrupt_hashes: bool = False) -> None:
        self.pending_polls = pending_polls
        self.corrupt = corrupt_hashes
        self.bodies: dict[str, dict] = {}
        self.polls: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, method, path, body):
        with self.lock:
            if method == "POST":
                key = compiler.tuning_key(compiler.from_wire(body["graph"]),
                                          compiler.Target.from_json(body["target"]))
                self.bodies[key] = body
                self.polls[key] = 0
            elif path.startswith("/v1/jobs/"):
                return json_reply(200, {"id": path.rsplit("/", 1)[1], "status": "running"})
            else:
                key = path.rsplit("/", 1)[1]
                self.polls[key] = self.polls.get(key, 0) + 1
            if key not in self.bodies:
                return json_reply(404, {"error": {"code": "not_found", "message": key}})
            if self.polls[key] < self.pending_polls:
                return json_reply(202, {"key": key, "status": "pending", "job_id": key[:8]})
            schedule = _schedule_for(self.bodies[key], "tuned", self.corrupt)
        return json_reply(200, {"key": key, "status": "tuned", "schedule": schedule,
                                "job_id": key[:8]})


def test_hash_mismatch_from_the_service_builds_locally_with_one_warning(kiln_warnings):
    with FakeServer(TunedLater(pending_polls=0, corrupt_hashes=True)) as srv:
        kiln.configure(url=srv.url)
        want = train_mlp(backend=None)
        assert_close_losses(train_mlp(), want)
    assert causes(kiln_warnings) == {"hash_mismatch": 1}
    stats = kiln.stats()
    assert stats["schedules_local"] == 2 and stats["schedules_fetched"] == 0


def test_a_graph_the_service_failed_to_build_is_built_locally_and_not_polled(kiln_warnings):
    def failed(method, path, body):
        key = compiler.tuning_key(compiler.from_wire(body["graph"]),
                                  compiler.Target.from_json(body["target"]))
        return json_reply(202, {"key": key, "status": "failed", "job_id": 3, "schedule": None})

    with FakeServer(failed) as srv:
        kiln.configure(url=srv.url, poll_interval=0.05)
        want = train_mlp(steps=2, backend=None)
        assert_close_losses(train_mlp(steps=2), want)
        time.sleep(0.3)  # a poller would have asked again by now
    assert [m for m, *_ in srv.requests] == ["POST", "POST"]  # forward, backward; no polls
    assert causes(kiln_warnings) == {"rejected": 1}
    assert kiln.stats()["schedules_local"] == 2


def test_each_graph_is_sent_with_its_model_class_and_role_unless_kiln_tag_is_set(
        monkeypatch, kiln_warnings):
    def failed(method, path, body):
        if method == "GET":  # a key submitted before (after the reset): its build failed
            return json_reply(404, {"error": {"code": "failed", "message": "it failed"}})
        key = compiler.tuning_key(compiler.from_wire(body["graph"]),
                                  compiler.Target.from_json(body["target"]))
        return json_reply(202, {"key": key, "status": "failed", "job_id": 3, "schedule": None})

    def scaled_sine(x):
        return torch.sin(x) * 3

    with FakeServer(failed) as srv:
        kiln.configure(url=srv.url)
        train_mlp(steps=1)
        torch.compile(scaled_sine, backend="kiln")(torch.randn(8))
        torch._dynamo.reset()
        monkeypatch.setenv("KILN_TAG", "nightly-llm")
        train_mlp(steps=1)
    tags = [body.get("tag") for method, _, body, _ in srv.requests if method == "POST"]
    assert tags == ["SeedMLP forward", "SeedMLP backward", "scaled_sine inference",
                    "nightly-llm", "nightly-llm"]


def test_hash_mismatch_in_the_local_cache_is_a_miss(kiln_warnings, kiln_state):
    kiln.configure(url=None)
    want = train_mlp(steps=2, backend=None)
    train_mlp(steps=2)
    cache = ScheduleCache(kiln_state["cache_dir"])
    for g in session.compiled_graphs():  # tamper every entry, keeping it self-consistent
        doc = g.built.schedule.to_json()
        for kernel in doc["kernels"]:
            kernel["source_hash"] = "f" * 64
        cache.path(g.key).unlink()
        cache.put(g.key, "tuned", doc)
    torch._dynamo.reset()
    kiln.degrade.reset()
    assert_close_losses(train_mlp(steps=2), want)
    assert causes(kiln_warnings) == {"hash_mismatch": 1}
    assert kiln.stats()["schedules_local"] == 2
    # the unusable entries were replaced by the good local ones
    assert {cache.get(g.key).status for g in session.compiled_graphs()} == {"heuristic"}


def test_wait_mode_takes_the_tuned_schedule_and_caches_it(kiln_warnings, kiln_state):
    with FakeServer(TunedLater(pending_polls=2)) as srv:
        kiln.configure(url=srv.url, mode="wait", poll_interval=0.05)
        want = train_mlp(steps=2, backend=None)
        assert_close_losses(train_mlp(steps=2), want)
    assert not causes(kiln_warnings)
    stats = kiln.stats()
    assert stats["schedules_fetched"] == 2 and stats["schedules_local"] == 0
    assert {g.level for g in session.compiled_graphs()} == {"tuned"}
    cache = ScheduleCache(kiln_state["cache_dir"])
    assert all(cache.get(g.key).status == "tuned" for g in session.compiled_graphs())


def test_wait_mode_gives_up_at_its_timeout_then_swaps_in_the_tuned_schedule(kiln_warnings):
    with FakeServer(TunedLater(pending_polls=8)) as srv:
        kiln.configure(url=srv.url, mode="wait", wait_timeout=0.2, poll_interval=0.05)
        model = SeedMLP(16, 32, 10).eval()
        x = torch.randn(4, 16)
        compiled = torch.compile(model, backend="kiln")
        start = time.monotonic()
        with torch.no_grad():
            want, got = model(x), compiled(x)
        assert time.monotonic() - start < 60  # no hang beyond the wait timeout (+ a build)
        torch.testing.assert_close(got, want)
        (graph,) = session.compiled_graphs()
        assert graph.level == "heuristic" and graph.origin == "local"
        deadline = time.monotonic() + 60
        while graph.level != "tuned" and time.monotonic() < deadline:
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), want)
            time.sleep(0.05)
    assert graph.level == "tuned" and graph.origin == "service"
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), want)
    assert causes(kiln_warnings) == {"wait_timeout": 1}
    assert kiln.stats()["swaps"] == 1


def _first_call() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, CompiledGraph]:
    """The narrow seed MLP compiled with kiln and called once without grad, checked against
    eager: (compiled module, input, eager output, its one graph)."""
    model = SeedMLP(16, 32, 10).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        want = model(x)
        compiled = torch.compile(model, backend="kiln")
        torch.testing.assert_close(compiled(x), want)
    (graph,) = session.compiled_graphs()
    return compiled, x, want, graph


def _progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kiln.progress"]


def test_a_long_wait_on_the_service_says_which_graph_for_how_long_and_what_it_got(
        monkeypatch, caplog, kiln_warnings):
    """A wait past `progress.NOTICE_S` logs one line naming the graph (kind, tag, short
    key), the most it may still last and what happens then, and one when the tuned
    schedule lands."""
    monkeypatch.setattr(progress, "NOTICE_S", 0.1)
    monkeypatch.setattr(progress, "tuned_by_service", lambda entry: True)  # as a GPU graph's
    caplog.set_level(logging.INFO, logger="kiln")
    with FakeServer(TunedLater(pending_polls=12)) as srv:
        kiln.configure(url=srv.url, mode="wait", poll_interval=0.05, wait_timeout=30)
        _, _, _, graph = _first_call()
    name = f"inference graph 'SeedMLP inference' ({graph.key[:12]})"
    waiting, got = _progress_lines(caplog)
    assert waiting == (f"kiln: waiting for the service's tuned schedule of the {name}, up to "
                       "30 s more; after that it starts with the best schedule at hand and "
                       "the tuned one is swapped in when it lands")
    assert got.startswith(f"kiln: got the tuned schedule of the {name} after ")
    assert 0.1 <= float(got.rsplit(" ", 2)[1]) < 30
    assert (graph.level, graph.origin) == ("tuned", "service")
    assert not causes(kiln_warnings)


def test_a_wait_that_times_out_says_it_gave_up_and_what_the_graph_starts_with(
        monkeypatch, caplog, kiln_warnings):
    monkeypatch.setattr(progress, "NOTICE_S", 0.1)
    monkeypatch.setattr(progress, "tuned_by_service", lambda entry: True)  # as a GPU graph's
    caplog.set_level(logging.INFO, logger="kiln")
    with FakeServer(TunedLater(pending_polls=1000)) as srv:
        kiln.configure(url=srv.url, mode="wait", poll_interval=0.05, wait_timeout=0.5)
        _, _, _, graph = _first_call()
        session.shutdown()
    waiting, gave_up = _progress_lines(caplog)
    assert "up to 0 s more" in waiting
    assert gave_up.startswith(f"kiln: gave up waiting for the tuned schedule of the inference "
                              f"graph 'SeedMLP inference' ({graph.key[:12]}) after ")
    assert gave_up.endswith("; starting with a heuristic schedule built here, the tuned one "
                            "is swapped in when it lands")
    assert (graph.level, graph.origin) == ("heuristic", "local")
    assert causes(kiln_warnings) == {"wait_timeout": 1}


def test_a_cpu_graphs_wait_is_for_its_build_and_promises_no_tuned_schedule(
        monkeypatch, caplog, kiln_warnings):
    """The service builds a CPU graph and never tunes it: its wait lines say so (what
    `make serve` on a machine without a GPU gives every graph)."""
    monkeypatch.setattr(progress, "NOTICE_S", 0.1)
    caplog.set_level(logging.INFO, logger="kiln")
    with FakeServer(TunedLater(pending_polls=1000)) as srv:
        kiln.configure(url=srv.url, mode="wait", poll_interval=0.05, wait_timeout=0.5)
        _, _, _, graph = _first_call()
        session.shutdown()
    name = f"inference graph 'SeedMLP inference' ({graph.key[:12]})"
    waiting, gave_up = _progress_lines(caplog)
    assert waiting == (f"kiln: waiting for the service to build the {name}, up to 0 s more "
                       "(graphs for the CPU are built there, never tuned); after that it is "
                       "built here from the heuristic schedule")
    assert gave_up.startswith(f"kiln: gave up waiting for the service to build the {name} "
                              "after ")
    assert gave_up.endswith("; starting with a heuristic schedule built here")
    assert (graph.level, graph.origin) == ("heuristic", "local")


def test_a_short_wait_on_the_service_logs_nothing(caplog, kiln_warnings):
    caplog.set_level(logging.DEBUG, logger="kiln")
    with FakeServer(TunedLater(pending_polls=1)) as srv:
        kiln.configure(url=srv.url, mode="wait", poll_interval=0.05, wait_timeout=30)
        _, _, _, graph = _first_call()
    assert graph.level == "tuned" and _progress_lines(caplog) == []


def test_async_mode_starts_at_once_and_swaps_the_tuned_schedule_in_between_calls(
        kiln_warnings):
    # One calling thread: the Triton interpreter (CPU) cannot run kernels from two threads
    # at once; tests/kiln/test_compiled.py covers a swap landing during a call.
    service = TunedLater(pending_polls=4)
    with FakeServer(service) as srv:
        kiln.configure(url=srv.url, mode="async", poll_interval=0.05)
        compiled, x, want, graph = _first_call()
        assert graph.level == "heuristic" and graph.origin == "local"
        with torch.no_grad():
            calls = 0
            deadline = time.monotonic() + 60
            while graph.level != "tuned" and time.monotonic() < deadline:
                torch.testing.assert_close(compiled(x), want)
                calls += 1
            torch.testing.assert_close(compiled(x), want)
    assert graph.level == "tuned" and graph.origin == "service"
    assert calls > 0  # the job ran on the heuristic build while the tuned one was pending
    assert not causes(kiln_warnings)
    stats = kiln.stats()
    assert stats["swaps"] == 1 and stats["schedules_fetched"] == 1


def test_a_service_that_comes_back_later_gets_the_graph_and_its_tuned_schedule_swapped_in(
        kiln_warnings):
    port = free_port()
    kiln.configure(url=f"http://127.0.0.1:{port}", mode="async", poll_interval=0.05)
    compiled, x, want, graph = _first_call()
    assert graph.level == "heuristic"  # service down: local heuristic
    with torch.no_grad():
        service = TunedLater(pending_polls=0)
        with FakeServer(service, port=port):
            deadline = time.monotonic() + 60
            while graph.level != "tuned" and time.monotonic() < deadline:
                torch.testing.assert_close(compiled(x), want)
                time.sleep(0.05)
            session.shutdown()
        torch.testing.assert_close(compiled(x), want)
    assert graph.level == "tuned" and service.bodies  # the poller submitted the graph
    assert causes(kiln_warnings) == {"unreachable": 1}


class ForgetsOnce:
    """A fake service that forgets the graph after its first submission (404), then runs a
    second job whose tuned schedule lands with it: the schedule stays pending until the
    client has seen the job done."""

    def __init__(self) -> None:
        self.posts, self.job_done, self.body = 0, False, None
        self.lock = threading.Lock()

    def __call__(self, method, path, body):
        with self.lock:
            if method == "POST":
                self.posts, self.body = self.posts + 1, body
                key = compiler.tuning_key(compiler.from_wire(body["graph"]),
                                          compiler.Target.from_json(body["target"]))
                return json_reply(202, {"key": key, "status": "pending",
                                        "job_id": f"job{self.posts}"})
            if path.startswith("/v1/jobs/"):
                job = path.rsplit("/", 1)[1]
                self.job_done |= job == "job2"
                return json_reply(200, {"id": job, "status": "done" if job == "job2" else "running"})
            key = path.rsplit("/", 1)[1]
            if self.posts < 2:
                return json_reply(404, {"error": {"code": "not_found", "message": key}})
            if not self.job_done:
                return json_reply(202, {"key": key, "status": "pending"})  # no job id
            schedule = _schedule_for(self.body, "tuned")
        return json_reply(200, {"key": key, "status": "tuned", "schedule": schedule})


@pytest.mark.parametrize("mode", ["wait", "async"])
def test_a_forgotten_graph_is_submitted_again_and_its_finished_job_brings_the_schedule(
        mode, kiln_warnings):
    service = ForgetsOnce()
    with FakeServer(service) as srv:
        kiln.configure(url=srv.url, mode=mode, poll_interval=0.05, wait_timeout=30)
        compiled, x, want, graph = _first_call()
        deadline = time.monotonic() + 60  # async: the poller swaps it in
        while graph.level != "tuned" and time.monotonic() < deadline:
            time.sleep(0.05)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), want)
        session.shutdown()
    assert (graph.level, graph.origin) == ("tuned", "service")
    paths = [path for _, path, *_ in srv.requests]
    assert service.posts == 2 and "/v1/jobs/job2" in paths
    assert paths.index("/v1/jobs/job2") < len(paths) - 1  # the schedule was read after it
    assert not causes(kiln_warnings)


@pytest.mark.parametrize(("job_status", "exchanges"), [("done", 1), (None, 3)])
def test_a_heuristic_answer_whose_job_is_done_settles_a_wait_in_one_exchange(
        job_status, exchanges, kiln_warnings):
    """A service with no tuner answers a submission with the heuristic schedule and its job
    done: wait mode takes it at once. One that does not name the job's state costs a read of
    the job and of the schedule again, as before `job_status`."""

    def heuristic(method, path, body):
        if path.startswith("/v1/jobs/"):
            return json_reply(200, {"id": "j", "status": "done"})
        if method == "POST":
            heuristic.body = body
        key = compiler.tuning_key(compiler.from_wire(heuristic.body["graph"]),
                                  compiler.Target.from_json(heuristic.body["target"]))
        return json_reply(202, {"key": key, "status": "heuristic", "job_id": "j",
                                "job_status": job_status,
                                "schedule": _schedule_for(heuristic.body, "heuristic")})

    with FakeServer(heuristic) as srv:
        kiln.configure(url=srv.url, mode="wait", poll_interval=0.05, wait_timeout=30)
        _, _, _, graph = _first_call()
        session.shutdown()
    assert (graph.level, graph.origin, graph.final) == ("heuristic", "service", True)
    assert len(srv.requests) == exchanges
    assert not causes(kiln_warnings)


@pytest.mark.parametrize(("job_status", "second_exchanges"),
                         [("done", ["GET"]), ("running", ["GET", "POST"])])
def test_a_known_graph_whose_job_is_done_is_a_hit_without_sending_it(
        job_status, second_exchanges, kiln_warnings):
    """Before submitting a graph, the client reads its schedule (the service's hot path): a
    schedule whose job is done is the whole exchange, and the graph is not sent. While its
    job runs, the graph is submitted (the client joins the job, as before the lookup)."""
    bodies: dict[str, dict] = {}

    def service(method, path, body):
        if method == "POST":
            key = compiler.tuning_key(compiler.from_wire(body["graph"]),
                                      compiler.Target.from_json(body["target"]))
            bodies[key] = body
            extra = {"job_id": "j"}
        else:  # FakeServer answers a lookup of a key it was never sent (404)
            key, extra = path.rsplit("/", 1)[-1], {}
        return json_reply(200 if method == "GET" else 202, {
            "key": key, "status": "heuristic", "job_status": job_status, **extra,
            "schedule": _schedule_for(bodies[key], "heuristic")})

    model = SeedMLP(16, 32, 10).eval()
    x = torch.randn(4, 16)
    with FakeServer(service) as srv:
        kiln.configure(url=srv.url, mode="async", poll_interval=600, cache=False)
        with torch.no_grad():
            want = model(x)
            for _ in range(2):  # a second process's compile: dynamo and kiln start again
                torch._dynamo.reset()
                session.shutdown()
                torch.testing.assert_close(torch.compile(model, backend="kiln")(x), want)
    assert len(srv.lookups) == 1  # the first compile's: the service did not know the graph
    assert [m for m, *_ in srv.requests] == ["POST", *second_exchanges]
    assert kiln.stats().get("schedules_probed", 0) == (1 if job_status == "done" else 0)
    assert all(g.origin == "service" for g in session.compiled_graphs())
    assert not causes(kiln_warnings)


def test_dynamic_shapes_warn_once_and_compile_per_concrete_shape(kiln_warnings):
    kiln.configure(url=None)
    torch.manual_seed(0)
    model = SeedMLP(16, 32, 10)
    compiled = torch.compile(model, backend="kiln", dynamic=True)
    check_grads_per_batch(compiled, model, (3, 5, 3))
    assert causes(kiln_warnings) == {"dynamic_shapes": 1}
    stats = kiln.stats()
    # forward and backward, once per concrete shape (3 and 5), reused for the second 3
    assert stats["schedules_local"] == 4 and stats["eager"] == 0, stats


@torch.library.custom_op("kilntest::scaled", mutates_args=())
def _scaled(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@_scaled.register_fake
def _(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)


def test_an_unsupported_op_runs_eagerly_with_one_warning(kiln_warnings):
    kiln.configure(url=None)
    model = SeedMLP(16, 32, 10).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        for factor in (2.0, 3.0):  # two graphs (the factor is a constant), one warning
            fn = torch.compile(lambda x, f=factor: _scaled(model(x), f), backend="kiln")
            torch.testing.assert_close(fn(x), model(x) * factor)
    assert causes(kiln_warnings) == {"unsupported": 1}
    assert kiln.stats()["eager"] == 2


def test_a_hung_service_costs_one_timeout_not_one_per_graph(kiln_warnings):
    def hang(method, path, body):
        time.sleep(3)
        return json_reply(503, {})

    with FakeServer(hang) as srv:
        # poll_interval: keep the background poller out of the count below
        kiln.configure(url=srv.url, request_timeout=0.5, retries=0, poll_interval=60)
        want = train_mlp(steps=2, backend=None)
        start = time.monotonic()
        assert_close_losses(train_mlp(steps=2), want)
        elapsed = time.monotonic() - start
        session.shutdown()
    assert causes(kiln_warnings) == {"timeout": 1}
    assert len(srv.requests) == 1  # the forward's POST timed out; the backward did not ask
    assert kiln.stats()["fallback:timeout"] == 2
    assert elapsed < 30  # one 0.5 s timeout plus local builds, no hang


def test_a_bad_environment_value_runs_eagerly_with_one_clear_warning(kiln_warnings,
                                                                      monkeypatch):
    monkeypatch.setenv("KILN_MODE", "sometimes")
    model = SeedMLP(16, 32, 10)
    x = torch.randn(4, 16)
    torch.testing.assert_close(torch.compile(model, backend="kiln")(x), model(x))
    (warning,) = [w for w in kiln_warnings if issubclass(w.category, kiln.KilnWarning)]
    assert "KILN_MODE" in str(warning.message)


@pytest.mark.parametrize("url", ["notaurl", "ftp://x"])
@pytest.mark.parametrize("plans", ["1", "0"])
def test_a_url_that_is_not_http_builds_locally_with_one_config_warning(
        kiln_warnings, monkeypatch, url, plans):
    """KILN_URL=notaurl killed the job on the plan path (BackendCompilerFailed) and, with
    plans off, was labelled an unsupported op: it is a bad setting, said once, and the
    graphs build locally as with KILN_URL=off."""
    monkeypatch.setenv("KILN_URL", url)
    monkeypatch.setenv("KILN_PLANS", plans)
    assert_close_losses(train_mlp(steps=2), train_mlp(steps=2, backend=None))
    assert causes(kiln_warnings) == {"config": 1}
    (warning,) = [w for w in kiln_warnings if issubclass(w.category, kiln.KilnWarning)]
    assert "KILN_URL" in str(warning.message) and "without the service" in str(warning.message)
    stats = kiln.stats()
    assert stats["eager"] == 0 and stats["builds"] == 2 and stats["schedules_local"] == 2


def test_cache_entries_are_json_schedules(kiln_state):
    kiln.configure(url=None)
    train_mlp(steps=1)
    files = sorted(kiln_state["cache_dir"].glob("??/*.json"))
    assert len(files) == 2
    for f in files:
        doc = json.loads(f.read_text())
        compiler.Schedule.from_json(doc["schedule"])
    (plan,) = kiln_state["cache_dir"].glob("plans/??/*.json")  # the model's plan (kiln.plans)
    assert json.loads(plan.read_text())["format"] == "kiln.plan/1"


def test_cpu_graphs_run_eagerly_without_the_interpreter(monkeypatch, kiln_warnings):
    """Without TRITON_INTERPRET=1 Triton cannot run kiln's kernels on the CPU: eager, one
    warning, nothing built, the same losses."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not compiler.runs_on_cpu()
    kiln.configure(url=None)
    want = train_mlp(steps=3, backend=None)
    assert_close_losses(train_mlp(steps=3), want)
    assert causes(kiln_warnings) == {"cpu_eager": 1}
    stats = kiln.stats()
    assert stats["builds"] == 0 and stats["eager"] == 2


def test_a_channels_last_conv_model_trains_like_eager(kiln_warnings):
    """`model.to(memory_format=torch.channels_last)`: AOTAutograd traces NHWC activations,
    and kiln's forward must give its convolutions' results that layout too (torch's meta
    kernel says row-major; the backward then refused the forward's activations)."""
    kiln.configure(url=None)

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 1), torch.nn.ReLU()).to(memory_format=torch.channels_last)

    x = torch.randn(2, 3, 7, 6).to(memory_format=torch.channels_last)
    ref, model = make(), make()
    want = ref(x)
    want.float().square().mean().backward()
    got = torch.compile(model, backend="kiln")(x)
    got.float().square().mean().backward()
    torch.testing.assert_close(got, want)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert kiln.stats()["builds"] == 2 and kiln.stats()["eager"] == 0
    assert not causes(kiln_warnings)


def test_a_convnet_trains_channels_last_end_to_end(kiln_warnings, monkeypatch):
    """A row-major convnet's training step: the forward runs its convolutions channels-last
    and keeps its saved activations so, the backward's inputs are restrided to match
    (resnet18 on an H200 ran 166 layout conversions a step before), and the gradients are
    eager's."""
    from compiler.lowering import training_layout

    kiln.configure(url=None)
    rewrites: list[bool] = []
    real = training_layout.channels_last_training

    def spy(forward, backward, num_user_outputs):
        changed = real(forward, backward, num_user_outputs)
        rewrites.append(changed)
        saved = [p.meta["val"] for p in backward.graph.find_nodes(op="placeholder")]
        rewrites.append(any(v.dim() == 4 and v.is_contiguous(memory_format=torch.channels_last)
                            and not v.is_contiguous() for v in saved))
        # the backward's convolutions read the forward's channels-last copies of the input
        # and the weights (saved), not the row-major originals they would convert again
        convs = backward.graph.find_nodes(op="call_function",
                                          target=torch.ops.aten.convolution_backward.default)
        rewrites.append(bool(convs) and all(
            n.args[k].meta["val"].is_contiguous(memory_format=torch.channels_last)
            for n in convs for k in (1, 2)))
        return changed

    monkeypatch.setattr(training_layout, "channels_last_training", spy)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
            self.conv2, self.bn2 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
            self.skip = torch.nn.Conv2d(4, 8, 1)
            self.fc = torch.nn.Linear(8, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.bn1(self.conv1(x)))
            h = torch.relu(self.bn2(self.conv2(h)) + self.skip(x))
            return self.fc(torch.nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return Block()

    x = torch.randn(2, 4, 6, 5)
    ref, model = make(), make()
    want = ref(x)
    want.float().sin().mean().backward()
    got = torch.compile(model, backend="kiln")(x)
    got.float().sin().mean().backward()
    assert rewrites == [True, True, True]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert kiln.stats()["builds"] == 2 and kiln.stats()["eager"] == 0
    assert not causes(kiln_warnings)


def test_batch_norm_statistics_are_written_in_place_not_copied_after_the_call(
        kiln_warnings, monkeypatch):
    """A forward that updates BatchNorm's running statistics: kiln writes them into the
    buffers itself (one `_foreach_copy_`), so that AOTAutograd's runtime, and on the next
    compile the plan's runner, copy nothing into them after the call (resnet18: 60 copies
    a step); the statistics and gradients are eager's."""
    kiln.configure(url=None)

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU())

    model, ref = make(), make()
    buffers = {b.untyped_storage().data_ptr() for b in model[1].buffers()}
    copied_in: list[tuple[int, ...]] = []
    copy = torch.Tensor.copy_

    def spy(dst: torch.Tensor, src: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        if dst.untyped_storage().data_ptr() in buffers and \
                src.untyped_storage().data_ptr() != dst.untyped_storage().data_ptr():
            copied_in.append(tuple(dst.shape))
        return copy(dst, src, *args, **kwargs)

    for through in ("AOTAutograd", "plan"):  # the first compile records the plan the second uses
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="kiln")
        for step in range(3):
            x = torch.randn(16, 8)
            if step:  # the first step compiles (dynamo traces BatchNorm's Python)
                monkeypatch.setattr(torch.Tensor, "copy_", spy)
            compiled(x).sum().backward()
            monkeypatch.setattr(torch.Tensor, "copy_", copy)
            ref(x).sum().backward()
        assert copied_in == [], through
    assert kiln.stats()["plans_used"] == 1
    for mine, theirs in zip(model[1].buffers(), ref[1].buffers(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert kiln.stats()["eager"] == 0 and not causes(kiln_warnings)
