"""Load benchmark: cache-hit `GET /v1/schedules/{key}` throughput and latency.

Creates a scratch PostgreSQL database, fills it with heuristic schedules, starts
`kiln serve` on it (Redis queue, rate limit off), and drives it with keep-alive HTTP/1.1
connections from a separate process. Prints throughput, p50/p90/p99 and the error count.

    .venv/bin/python scripts/load_schedules.py --seconds 10 --connections 32

Needs PostgreSQL (`--pg`, default the local test server) and Redis (`--redis`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATH = os.environ.get("KILN_LOAD_PATH", "/v1/schedules/{key}")  # e.g. /healthz for a baseline
sys.path.insert(0, str(REPO))


def _schedule(target: dict, graph_hash: str, kernels: int) -> dict:
    """A schedule document of realistic size (a few fused kernels)."""
    return {"format": "kiln.schedule/1", "graph_hash": graph_hash, "target": target,
            "status": "heuristic", "externs": ["aten.mm.default"],
            "kernels": [{"name": f"fused_layer_norm_gelu_add_{i}", "kind": "reduction",
                         "variant": "persistent", "nodes": [f"n{3 * i + j}" for j in range(3)],
                         "sizes": {"xnumel": 8192, "rnumel": 4096}, "dtype": "bfloat16",
                         "config": {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 8, "num_stages": 1},
                         "source_hash": uuid.uuid4().hex * 2} for i in range(kernels)]}


def seed(database_url: str, entries: int) -> list[str]:
    """Migrate the database and store `entries` heuristic schedules; returns their keys."""
    from compiler.wire.keys import COMPILER_VERSION
    from service import store
    from service.context import ServiceContext
    from service.migrate import upgrade
    from service.queue import InProcessQueue
    from service.settings import Settings

    upgrade(database_url)
    ctx = ServiceContext(Settings(database_url=database_url), queue=InProcessQueue(60))
    keys = []
    with ctx.transaction() as session:
        for _ in range(entries):
            graph_hash = uuid.uuid4().hex * 2
            target = {"device_type": "cuda", "arch": "sm_90", "name": "NVIDIA H200",
                      "torch": "2.11", "triton": "3.6.0", "compiler": COMPILER_VERSION}
            sub = store.Submission(key=uuid.uuid4().hex * 2, graph_hash=graph_hash, target=target,
                                   queue_class="cuda-sm_90-nvidia-h200", wire="{}",
                                   op_summary={"aten.mm.default": 1}, num_nodes=1)
            store.submit(session, sub)
            store.publish_schedule(session, sub.key, "heuristic",
                                   _schedule(target, graph_hash, 4), [], {})
            keys.append(sub.key)
    ctx.close()
    return keys


async def _connection(host: str, port: int, keys: list[str], until: float, warm_until: float,
                      latencies: list[float], errors: list[str]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    rng = random.Random(os.getpid() ^ id(latencies))
    while time.perf_counter() < until:
        key = rng.choice(keys)
        start = time.perf_counter()
        writer.write(f"GET {PATH.format(key=key)} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        done = time.perf_counter()
        if status != 200:
            errors.append(str(status))
        elif start >= warm_until:
            latencies.append(done - start)
    writer.close()


def _drive(host: str, port: int, keys: list[str], connections: int, seconds: float,
           warmup: float, out: mp.Queue) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def run() -> tuple[list[float], list[str]]:
        latencies: list[float] = []
        errors: list[str] = []
        now = time.perf_counter()
        await asyncio.gather(*[_connection(host, port, keys, now + warmup + seconds, now + warmup,
                                           latencies, errors) for _ in range(connections)])
        return latencies, errors

    out.put(asyncio.run(run()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432",
                        help="PostgreSQL server; a scratch database is created and dropped")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--entries", type=int, default=500)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--clients", type=int, default=1, help="load-generating processes")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--api-workers", type=int, default=1, help="kiln serve --workers")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()

    import psycopg

    server = args.pg.rstrip("/")
    name = f"kiln_load_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(f"{server}/postgres", autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{server.replace('postgresql://', 'postgresql+psycopg://')}/{name}"
    api = None
    try:
        keys = seed(url, args.entries)
        env = {**os.environ, "KILN_DATABASE_URL": url, "KILN_REDIS_URL": args.redis,
               "KILN_REDIS_PREFIX": f"kiln-load-{name}:", "KILN_RATE_LIMIT_PER_S": "0",
               "KILN_ADMIN_TOKEN": uuid.uuid4().hex, "PYTHONPATH": str(REPO)}
        api = subprocess.Popen([sys.executable, "-m", "kiln.cli", "--log-level", "warning",
                                "serve", "--port", str(args.port), "--workers",
                                str(args.api_workers)], env=env, cwd=REPO,
                               stdout=subprocess.DEVNULL)
        import httpx

        for _ in range(200):
            try:
                if httpx.get(f"http://127.0.0.1:{args.port}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        out: mp.Queue = mp.Queue()
        per = max(1, args.connections // args.clients)
        procs = [mp.Process(target=_drive, args=("127.0.0.1", args.port, keys, per, args.seconds,
                                                 args.warmup, out)) for _ in range(args.clients)]
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
        latencies = sorted(x for lat, _ in results for x in lat)
        errors = [e for _, err in results for e in err]
        q = statistics.quantiles(latencies, n=100)
        report = {"requests": len(latencies), "seconds": args.seconds,
                  "throughput_rps": len(latencies) / args.seconds,
                  "p50_ms": q[49] * 1e3, "p90_ms": q[89] * 1e3, "p99_ms": q[98] * 1e3,
                  "errors": len(errors), "connections": args.connections,
                  "clients": args.clients, "entries": args.entries,
                  "api_workers": args.api_workers, "cpus": os.cpu_count()}
        print(json.dumps(report, indent=2))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    finally:
        if api is not None:
            api.terminate()
            api.wait(20)
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
