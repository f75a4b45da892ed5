"""Schedule lookups under load while builds run: `GET /v1/schedules/{key}` at a target rate
over N keep-alive connections against a `kiln serve` whose CPU worker keeps building.

    python -m bench.lookup_load [--rate 1000] [--connections 32] [--seconds 30] [--keys 50]
        [--builders 1] [--repeat 3] [--token]
        [--distributed --database-url postgresql://... --redis-url redis://... --workers 2]
        [--out bench/results/lookup_load.json]

Starts the service (the embedded default: API, SQLite, in-process worker; `--distributed`:
the API on PostgreSQL and Redis, `--workers` CPU worker processes), submits `--keys` small
graphs and waits for their heuristic schedules, then starts `--builders` builders, each
submitting a new graph (a chain of `--chain` ops, new shapes each time) whenever its last
one is built, and drives lookups of the filled keys open loop, `--repeat` times: each
connection sends on its own schedule of rate/connections per second, and a request's
latency counts from when it was due, so a stalled service shows in the figures instead of
slowing the sender. Writes, per run and as min/median/max over the runs: req/s, latency
percentiles (ms), dropped connections (reset, refused or no answer within 5 s), answers by
status, the builds finished, the CPU seconds the API process used, how late the generator
itself woke to send (p99), and the machine's load average (the generator shares the
machine); with the command and the machine, as JSON. Builders are processes of their own,
so that making their graphs never holds the generator's GIL.
With `--token` every lookup carries a client token (`kiln token create`), as off loopback.
`--distributed` migrates and fills the database at `--database-url` (give it a scratch one)
and uses Redis keys under a prefix of its own (`kiln-load-<port>:`).
The per-token rate limit is off for the run (KILN_RATE_LIMIT_PER_S=0): a fleet's lookups
come from many tokens, this generator is one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ANSWER_TIMEOUT_S = 5.0
BUILDER_NICE = 15  # below the service's build children (10): a remote client's CPU


def _graph(rows: int, cols: int, chain: int) -> dict[str, Any]:
    """A kiln.graph/1 document: `chain` pointwise ops on a rows x cols tensor."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    import compiler

    def fn(t: torch.Tensor) -> tuple[torch.Tensor]:
        for i in range(chain):
            t = torch.sin(t) * (1.0 + i / 1000) + t if i % 2 else torch.relu(t) - t * 0.5
        return (t.sum(dim=-1),)

    x = torch.ones(rows, cols)
    return compiler.to_wire(make_fx(fn)(x), [x])


def _start(args: argparse.Namespace, workdir: Path, procs: list[subprocess.Popen]) -> str:
    """Start the service, its processes added to `procs` as they start (so that the caller
    ends them even when the start fails or is interrupted); its URL once it answers."""
    from tests.service.helpers import free_port, service_env, wait_for

    port = free_port()
    env = {"KILN_RATE_LIMIT_PER_S": "0", "KILN_KERNEL_DIR": str(workdir / "kernels")}
    if args.distributed:
        env.update(KILN_DATABASE_URL=args.database_url, KILN_REDIS_URL=args.redis_url,
                   KILN_REDIS_PREFIX=f"kiln-load-{port}:")
    else:
        env["KILN_DATABASE_URL"] = f"sqlite:///{workdir / 'kiln.db'}"
    subprocess.run([sys.executable, "-m", "kiln.cli", "db", "upgrade"], check=True,
                   env=service_env(**env), cwd=REPO, capture_output=True)
    if args.token:
        args.bearer = subprocess.run(
            [sys.executable, "-m", "kiln.cli", "token", "create", "--role", "client",
             "--name", "lookup-load"], check=True, env=service_env(**env), cwd=REPO,
            capture_output=True, text=True).stdout.strip()
    logs = open(workdir / "service.log", "wb")  # noqa: SIM115 - the processes' lifetime
    procs.append(subprocess.Popen([sys.executable, "-m", "kiln.cli", "serve", "--port",
                                   str(port)], env=service_env(**env), cwd=REPO, stdout=logs,
                                  stderr=logs))
    for _ in range(args.workers if args.distributed else 0):
        procs.append(subprocess.Popen([sys.executable, "-m", "kiln.cli", "worker", "--device",
                                       "cpu"], env=service_env(**env), cwd=REPO, stdout=logs,
                                      stderr=logs))
    url = f"http://127.0.0.1:{port}"
    import httpx

    def up() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, 120, "the service did not start (see service.log)")
    return url


def _submit(url: str, graph: dict[str, Any], target: dict[str, str]) -> str:
    import httpx

    answer = httpx.post(f"{url}/v1/graphs", json={"graph": graph, "target": target}, timeout=60)
    answer.raise_for_status()
    return answer.json()["key"]


