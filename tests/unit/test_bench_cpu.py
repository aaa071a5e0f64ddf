"""The bench's CPU split (loadgen.bench_cpu): core-seconds per role over the measured window, from
the snapshots nearest its ends; a process that started inside the window counts from zero, one that
is in no role is `other`."""
import subprocess
import sys
import time

from loadgen.bench_cpu import TICK_S, CpuSampler, Snapshot, cpu_window


def test_core_seconds_per_role_between_the_snapshots_nearest_the_window():
    ticks = round(1 / TICK_S)            # clock ticks per second
    snaps = [Snapshot(100.0, {1: 0, 2: 5 * ticks}, 0, 0),
             Snapshot(101.0, {1: 1 * ticks, 2: 6 * ticks}, 100, 200),
             Snapshot(105.0, {1: 3 * ticks, 2: 9 * ticks, 3: 2 * ticks, 4: 1 * ticks}, 500, 1000),
             Snapshot(109.0, {1: 9 * ticks, 2: 9 * ticks, 3: 9 * ticks, 4: 9 * ticks}, 900, 1800)]
    out = cpu_window(snaps, {1: "workers", 2: "redis", 3: "workers"}, start=100.9, end=105.2)
    assert out["window_s"] == 4.0
    assert out["core_seconds"]["workers"] == 2.0 + 2.0        # pid 3 started inside: from 0
    assert out["core_seconds"]["redis"] == 3.0
    assert out["core_seconds"]["other"] == 1.0                # pid 4: in no role
    assert out["busy_cores"] == round((500 - 100) / (1000 - 200) * out["cores"], 2)
    assert cpu_window(snaps[:1], {}, 100.0, 101.0) == {}


def test_a_busy_process_is_counted_in_its_role():
    sampler = CpuSampler(settings=None)
    before = sampler.snapshot()
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                                                   "while time.process_time() - t < 5: pass"])
    try:
        # until the spinner has had 0.4 s of CPU by /proc (a loaded machine gives it less per second)
        deadline = time.monotonic() + 30
        while True:
            time.sleep(0.2)
            after = sampler.snapshot()
            out = cpu_window([before, after], {spin.pid: "workers"}, before.time, after.time)
            if out["core_seconds"]["workers"] >= 0.4 or time.monotonic() > deadline:
                break
        assert out["core_seconds"]["workers"] >= 0.4
        assert out["busy_cores"] > 0
    finally:
        spin.kill()
        spin.wait()
