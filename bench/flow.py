"""The whole service flow on one GPU box: serve, tune, fetch, run — on the public model set.

    python -m bench.flow                       # every model, full sizes, on cuda
    python -m bench.flow --models gpt2 --out /tmp/flow_gpt2.json
    TRITON_INTERPRET=1 python -m bench.flow --device cpu --small --models gpt_block_train

It starts the service the way a one-machine user would: `kiln serve` alone (SQLite,
in-process queue, a CPU build worker and one tuning worker per GPU), or, when
`redis-server` is on the PATH or `--redis` is given, Redis + `kiln serve` + `kiln worker`
processes. Then, for every model and step (inference, training step):

1. compile: a client process per case, all at once, `backend="kiln"` with KILN_MODE=wait:
   each graph is submitted, built, tuned on the GPU and fetched (the first step's time is
   the whole wait);
2. measure: once every graph is settled, a fresh client per case, one after another (the
   GPU is idle, the local cache empty): a service hit; wall clock of back-to-back steps
   (median of 3 rounds, one synchronize each) for eager and kiln, the error against eager,
   and the client's `kiln.stats()`.

Per graph it prints the entry's status (tuned / heuristic / failed), tuning seconds, the
tuner's eager / heuristic / tuned ms and which GPU tuned it (the worker, its device and the
device its tuning child reported), and writes everything as JSON (`--out`), with `wall_s`:
from the first submission to the last job finished (the service's own timestamps).

Several GPUs of one host: `--gpus N` tunes with N workers (GPUs 0..N-1); `--gpus 1,2` runs
the whole set once per count in the same command, each with a fresh service and fresh
compile caches, and writes `wall_s_1gpu`, `wall_s_2gpu` and each count's record
(`per_gpu_count`). `--no-measure` skips the timing of the second phase.

Without `--out` a GPU run's record, with its commit and time, joins `runs` of
bench/results/flow_h200.json (the flow's one results file) and a CPU run's is not written;
`--out` writes the record alone.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.records import append_run, stamp

ROOT = Path(__file__).resolve().parent.parent
FLOW_RESULTS = ROOT / "bench" / "results" / "flow_h200.json"
RESULT_MARK = "FLOW_RESULT "
FINAL_JOBS = ("done", "failed")


# ---- client side (a subprocess per case) ------------------------------------------------------
def run_client(model: str, step: str, device_name: str, small: bool, measure: bool,
               iters: int) -> dict[str, Any]:
    """One case through `backend="kiln"`: the first step (compile, wait for the service),
    then, with `measure`, eager vs kiln wall clock and errors. Returns the record."""
    import torch

    import kiln
    from bench.measure import Reference, first_step, synchronizer, wall_ms
    from bench.models import compiled, instantiate, step_fn
    from kiln import degrade

    device = torch.device(device_name)
    sync = synchronizer(device)
    case, module, inputs = instantiate(model, device, small)
    eager_step = step_fn(case, step, module, inputs)
    record: dict[str, Any] = {"model": model, "step": step}
    if measure:
        reference = Reference.of(eager_step, module)
        record["eager_wall_ms"] = wall_ms(eager_step, sync, iters)
    kiln_step = step_fn(case, step, compiled("kiln", module), inputs)
    got, record["first_step_s"] = first_step(kiln_step, sync)
    if measure:
        record.update(reference.errors(got, module))
        record["kiln_wall_ms"] = wall_ms(kiln_step, sync, iters)
    record["stats"] = kiln.stats()
    record["warned"] = sorted(degrade.warned())
    return record


# ---- the service ----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str | None = None, timeout: float = 10.0) -> Any:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 - our own URL
        return json.loads(reply.read())


class Service:
    """`kiln serve` (embedded, or with Redis and worker processes) in a scratch directory."""

    def __init__(self, workdir: Path, gpus: list[int], redis: str | None, tune_seconds: float,
                 tune_trials: int) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_urlsafe(32)
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "KILN_DATABASE_URL": f"sqlite:///{workdir / 'kiln.db'}",
                    "KILN_ADMIN_TOKEN": self.token, "KILN_PORT": str(self.port),
                    "KILN_TUNE_SECONDS": str(tune_seconds), "KILN_TUNE_TRIALS": str(tune_trials),
                    # a compile cache per run: a later run (another GPU count) starts as cold
                    "TRITON_CACHE_DIR": str(workdir / "triton-cache"),
                    "PYTHONUNBUFFERED": "1"}
        self.procs: list[subprocess.Popen] = []
        self.mode = "embedded"
        kiln_cmd = [sys.executable, "-m", "kiln.cli"]
        if redis is not None:
            self.mode = "redis"
            self.env["KILN_REDIS_URL"] = self._redis(redis, workdir)
            subprocess.run(kiln_cmd + ["db", "upgrade"], cwd=ROOT, env=self.env, check=True,
                           stdout=subprocess.DEVNULL)  # before any worker looks at the database
            self._start("serve", kiln_cmd + ["serve", "--gpus", "none"])
            self._start("worker-cpu", kiln_cmd + ["worker", "--device", "cpu"])
            for i in gpus:
                self._start(f"worker-cuda{i}", kiln_cmd + ["worker", "--device", f"cuda:{i}"])
        else:
            spec = ",".join(map(str, gpus)) if gpus else "none"
            self._start("serve", kiln_cmd + ["serve", "--gpus", spec])
        self._wait_healthy()

    def _redis(self, redis: str, workdir: Path) -> str:
        if redis.startswith("redis://"):
            return redis
        port = _free_port()
        self._start("redis", [redis, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(workdir)])
        return f"redis://127.0.0.1:{port}/0"

    def _start(self, name: str, cmd: list[str]) -> None:
        log = (self.logs / f"{name}.log").open("w")
        # A process group of its own: `stop` ends what the process started and left.
        self.procs.append(subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def _wait_healthy(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            try:
                _get(f"{self.url}/healthz", timeout=2.0)
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the service did not come up; see {self.logs}")

    def entries(self) -> list[dict[str, Any]]:
        return _get(f"{self.url}/v1/admin/entries?per_page=500", self.token)["items"]

    def entry(self, key: str) -> dict[str, Any]:
        return _get(f"{self.url}/v1/admin/entries/{key}", self.token)

    def worker_devices(self) -> dict[str, str]:
        """Each worker's id and its device (`cpu`, `cuda:N`)."""
        return {w["id"]: w["device"]
                for w in _get(f"{self.url}/v1/admin/stats", self.token)["workers"]}

    def stop(self) -> None:
        """Stop each process, then end whatever it left running in its group (a process
        killed past the 30 s leaves its children)."""
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # nothing left in the group
                pass