def _built(url: str, key: str) -> bool:
    import httpx

    return httpx.get(f"{url}/v1/schedules/{key}", timeout=10).status_code == 200


def _fill(url: str, args: argparse.Namespace, target: dict[str, str]) -> list[str]:
    from tests.service.helpers import wait_for

    keys = [_submit(url, _graph(4, 8 + i, 2), target) for i in range(args.keys)]
    wait_for(lambda: all(_built(url, k) for k in keys), args.fill_timeout,
             "the filled graphs did not get their schedules in time")
    return keys


def _build_loop(url: str, chain: int, target: dict[str, str], index: int, count: int,
                stop: Any, done: Any) -> None:
    """One builder: a new graph whenever its last one has its schedule; puts each build's
    seconds (submission to schedule) on `done`. It stands in for clients on other machines:
    niced, so making its graphs (make_fx) does not take the service's cores."""
    os.nice(BUILDER_NICE)
    shape = 0
    while not stop.is_set():
        shape += 1
        start = time.monotonic()
        cols = 1000 + shape * count + index  # distinct across builders
        key = _submit(url, _graph(16, cols, chain), target)
        while not stop.is_set() and not _built(url, key):
            time.sleep(0.2)
        if not stop.is_set():
            done.put(time.monotonic() - start)


class Builders:
    """`count` builder processes keeping the service building. Processes, not threads:
    making a graph (make_fx, its JSON) must not hold the generator's GIL, or the
    generator's own stalls would show as the service's latency."""

    def __init__(self, url: str, chain: int, target: dict[str, str], count: int) -> None:
        ctx = mp.get_context("spawn")
        self.stop, self._done = ctx.Event(), ctx.Queue()
        self.procs = [ctx.Process(target=_build_loop, name=f"builder-{i}", daemon=True,
                                  args=(url, chain, target, i, count, self.stop, self._done))
                      for i in range(count)]
        self.finished: list[float] = []

    def start(self) -> None:
        for proc in self.procs:
            proc.start()

    def collect(self) -> int:
        """Builds finished so far."""
        while True:
            try:
                self.finished.append(self._done.get_nowait())
            except queue.Empty:
                return len(self.finished)

    def close(self) -> None:
        self.stop.set()
        for proc in self.procs:
            if proc.pid is not None:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        self.collect()


async def _connection(host: str, port: int, keys: list[str], dues: list[float], auth: str,
                      out: dict[str, Any]) -> None:
    """One keep-alive connection sending a lookup at each of `dues` (open loop)."""
    reader = writer = None
    for i, due in enumerate(dues):
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
            out["wake_lags"].append(time.monotonic() - due)  # the generator's own lateness
        key = keys[i % len(keys)]
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                                        ANSWER_TIMEOUT_S)
            writer.write(f"GET /v1/schedules/{key} HTTP/1.1\r\nHost: {host}\r\n{auth}\r\n"
                         .encode())
            status = await asyncio.wait_for(_answer(reader), ANSWER_TIMEOUT_S)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            out["dropped"] += 1
            out["drop_kinds"][type(exc).__name__] = out["drop_kinds"].get(type(exc).__name__, 0) + 1
            if writer is not None:
                writer.close()
            reader = writer = None
        else:
            out["latencies"].append(time.monotonic() - due)
            out["statuses"][status] = out["statuses"].get(status, 0) + 1


