"""api/metrics.py in multiprocess mode: spawned processes stand for uvicorn's workers (uvicorn spawns
them too); a scrape answered by any of them sums every worker's counters, a dead worker's counts stay in
the sum and its gauges leave it, and a new API master begins from zero in a directory of its own."""
from __future__ import annotations

import multiprocessing

from api.metrics_dir import SUBDIR


def _serve(requests: int, cached: int) -> None:
    """A worker: serves `requests` requests on a route and holds `cached` answers, then exits."""
    from api import metrics
    for _ in range(requests):
        metrics.observe("/v1/unit-route", 200, 0.002)
    metrics.REPORTS_ACCEPTED.inc(requests)
    metrics.CACHE_ENTRIES.set(cached)


def _scrape(queue) -> None:
    from api import metrics

    class NoRedis:          # the Redis and job gauges are not what this test is about
        def info(self, *args, **kwargs):
            raise ConnectionError("no Redis here")

        def get(self, *args):
            raise ConnectionError("no Redis here")
    queue.put(metrics.render(NoRedis()))


def _value(text: str, prefix: str) -> float | None:
    found = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix + " ")]
    return found[0] if found else None


def _master(queue, workers: list[int]) -> None:
    """An API master: spawns its workers one after the other, then one more that answers a scrape."""
    ctx = multiprocessing.get_context("spawn")
    for requests in workers:
        proc = ctx.Process(target=_serve, args=(requests, 7))
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0
    inner = ctx.Queue()
    scraper = ctx.Process(target=_scrape, args=(inner,))
    scraper.start()
    queue.put(inner.get(timeout=60))
    scraper.join(60)


def _run_master(workers: list[int]) -> str:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    master = ctx.Process(target=_master, args=(queue, workers))
    master.start()
    text = queue.get(timeout=120)
    master.join(60)
    assert master.exitcode == 0
    return text


def test_a_scrape_sums_every_worker_and_a_new_master_starts_from_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("HERDFENCE_HOME", str(tmp_path))
    text = _run_master([30, 12])
    route = 'herdfence_http_requests_total{route="/v1/unit-route",status="200"}'
    assert _value(text, route) == 42, text                        # the workers are gone: their counts stay
    assert _value(text, "herdfence_http_request_seconds_count") == 42
    assert _value(text, 'herdfence_http_request_seconds_bucket{le="0.0025"}') == 42
    assert _value(text, "herdfence_reports_accepted_total") == 42
    assert "# TYPE herdfence_http_request_seconds histogram" in text
    assert "# TYPE herdfence_api_gc_full_seconds summary" in text
    assert _value(text, "herdfence_api_answer_cache_entries") == 0   # a dead worker's gauge leaves the sum
    first = sorted(p.name for p in (tmp_path / "run" / SUBDIR).iterdir())

    text = _run_master([5])
    assert _value(text, route) == 5                                  # a new master: a counter reset
    second = sorted(p.name for p in (tmp_path / "run" / SUBDIR).iterdir())
    assert len(second) == 1 and second != first                     # the old master's directory is gone
