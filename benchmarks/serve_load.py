"""Load on `qkv serve`: many concurrent clients against the same clients sent one at a time.

    .venv/bin/python benchmarks/serve_load.py [--model runs/demo] [--clients 32] [--seconds 60]

Starts `qkv serve` on the run (default: the demo translator of `make demo`) on a free port,
then, each for --seconds, sends one-sentence translation requests (1) from one client, one
after another, and (2) from --clients clients at once; the service batches the concurrent ones
(--batch-wait-ms). Records errors, p50 and p99 latency and sentences/s of both phases and
their ratio in benchmarks/results/serve.json; passes with zero errors and a ratio of at least
--min-speedup. Then stops the service with SIGTERM while requests are in flight, and records
that they were all answered and that it exited cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import RESULTS, machine, write_report  # noqa: E402
from qkv.synthetic import make_splits  # noqa: E402


def start_service(
    model: str, batch_wait_ms: float, threads: int | None
) -> tuple[subprocess.Popen, str]:
    """`qkv serve --model demo=MODEL --port 0`; returns the process and its base URL."""
    command = [sys.executable, "-m", "qkv", "serve", "--model", f"demo={model}", "--port", "0"]
    command += ["--batch-wait-ms", str(batch_wait_ms), "--device", "cpu"]
    if threads:
        command += ["--threads", str(threads)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if not line.startswith("qkv serve: http"):
        process.kill()
        raise SystemExit(f"qkv serve did not start: {line!r}")
    # Read the rest of its output (one access-log line per request) as it comes: a pipe
    # nobody reads fills up and blocks the service mid-request.
    threading.Thread(target=process.stdout.read, daemon=True).start()
    return process, line.split()[2].rstrip("/")


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile of ``values`` (nan when there are none)."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def client_loop(
    client: httpx.AsyncClient, sentences: list[str], start: int, stop_at: float, record: dict
) -> None:
    """One client: a request, its answer, the next request, until ``stop_at``."""
    i = start
    while time.monotonic() < stop_at:
        sentence = sentences[i % len(sentences)]
        i += 1
        began = time.monotonic()
        try:
            answer = await client.post("/v1/translate", json={"sentences": [sentence]})
            ok = answer.status_code == 200 and len(answer.json()["translations"]) == 1
        except httpx.HTTPError:
            ok = False
        record["latencies"].append(time.monotonic() - began)
        record["errors"] += not ok


async def phase(url: str, clients: int, seconds: float, sentences: list[str]) -> dict[str, Any]:
    """``clients`` clients sending requests for ``seconds``: latency, throughput, errors."""
    record: dict[str, Any] = {"latencies": [], "errors": 0}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        began = time.monotonic()
        stop_at = began + seconds
        await asyncio.gather(
            *(client_loop(client, sentences, k * 97, stop_at, record) for k in range(clients))
        )
        elapsed = time.monotonic() - began
    latencies = record["latencies"]
    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        "requests": len(latencies),
        "errors": record["errors"],
        "sentences_per_s": round(len(latencies) / elapsed, 2),
        "p50_ms": round(1000 * percentile(latencies, 50), 1),
        "p99_ms": round(1000 * percentile(latencies, 99), 1),
    }


async def stop_under_load(process: subprocess.Popen, url: str, sentences: list[str]) -> dict:
    """SIGTERM while requests are in flight: are they all answered, and does it exit 0?"""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        posts = [client.post("/v1/translate", json={"sentences": [s]}) for s in sentences[:16]]
        tasks = [asyncio.ensure_future(p) for p in posts]
        await asyncio.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*tasks, return_exceptions=True)
    answered = sum(not isinstance(a, BaseException) and a.status_code == 200 for a in answers)
    code = await asyncio.to_thread(process.wait, 60)
    return {"in_flight": len(answers), "answered": answered, "exit_status": code}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/demo", help="translation run folder to serve")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of each phase")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0, help="the service's gathering")
    parser.add_argument("--threads", type=int, help="the service's CPU threads")
    parser.add_argument("--min-speedup", type=float, default=3.0, help="the ratio that passes")
    parser.add_argument("--result", default=str(RESULTS / "serve.json"), help="results JSON")
    args = parser.parse_args()
    if not Path(args.model).is_dir():
        raise SystemExit(f"{args.model}: no run folder; `make demo` trains runs/demo")
    sentences = [s for s, _ in make_splits(1, 1, 2000, seed=11)["test"]]
    process, url = start_service(args.model, args.batch_wait_ms, args.threads)
    try:
        asyncio.run(phase(url, 1, min(2.0, args.seconds), sentences))  # warm-up
        print(f"one client, one request at a time, for {args.seconds:.0f} s")
        serial = asyncio.run(phase(url, 1, args.seconds, sentences))
        print(f"{args.clients} concurrent clients for {args.seconds:.0f} s")
        concurrent = asyncio.run(phase(url, args.clients, args.seconds, sentences))
        # after the load, the service may still be finishing the last requests
        batching = httpx.get(url + "/health", timeout=60).json()["batching"]["demo"]
        shutdown = asyncio.run(stop_under_load(process, url, sentences))
    finally:
        if process.poll() is None:
            process.kill()
    speedup = concurrent["sentences_per_s"] / max(serial["sentences_per_s"], 1e-9)
    passed = (
        concurrent["errors"] == 0
        and serial["errors"] == 0
        and speedup >= args.min_speedup
        and shutdown["answered"] == shutdown["in_flight"]
        and shutdown["exit_status"] == 0
    )
    report = {
        "benchmark": "serve_load",
        "settings": {k: v for k, v in vars(args).items()},
        "machine": machine(),
        "one_at_a_time": serial,
        "concurrent": concurrent,
        "speedup": round(speedup, 2),
        "batching": batching,
        "graceful_shutdown": shutdown,
        "passed": passed,
        "environment": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
    }
    write_report(Path(args.result), report)
    print(
        f"{concurrent['sentences_per_s']} sentences/s with {args.clients} clients "
        f"(p50 {concurrent['p50_ms']} ms, p99 {concurrent['p99_ms']} ms) against "
        f"{serial['sentences_per_s']} one at a time: {speedup:.1f}x; "
        f"{concurrent['errors']} errors; {'passed' if passed else 'FAILED'}"
    )
    if not passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
