"""What the API's workers (HERDFENCE_API_WORKERS, 2 on the test stack) share: /metrics counts every
worker's requests whichever worker answers the scrape, and a device's rate limit holds across them.
Requests go out on fresh connections, so both workers serve them; each worker's own share is read from
its metrics file to show that both did."""
from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.conftest import wait_for
from tests.farmkit import Farm

DEVICE_ROUTE = "/v1/devices/{device_id}"
REPORTS_ROUTE = "/v1/reports"


def _metric(text: str, sample: str) -> float:
    """One sample's value; 0 when the series has not appeared yet."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _requests_sample(route: str, status: int) -> str:
    return f'herdfence_http_requests_total{{route="{route}",status="{status}"}}'


def _per_worker(stack, route: str) -> Counter:
    """Requests on `route` (any status) per API worker pid, from the workers' own metrics files."""
    from prometheus_client.mmap_dict import MmapedDict
    counts: Counter = Counter()
    for path in (stack.settings.run_dir / "api-metrics").glob("*/counter_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        for key, value, *_ in MmapedDict.read_all_values_from_file(str(path)):
            _metric_name, name, labels, _help = json.loads(key)
            if name == "herdfence_http_requests_total" and labels.get("route") == route:
                counts[pid] += int(value)
    return counts


def test_metrics_sum_every_worker_and_only_grow_under_load(stack):
    farm = Farm(stack, "metrics workers farm")
    sample = _requests_sample(DEVICE_ROUTE, 404)
    scrape_url = f"{stack.api_url}/metrics"
    before_text = httpx.get(scrape_url, timeout=30).text
    before, workers_before = _metric(before_text, sample), _per_worker(stack, DEVICE_ROUTE)
    requests, scrapes = 200, 20
    done = 0
    progress = threading.Condition()

    def ask(i: int) -> int:
        nonlocal done
        with httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {farm.key}"},
                          timeout=30) as fresh:               # a new connection: either worker may take it
            status = fresh.get(f"/v1/devices/no-such-collar-{i}").status_code
        with progress:
            done += 1
            progress.notify_all()
        return status

    seen: list[float] = []
    histogram_counts: list[float] = []

    def scrape_along() -> None:
        for n in range(scrapes):
            with progress:          # spread the scrapes over the run: one per 10 requests answered
                progress.wait_for(lambda: done >= n * requests // scrapes, timeout=120)
            text = httpx.get(scrape_url, timeout=30).text      # a new connection each time, too
            seen.append(_metric(text, sample))
            histogram_counts.append(_metric(text, "herdfence_http_request_seconds_count"))

    scraper = threading.Thread(target=scrape_along)
    scraper.start()
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(ask, range(requests)))
    scraper.join(180)
    assert statuses == [404] * requests
    assert len(seen) == scrapes
    assert seen == sorted(seen), f"a counter went down between scrapes: {seen}"
    assert histogram_counts == sorted(histogram_counts), histogram_counts
    assert all(before <= v <= before + requests for v in seen), (before, seen)
    # a worker counts a request once its answer is sent: the last few may land a moment after
    wait_for(lambda: _metric(httpx.get(scrape_url, timeout=30).text, sample) >= before + requests,
             timeout=10, what="every request counted")
    assert _metric(httpx.get(scrape_url, timeout=30).text, sample) == before + requests
    served = _per_worker(stack, DEVICE_ROUTE) - workers_before
    assert len(served) >= 2 and sum(served.values()) == requests, f"requests per worker: {dict(served)}"


def _burst(stack, farm: Farm, device_id: str, requests: int) -> tuple[list[tuple[int, str | None]], float]:
    """`requests` report posts for a new device at once, over 8 connections opened beforehand (so the
    burst is not spent on connecting); the answers and how long they took."""
    token = farm.device(device_id)
    clients = [stack.client(token) for _ in range(8)]
    try:
        for client in clients:
            assert client.get("/healthz").status_code == 200          # connected before the clock starts

        def post(i: int) -> tuple[int, str | None]:
            resp = clients[i % len(clients)].post("/v1/reports", json={"reports": []})
            return resp.status_code, resp.headers.get("retry-after")
        started = time.monotonic()
        with ThreadPoolExecutor(len(clients)) as pool:
            answers = list(pool.map(post, range(requests)))
        return answers, time.monotonic() - started
    finally:
        for client in clients:
            client.close()


def test_a_device_rate_limit_holds_across_workers(stack):
    """HERDFENCE_RATE_DEVICE=10 on the test stack: a burst of 20, then 10 per second, for the device
    whichever worker serves it (a bucket per worker would admit up to 40 in the same time)."""
    farm = Farm(stack, "shared limit farm")
    rate, burst = float(stack.env["HERDFENCE_RATE_DEVICE"]), 2 * float(stack.env["HERDFENCE_RATE_DEVICE"])
    for attempt in range(3):
        workers_before = _per_worker(stack, REPORTS_ROUTE)
        answers, elapsed = _burst(stack, farm, f"limited-cow-{attempt}", 80)
        accepted = sum(status == 202 for status, _ in answers)
        assert {status for status, _ in answers} <= {202, 429}, answers
        assert all(retry and int(retry) >= 1 for status, retry in answers if status == 429)
        # the burst, and what the rate refilled while the requests ran
        assert burst <= accepted <= burst + int(rate * elapsed) + 1, (accepted, elapsed)
        served = wait_for(lambda: (lambda s: s if sum(s.values()) >= len(answers) else None)(
            _per_worker(stack, REPORTS_ROUTE) - workers_before), timeout=10, what="both workers' counts")
        # conclusive when both workers served and the refill left the bound under two bursts
        if len(served) >= 2 and burst + int(rate * elapsed) + 1 < 2 * burst:
            return
    raise AssertionError(f"no conclusive burst in 3 attempts (last: {elapsed:.2f} s, per worker {dict(served)})")