async def _answer(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = next((int(v) for k, _, v in (line.partition(":") for line in lines[1:])
                   if k.strip().lower() == "content-length"), 0)
    await reader.readexactly(length)
    return status


async def _drive(url: str, keys: list[str], args: argparse.Namespace) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    out: dict[str, Any] = {"latencies": [], "wake_lags": [], "statuses": {}, "dropped": 0,
                           "drop_kinds": {}}
    auth = f"Authorization: Bearer {args.bearer}\r\n" if args.bearer else ""
    start = time.monotonic()
    # A schedule fixed in advance: request j is due at start + j / rate, on connection
    # j mod connections, so every run sends rate x seconds requests.
    total = round(args.rate * args.seconds)
    await asyncio.gather(*(_connection(host, int(port), keys,
                                       [start + j / args.rate
                                        for j in range(c, total, args.connections)], auth, out)
                           for c in range(args.connections)))
    out["wall_s"] = time.monotonic() - start
    return out


GOAL = {"req_per_s": 1000, "p99_ms": 50, "dropped": 0}


def _cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used so far; None off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_summary(out: dict[str, Any], builds: int, api_cpu_s: float | None,
                 load: tuple[float, float], seconds: float) -> dict[str, Any]:
    """The figures of one run of the generator (`seconds` of requests due)."""
    lat, wake = sorted(out["latencies"]), sorted(out["wake_lags"])

    def pct(p: float) -> float | None:
        return round(1000 * lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None

    rate = round(len(lat) / out["wall_s"], 1)
    return {
        "answered": len(lat), "req_per_s": rate,
        "p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99),
        "max_ms": round(1000 * lat[-1], 2) if lat else None,
        "mean_ms": round(1000 * statistics.fmean(lat), 2) if lat else None,
        "dropped_connections": out["dropped"], "drop_kinds": out["drop_kinds"],
        "statuses": {str(k): v for k, v in sorted(out["statuses"].items())},
        "builds_finished": builds,
        # How late the generator woke for a request it was waiting to send (p99): a stall
        # of the shared machine's scheduler seen from the generator, not the service.
        "generator_wake_lag_p99_ms": round(1000 * wake[int(0.99 * len(wake))], 2) if wake else None,
        "api_cpu_s": None if api_cpu_s is None else round(api_cpu_s, 2),
        "load_average_1m": {"before": round(load[0], 2), "after": round(load[1], 2)},
        # Throughput: the answers per second of the schedule (req_per_s divides by the wall
        # time, which includes the last answers' latency).
        "goal_met": bool(lat) and len(lat) >= GOAL["req_per_s"] * seconds
                    and (pct(0.99) or 0) < GOAL["p99_ms"] and out["dropped"] == 0,
    }


def _spread(runs: list[dict[str, Any]], field: str) -> dict[str, float | None]:
    values = [r[field] for r in runs if r[field] is not None]
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _measure(url: str, keys: list[str], builders: Builders, pid: int,
             args: argparse.Namespace) -> list[dict[str, Any]]:
    """`--repeat` runs of the generator, each with its own figures."""
    runs = []
    for _ in range(args.repeat):
        before_builds = builders.collect()
        before_cpu, before_load = _cpu_s(pid), os.getloadavg()[0]
        out = asyncio.run(_drive(url, keys, args))
        after_cpu = _cpu_s(pid)
        api_cpu = None if before_cpu is None or after_cpu is None else after_cpu - before_cpu
        runs.append(_run_summary(out, builders.collect() - before_builds,
                                 api_cpu, (before_load, os.getloadavg()[0]), args.seconds))
        print(json.dumps(runs[-1]), flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lookup_load",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="lookups per second, all told")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30.0, help="of each run")
    parser.add_argument("--repeat", type=int, default=3, help="runs, back to back")
    parser.add_argument("--keys", type=int, default=50, help="schedules filled first")
    parser.add_argument("--builders", type=int, default=1,
                        help="graphs built at once in the background (0: none)")
    parser.add_argument("--chain", type=int, default=60, help="ops in each graph built meanwhile")
    parser.add_argument("--token", action="store_true", help="lookups carry a client token")
    parser.add_argument("--fill-timeout", type=float, default=600.0)
    parser.add_argument("--distributed", action="store_true")
    parser.add_argument("--database-url", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--workers", type=int, default=2, help="CPU workers (--distributed)")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/lookup_load.json")
    args = parser.parse_args(argv)
    args.bearer = None
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import compiler

    target = compiler.Target.detect("cpu").to_json()
    with tempfile.TemporaryDirectory(prefix="kiln-load-") as tmp:
        procs: list[subprocess.Popen] = []
        builders = None
        try:
            url = _start(args, Path(tmp), procs)
            builders = Builders(url, args.chain, target, args.builders)
            keys = _fill(url, args, target)
            builders.start()
            if args.builders:
                time.sleep(10)  # the builders have started (torch imported) and submitted
            runs = _measure(url, keys, builders, procs[0].pid, args)
        finally:
            if builders is not None:
                builders.close()
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)
    result = {
        "command": "python -m bench.lookup_load " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                 capture_output=True, text=True).stdout.strip(),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
        "mode": "distributed" if args.distributed else "embedded",
        "auth": "client token" if args.token else "none (loopback)",
        "target_req_per_s": args.rate, "connections": args.connections,
        "seconds_per_run": args.seconds, "builders": args.builders,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "spread": {field: _spread(runs, field)
                   for field in ("req_per_s", "p50_ms", "p99_ms", "max_ms",
                                 "generator_wake_lag_p99_ms", "api_cpu_s")},
        "dropped_connections": sum(r["dropped_connections"] for r in runs),
        "build_seconds": [round(s, 2) for s in builders.finished],
        "goal": GOAL,
        "runs_meeting_goal": sum(r["goal_met"] for r in runs),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