# ---- orchestration --------------------------------------------------------------------------
def _client(service: Service, args: argparse.Namespace, model: str, step: str, measure: bool,
            cache: Path) -> dict[str, Any]:
    env = {**service.env, "KILN_URL": service.url, "KILN_MODE": "wait",
           "KILN_WAIT_TIMEOUT": str(args.timeout), "KILN_CACHE_DIR": str(cache),
           "KILN_TAG": f"{model}.{step}"}
    for name in ("KILN_DATABASE_URL", "KILN_ADMIN_TOKEN", "KILN_PORT", "KILN_REDIS_URL"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "bench.flow", "client", "--model", model, "--step", step,
           "--device", args.device, "--iters", str(args.iters)]
    cmd += ["--small"] if args.small else []
    cmd += ["--measure"] if measure else []
    log = service.logs / f"client-{model}-{step}-{'measure' if measure else 'compile'}.log"
    with log.open("w") as out:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=out,
                              text=True, timeout=args.timeout + 600, check=False)
    found = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if done.returncode != 0 or not found:
        return {"model": model, "step": step, "error": f"client exited {done.returncode}; see {log}"}
    return json.loads(found[-1][len(RESULT_MARK):])


def _settle(service: Service, timeout: float) -> list[dict[str, Any]]:
    """Wait until every entry's job is over (built and, where a GPU tunes, tuned; or failed)."""
    deadline = time.monotonic() + timeout
    while True:
        entries = service.entries()
        busy = [e for e in entries
                if (service.entry(e["key"]).get("jobs") or [{}])[0].get("status") not in FINAL_JOBS]
        if not busy or time.monotonic() > deadline:
            return entries
        time.sleep(2.0)


