"""The README's dashboard screenshots (docs/screenshots/*.png), taken from a real run.

    .venv/bin/python scripts/screenshots.py                 # rewrites docs/screenshots/
    .venv/bin/python scripts/screenshots.py --out /tmp/shots --keep

Starts `kiln serve` as `make serve` does (the embedded default: SQLite, in-process queue,
a CPU build worker, no GPU tuning worker on a machine without a GPU) on a free loopback
port, with its database, the clients' caches and the kernel directories in a fresh
temporary directory. Runs the README's examples against it on the Triton interpreter
(`examples/seed_mlp.py`, `examples/train_gpt.py`), then the seed MLP once more from an
empty client cache, as a second machine would (a service hit), and waits until no job is
left. Then logs in to the dashboard with the admin token the server kept beside its
database and screenshots the overview and one entry (`--entry-tag`) with Debian's chromium
(`make browser`) through Playwright. Ends everything it started, also when a step fails.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.processes import end_left_behind, marked, new_mark  # noqa: E402
from tests.service.helpers import free_port, service_env  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
SHOTS = ("overview", "entry")
EXAMPLES = (("seed_mlp.py",), ("train_gpt.py",), ("seed_mlp.py",))  # the last from a new cache
START_S = 120.0  # for `kiln serve` to print its banner (it migrates a new database first)
EXAMPLE_S = 600.0  # per example, on the interpreter of a busy machine
SETTLE_S = 120.0  # for the service's queue to empty after the examples
STOP_S = 30.0  # for `kiln serve` to end after Ctrl-C's signal, before it is killed
MIN_PNG_BYTES = 20_000  # a rendered page, not a blank one


def run_env(work: Path, mark: dict[str, str], url: str | None = None,
            cache: str = "cache") -> dict[str, str]:
    """The environment of a process this script starts: none of the caller's `KILN_*`
    settings (a `KILN_REDIS_URL` or `KILN_URL` of the caller's own must not leak in), the
    embedded database, kernel and Triton caches under `work`, this tree on the path, the
    Triton interpreter, and `mark`, by which whatever is left of it is found and ended.
    With `url`, a client's: that service and the client cache `work/<cache>`."""
    env = service_env(KILN_DATABASE_URL=f"sqlite:///{work / 'data' / 'kiln.db'}",
                      KILN_KERNEL_DIR=str(work / "kernels"),
                      TRITON_CACHE_DIR=str(work / "triton"), **mark)
    env.pop("TORCH_LOGS", None)
    if url is not None:
        env.update(KILN_URL=url, KILN_CACHE_DIR=str(work / cache))
    return env


def admin_token(work: Path) -> str:
    """The admin token `kiln serve` created and kept beside its database."""
    token = (work / "data" / "admin-token").read_text().strip()
    if not token:
        raise RuntimeError(f"{work / 'data' / 'admin-token'} is empty")
    return token


def wait_until(ready: Callable[[], Any], timeout: float, what: str,
               alive: Callable[[], bool] = lambda: True) -> Any:
    """Poll `ready()` until it is truthy; RuntimeError naming `what` after `timeout` s or
    once `alive()` is false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        value = ready()
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"{what}: not after {timeout:.0f} s" if alive() else
                       f"{what}: the process ended")


@contextmanager
def serving(work: Path, port: int, mark: dict[str, str]) -> Iterator[str]:
    """`kiln serve --port <port>` for the body, its output in `work/serve.log`; yields its
    URL once its start banner is printed. Stopped as Ctrl-C stops it, then whatever
    carries `mark` is killed."""
    log_path = work / "serve.log"
    (work / "data").mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kiln.cli", "serve", "--port", str(port)],
                                env=run_env(work, mark), cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: b"kiln: ready:" in log_path.read_bytes(), START_S,
                       f"kiln serve (log: {log_path})", alive=lambda: proc.poll() is None)
            yield f"http://127.0.0.1:{port}"
        finally:
            for left in stop(proc, mark):
                print(f"screenshots: killed a process left running: {left[:200]}",
                      file=sys.stderr)


def stop(proc: subprocess.Popen, mark: dict[str, str]) -> list[str]:
    """End `proc` with SIGINT (what Ctrl-C sends), killing it past `STOP_S`, then every
    process still carrying `mark` (gone when it returns); the command lines of those that
    had to be killed that way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    left = list(end_left_behind(mark).values())
    wait_until(lambda: not marked(mark), 10, "the killed processes to go")
    return left


def run_example(work: Path, url: str, mark: dict[str, str], args: tuple[str, ...],
                cache: str) -> str:
    """One example against the service, as the README runs it; its output, which must end
    in OK."""
    command = [sys.executable, str(REPO / "examples" / args[0]), *args[1:]]
    print(f"screenshots: {' '.join(['TRITON_INTERPRET=1', 'python', 'examples/' + args[0]])} "
          f"(client cache {cache})", flush=True)
    out = subprocess.run(command, env=run_env(work, mark, url, cache), cwd=REPO,
                         capture_output=True, text=True, timeout=EXAMPLE_S)
    text = out.stdout + out.stderr
    if out.returncode != 0 or out.stdout.rstrip().splitlines()[-1:] != ["OK"]:
        raise RuntimeError(f"examples/{args[0]} failed (exit {out.returncode}):\n{text[-3000:]}")
    return text


def idle(stats: dict[str, Any]) -> bool:
    """No job queued or running in `GET /v1/admin/stats`'s answer."""
    return not any(n for stage in stats.get("jobs_waiting", {}).values() for n in stage.values())


def entry_key(entries: dict[str, Any], tag: str) -> str:
    """The key of the entry tagged `tag` in `GET /v1/admin/entries`'s answer."""
    keys = [item["key"] for item in entries["items"] if item.get("tag") == tag]
    if not keys:
        known = sorted({str(item.get("tag")) for item in entries["items"]})
        raise RuntimeError(f"no entry tagged {tag!r}; the entries' tags: {', '.join(known)}")
    return keys[0]


def settle(url: str, token: str) -> None:
    """Wait until the service's queue is empty (the examples waited for their schedules;
    a worker may still be finishing its job)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    wait_until(lambda: idle(httpx.get(f"{url}/v1/admin/stats", headers=headers,
                                      timeout=10).json()), SETTLE_S, "the service's queue")


def shoot(url: str, token: str, tag: str, out: Path, chromium: str) -> list[Path]:
    """Log in through the dashboard's form and screenshot the overview and the entry
    tagged `tag`, its first kernel's source open (full pages, 1280 px wide), into `out`."""
    import httpx
    from playwright.sync_api import sync_playwright

    entries = httpx.get(f"{url}/v1/admin/entries", headers={"Authorization": f"Bearer {token}"},
                        timeout=10).json()
    key = entry_key(entries, tag)
    paths = [out / f"{name}.png" for name in SHOTS]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.goto(f"{url}/admin")
            page.fill("#token", token)
            page.click("button[type=submit]")
            page.wait_for_url(f"{url}/admin")
            page.wait_for_timeout(1500)  # the API flushes its hit counters once a second
            page.reload()
            page.screenshot(path=str(paths[0]), full_page=True)
            page.goto(f"{url}/admin/entries/{key}")
            page.locator(".kernel details.source-block summary").first.click()  # its Triton
            page.screenshot(path=str(paths[1]), full_page=True)
        finally:
            browser.close()
    for path in paths:
        if path.stat().st_size < MIN_PNG_BYTES:
            raise RuntimeError(f"{path} is {path.stat().st_size} bytes: a blank page?")
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots",
                        help="where the PNGs go (default: docs/screenshots)")
    parser.add_argument("--entry-tag", default="SeedMLP inference",
                        help="the entry to screenshot, by its dashboard tag")
    parser.add_argument("--chromium", default=CHROMIUM, help="the browser Playwright drives")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run's directory (database, logs, caches)")
    args = parser.parse_args()
    if not Path(args.chromium).exists():
        print(f"screenshots: {args.chromium} is missing: `make browser` installs Debian's "
              "chromium (or pass --chromium)", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="kiln-screenshots-"))
    mark = new_mark()
    port = free_port()
    try:
        with serving(work, port, mark) as url:
            print(f"screenshots: kiln serve on {url}, data in {work}", flush=True)
            for number, example in enumerate(EXAMPLES):
                run_example(work, url, mark, example, "cache" if number < 2 else "cache-2")
            token = admin_token(work)
            settle(url, token)
            args.out.mkdir(parents=True, exist_ok=True)
            for path in shoot(url, token, args.entry_tag, args.out, args.chromium):
                print(f"screenshots: wrote {path}", flush=True)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"screenshots: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"screenshots: kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