def _graphs(service: Service, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    devices = service.worker_devices()
    rows = []
    for e in sorted(entries, key=lambda e: (e.get("tag") or "", e["created_at"] or "")):
        detail = service.entry(e["key"])
        job = (detail.get("jobs") or [{}])[0]
        rows.append({
            "key": e["key"], "tag": e.get("tag"), "status": e["status"],
            "kernels": len(detail.get("kernels") or []),
            "tuning_s": e.get("tuning_s"), "eager_ms": e.get("eager_ms"),
            "heuristic_ms": e.get("heuristic_ms"), "tuned_ms": e.get("tuned_ms"),
            "job_status": job.get("status"), "job_error": job.get("error"),
            "note": ((job.get("history") or [{}])[-1] or {}).get("message"),
            "submitted_at": e.get("created_at"), "finished_at": job.get("finished_at"),
            **tuned_by(job, devices),
        })
    return rows


def tuned_by(job: dict[str, Any], devices: dict[str, str]) -> dict[str, Any]:
    """Which GPU tuned a job (as `GET /v1/jobs/{id}` shows it): the finishing `worker`, its
    `worker_device`, the `tuned_device` its tuning child reported, every GPU worker that
    started tuning it (`tune_workers`: more than one when one died mid-tune) and how many
    tunings finished (`tunes_done`: 1 when the key was tuned exactly once). A GPU worker is
    one whose device is not the CPU."""
    on_gpu = [e for e in job.get("history") or []
              if devices.get(e.get("worker") or "", "cpu") != "cpu"]
    worker = job.get("worker")
    return {"worker": worker, "worker_device": devices.get(worker or ""),
            "tuned_device": job.get("tuned_device"),
            "tune_workers": [e["worker"] for e in on_gpu if e["status"] == "running"],
            "tunes_done": sum(e["status"] == "done" for e in on_gpu)}


def wall_seconds(graphs: list[dict[str, Any]]) -> float | None:
    """From the first submission to the last job finished, on the service's clock; None
    when a job never finished."""
    ends = [g["finished_at"] for g in graphs]
    if not graphs or None in ends:
        return None
    first = min(datetime.fromisoformat(g["submitted_at"]) for g in graphs)
    return round((max(map(datetime.fromisoformat, ends)) - first).total_seconds(), 2)


def gpu_checks(graphs: list[dict[str, Any]], gpus: int) -> dict[str, Any]:
    """What a run with `gpus` tuning workers must show: every graph tuned, each key tuned
    exactly once, each tuning child on its own worker's GPU, and (with several GPUs) every
    worker taking part."""
    used = sorted({g["worker_device"] for g in graphs if g["worker_device"]})
    return {
        "all_tuned": bool(graphs) and all(g["status"] == "tuned" for g in graphs),
        "each_key_tuned_once": all(g["tunes_done"] == 1 for g in graphs),
        "each_child_on_its_gpu": all(g["tuned_device"] is not None
                                     and g["tuned_device"] == g["worker_device"] for g in graphs),
        "gpus_used": used,
        "every_gpu_used": len(used) == gpus,
    }


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _print_tables(graphs: list[dict[str, Any]], clients: list[dict[str, Any]]) -> None:
    print("\nper graph (the service's record)")
    print(f"{'tag':<22}{'key':<14}{'status':<11}{'kernels':>8}{'tune s':>9}{'eager ms':>10}"
          f"{'heur ms':>10}{'tuned ms':>10}  tuned on (worker / child)")
    for g in graphs:
        print(f"{_fmt(g['tag']):<22}{g['key'][:12]:<14}{g['status']:<11}{g['kernels']:>8}"
              f"{_fmt(g['tuning_s'], 1):>9}{_fmt(g['eager_ms']):>10}{_fmt(g['heuristic_ms']):>10}"
              f"{_fmt(g['tuned_ms']):>10}  {_fmt(g['worker_device'])} / {_fmt(g['tuned_device'])}")
        if g["status"] != "tuned" or (g["note"] and "keeping" in g["note"]):
            print(f"    {g['job_error'] or g['note']}")
    if not clients:
        return
    print("\nper case (fresh client on a service hit; wall clock, ms per step)")
    print(f"{'case':<22}{'compile s':>10}{'hit s':>8}{'eager':>9}{'kiln':>9}{'vs eager':>9}"
          f"{'err':>9}  stats")
    for c in clients:
        m = c.get("measure", {})
        if "error" in m or "error" in c.get("compile", {}):
            print(f"{c['model'] + '.' + c['step']:<22}  {m.get('error') or c['compile'].get('error')}")
            continue
        ratio = m["eager_wall_ms"] / m["kiln_wall_ms"] if m.get("kiln_wall_ms") else None
        stats = {k: v for k, v in m.get("stats", {}).items()
                 if k in ("graphs", "schedules_fetched", "schedules_local", "eager", "builds")
                 or k.startswith("fallback:")}
        print(f"{c['model'] + '.' + c['step']:<22}{_fmt(c['compile'].get('first_step_s'), 1):>10}"
              f"{_fmt(m.get('first_step_s'), 1):>8}{_fmt(m.get('eager_wall_ms')):>9}"
              f"{_fmt(m.get('kiln_wall_ms')):>9}{_fmt(ratio, 2):>9}"
              f"{_fmt(m.get('error_vs_eager'), 4):>9}  {json.dumps(stats)}")


def gpu_counts(spec: str | None, visible: int) -> list[int] | None:
    """`--gpus`: None (every visible GPU, one run), a count N, or counts like 1,2 (a run
    each, in that order); each between 1 and the GPUs visible."""
    if spec is None:
        return None
    try:
        counts = [int(part) for part in spec.split(",")]
    except ValueError:
        raise SystemExit(f"--gpus takes a count or counts like 1,2; not {spec!r}") from None
    for n in counts:
        if not 1 <= n <= visible:
            raise SystemExit(f"--gpus {spec}: {n} GPU(s) asked, {visible} visible")
    return counts


def _run(args: argparse.Namespace, cases: list[tuple[str, str]], gpus: list[int],
         redis: str | None, logs_name: str) -> dict[str, Any]:
    """The set through a fresh service tuning on `gpus`: compile, settle, (measure)."""
    workdir = Path(tempfile.mkdtemp(prefix="kiln-flow-"))
    print(f"kiln flow: {len(cases)} cases on {args.device}, {len(gpus)} GPU(s); work dir "
          f"{workdir}", flush=True)
    started = time.monotonic()
    service = Service(workdir, gpus, redis, args.tune_seconds, args.tune_trials)
    print(f"kiln flow: service up in {time.monotonic() - started:.1f} s ({service.mode}, "
          f"{len(gpus)} GPU tuning worker(s))", flush=True)
    clients: list[dict[str, Any]] = []
    try:
        compile_start = time.monotonic()
        with ThreadPoolExecutor(len(cases)) as pool:  # every case waits on the service at once
            compiled = list(pool.map(lambda c: _client(service, args, *c, False,
                                                       workdir / f"cache-{c[0]}-{c[1]}"), cases))
        graphs = _graphs(service, _settle(service, args.timeout))
        flow_s = time.monotonic() - compile_start
        print(f"kiln flow: every graph settled {flow_s:.1f} s after the first client started",
              flush=True)
        for (model, step), first in zip(cases, compiled, strict=True):
            measured = {} if args.no_measure else \
                _client(service, args, model, step, True, workdir / f"hit-{model}-{step}")
            clients.append({"model": model, "step": step, "compile": first, "measure": measured})
    finally:
        service.stop()
    _print_tables(graphs, [] if args.no_measure else clients)
    logs = os.environ.get("OUT")
    if logs:  # the device machine: bring the service's logs back with the results
        shutil.make_archive(str(Path(logs) / logs_name), "gztar", service.logs)
    run = {"gpus": len(gpus), "service_mode": service.mode, "flow_s": round(flow_s, 1),
           "wall_s": wall_seconds(graphs)}
    if gpus:
        run["checks"] = gpu_checks(graphs, len(gpus))
    run.update(graphs=graphs, cases=clients)
    tuned = sum(g["status"] == "tuned" for g in graphs)
    print(f"\n{tuned} of {len(graphs)} graphs tuned; wall {run['wall_s']} s from the first "
          f"submission to the last job finished ({len(gpus)} GPU(s))")
    if gpus:
        print(f"checks: {json.dumps(run['checks'])}")
    return run


def _run_ok(run: dict[str, Any]) -> bool:
    """Every graph built and every client served; with GPUs, every graph tuned, each key
    once, each child on its worker's GPU, and every GPU used."""
    graphs = run["graphs"]
    served = all("error" not in c["compile"] and "error" not in c["measure"]
                 and not c["measure"].get("warned") for c in run["cases"])
    failed = any(g["status"] == "failed" for g in graphs)
    checks = run.get("checks")
    gpu_ok = checks is None or all(v for k, v in checks.items() if k != "gpus_used")
    return bool(graphs) and served and not failed and gpu_ok


def orchestrate(args: argparse.Namespace) -> int:
    import torch

    cases = [(m, s) for m in args.models for s in (("train",) if m == "gpt_block_train"
                                                   else ("infer", "train"))]
    visible = torch.cuda.device_count() if args.device.startswith("cuda") else 0
    if args.gpus is not None and not visible:
        raise SystemExit("--gpus needs --device cuda and a visible GPU")
    counts = gpu_counts(args.gpus, visible)
    listed = args.gpus is not None and "," in args.gpus
    redis = None if args.redis == "off" else args.redis or shutil.which("redis-server")
    runs = [_run(args, cases, list(range(n)), redis, f"flow_logs_{n}gpu" if listed else "flow_logs")
            for n in (counts or [visible])]
    result: dict[str, Any] = {
        "command": " ".join(["python -m bench.flow", *sys.argv[1:]]), **stamp(),
        "device": torch.cuda.get_device_name(0) if visible else "cpu",
        "gpus_visible": visible, "torch": torch.__version__,
        "tune_seconds": args.tune_seconds, "tune_trials": args.tune_trials}
    for run in runs:
        if run["gpus"]:
            result[f"wall_s_{run['gpus']}gpu"] = run["wall_s"]
    walls = [run["wall_s"] for run in runs]
    if len(runs) > 1 and None not in walls:
        print("\n" + "; ".join(f"{run['gpus']} GPU(s): {run['wall_s']} s" for run in runs)
              + f" (last / first: {walls[-1] / walls[0]:.2f})")
    if listed:
        result["per_gpu_count"] = runs
    else:
        (run,) = runs
        result.update(run)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.out}")
    elif visible:
        FLOW_RESULTS.write_text(json.dumps(append_run(FLOW_RESULTS, result), indent=1) + "\n")
        print(f"\nadded the run to {FLOW_RESULTS}")
    return 0 if all(_run_ok(run) for run in runs) else 1


def main(argv: list[str] | None = None) -> int:
    from bench.models import add_case_arguments

    parser = argparse.ArgumentParser(prog="python -m bench.flow", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    parser.add_argument("--models", type=lambda s: s.split(","),
                        default=["gpt2", "resnet18", "gpt_block_train"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke runs)")
    parser.add_argument("--iters", type=int, default=20, help="steps per timed round")
    parser.add_argument("--tune-seconds", type=float, default=60.0, help="tuning budget per graph")
    parser.add_argument("--tune-trials", type=int, default=64, help="candidates per graph")
    parser.add_argument("--timeout", type=float, default=1200.0, help="client wait per graph, s")
    parser.add_argument("--redis", default=None,
                        help="redis-server binary, redis:// URL, or off for the embedded serve "
                             "(default: redis-server on PATH, else the embedded serve)")
    parser.add_argument("--gpus", default=None, metavar="N|1,2",
                        help="tuning workers (GPUs 0..N-1; default every visible GPU); a list "
                             "runs the set once per count")
    parser.add_argument("--no-measure", action="store_true",
                        help="skip the second phase (hit and wall clock per case)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the JSON record here alone (default: a GPU run joins "
                             "the runs of bench/results/flow_h200.json, a CPU run is not written)")
    client = sub.add_parser("client", help="(internal) one case through backend='kiln'")
    add_case_arguments(client)
    client.add_argument("--measure", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "client":
        record = run_client(args.model, args.step, args.device, args.small, args.measure, args.iters)
        print(RESULT_MARK + json.dumps(record), flush=True)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
