"""The job's stage contracts: what one process task reports about its share of a micro-batch
(`PartitionStats`), what a reader task reports (`ReaderTiming`) and the heartbeat the driver writes
after every batch (`Heartbeat`, key `{job}:heartbeat`, the last 5,000 in `{job}:heartbeat:log`; both
without the per-group loads, `Heartbeat.stored`).

Writers: fencing.stream (process tasks, the elastic wrapper, the driver). Readers: the elastic
controller, /metrics, `status`, the benchmarks and the chaos tests. They all go through these
classes, so a field is named and typed in one place. `from_json` ignores fields it does not know
and fills defaults for missing ones: a beat written by an older or newer job still reads."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import orjson

from fencing.model import keys
from fencing.model.node_pipe import NodePipeline

HEARTBEAT_LOG_MAX = 5_000


def _known(cls, data: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class PartitionStats:
    """One routed partition's share of a micro-batch (one per routed partition; a process task serves one
    or several: fencing.stream.stages)."""
    partition: int
    points: int = 0
    devices: int = 0
    events: int = 0
    seconds: float = 0.0                  # the whole task, from its first input row to its output
    redis_local: int = 0                  # pipelined Redis commands sent to the task's own node
    redis_cross: int = 0                  # ... and to other nodes (the Amoeba figure)
    fences_cached: int = 0
    worker_pid: int = 0                   # the Python worker that ran it (which pool a stage meets)
    groups: dict[str, float] = field(default_factory=dict)         # points per cell group
    stage_s: dict[str, float] = field(default_factory=dict)        # seconds per step of the task
    stage_cpu_s: dict[str, float] = field(default_factory=dict)    # ... of its thread's CPU (the rest: waiting)
    # the loads the elastic controller plans by, and its reconfiguration steps (fencing.stream.process)
    route_groups: dict[str, float] = field(default_factory=dict)   # points per group as routed
    children: dict[str, dict[str, float]] = field(default_factory=dict)   # per split group: per child
    reload_s: float = 0.0                 # reloading the fences of groups moved to this task
    shed: int = 0                         # reports shed (dropped, counted) under overload

    def to_json(self) -> str:
        # orjson writes a dataclass itself: dataclasses.asdict deep-copies `groups` and `children` first
        # (at 100k fences ~40x slower, in every task's stats row and the driver's heartbeat)
        return orjson.dumps(self).decode()

    @classmethod
    def from_json(cls, raw: str | bytes | dict) -> "PartitionStats":
        data = orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
        return cls(**_known(cls, data))


@dataclass
class ReaderTiming:
    """One reader task (fencing.stream.prepare): records read, seconds reading and preparing."""
    records: int = 0
    read_s: float = 0.0
    prepare_s: float = 0.0
    gaps: list[dict] = field(default_factory=list)    # log gaps skipped (ingest.kafka_types.LogGap)

    def to_json(self) -> str:
        return orjson.dumps(self).decode()

    @classmethod
    def from_json(cls, raw: str | bytes | dict) -> "ReaderTiming":
        data = orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
        return cls(**_known(cls, data))


@dataclass
class Heartbeat:
    """The driver's record of one micro-batch, with running totals since the job started."""
    batch_id: int
    time: float                           # epoch seconds when the batch finished
    duration_s: float = 0.0
    points: int = 0
    events: int = 0
    dead_letters: int = 0
    routing_version: int = 0
    partitions: list[PartitionStats] = field(default_factory=list)
    events_total: int = 0
    dead_letters_total: int = 0
    points_total: int = 0
    redis_local_total: int = 0
    redis_cross_total: int = 0
    shed: int = 0
    shed_total: int = 0
    lag: int = 0                          # records in Kafka not yet processed (one batch late)
    previous_trigger_ms: dict[str, float] = field(default_factory=dict)   # Spark's breakdown
    spark_s: float = 0.0                  # the batch's Spark part (readers, shuffle, process tasks)
    sinks_s: float = 0.0                  # the driver's sinks after it
    readers: list[ReaderTiming] = field(default_factory=list)
    epoch: int = 0                        # the lease epoch the batch was written under
    holder: str = ""                      # the job process that wrote it (host:pid)
    active_since: float = 0.0             # when that process took the lease (epoch seconds)
    lease_gap_ms: float = 0.0             # the longest time between two lease renewals since the last beat
    log_gaps: list[dict] = field(default_factory=list)   # gaps in gps.reports the batch's readers skipped

    @property
    def handled_total(self) -> int:
        """Reports the job is done with: processed or shed (what a benchmark waits for)."""
        return self.points_total + self.shed_total

    def to_json(self) -> bytes:
        return orjson.dumps(self)       # the same JSON as asdict's, without its deep copy (~0.5 s at 2 MB)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: str | bytes | dict) -> "Heartbeat":
        data = dict(orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw)
        data["partitions"] = [PartitionStats.from_json(p) for p in data.get("partitions") or []]
        data["readers"] = [ReaderTiming.from_json(r) for r in data.get("readers") or []]
        data.setdefault("batch_id", -1)
        data.setdefault("time", 0.0)
        return cls(**_known(cls, data))

    def progress(self) -> "Progress":
        return Progress(self.batch_id, self.time, self.points_total, self.shed_total)

    def stored(self) -> "Heartbeat":
        """The beat as Redis keeps it: its partitions without their per-group loads (`groups`,
        `route_groups`, `children`), which only the elastic controller reads, in the driver, from the
        beat itself. With them a beat is ~320 KB at 100k fences, and the log of 5,000 would hold
        ~1.6 GB of one Redis master (and its AOF); without them ~3 KB."""
        slim = [dataclasses.replace(p, groups={}, route_groups={}, children={}) for p in self.partitions]
        return dataclasses.replace(self, partitions=slim)

    def write(self, redis) -> None:
        """Write it (`stored`); the active job writes with its epoch's client (fencing.model.job_user)."""
        raw = self.stored().to_json()
        pipe = NodePipeline(redis)
        pipe.command(keys.JOB_HEARTBEAT, "SET", keys.JOB_HEARTBEAT, raw)
        pipe.command(keys.JOB_PROGRESS, "SET", keys.JOB_PROGRESS, orjson.dumps(self.progress()))
        # recent beats (the elastic scenario reads them)
        pipe.command(keys.JOB_HEARTBEAT_LOG, "LPUSH", keys.JOB_HEARTBEAT_LOG, raw)
        pipe.command(keys.JOB_HEARTBEAT_LOG, "LTRIM", keys.JOB_HEARTBEAT_LOG, 0, HEARTBEAT_LOG_MAX - 1)
        for gap in self.log_gaps:       # keyed by where it starts: a replayed batch records it once
            field_ = f"{gap['topic']}:{gap['partition']}:{gap['start']}"
            pipe.command(keys.JOB_LOG_GAPS, "HSET", keys.JOB_LOG_GAPS, field_,
                         orjson.dumps({**gap, "batch_id": self.batch_id, "time": self.time}))
        pipe.execute()


@dataclass
class Progress:
    """What a poller needs of the last batch: the beat is ~400 KB at 100k fences (per-group counts of
    every partition, for the elastic controller), and a bench that parsed it ten times a second spent
    ~5 ms a time of the CPU it measures; this is ~100 bytes."""
    batch_id: int
    time: float
    points_total: int = 0
    shed_total: int = 0

    @property
    def handled_total(self) -> int:
        return self.points_total + self.shed_total


def read_progress(redis) -> Progress | None:
    """The last batch's progress record (from its heartbeat when the job wrote none: an older job)."""
    raw = redis.get(keys.JOB_PROGRESS)
    if raw:
        return Progress(**_known(Progress, orjson.loads(raw)))
    beat = read_heartbeat(redis)
    return beat.progress() if beat is not None else None


def read_log_gaps(redis) -> list[dict]:
    """Every gap in the job's input log that a reader skipped ({topic, partition, start, end, batch_id,
    time}), oldest first."""
    gaps = [orjson.loads(v) for v in (redis.hgetall(keys.JOB_LOG_GAPS) or {}).values()]
    return sorted(gaps, key=lambda g: (g.get("time", 0), g["partition"], g["start"]))


@dataclass
class RunningBatch:
    """The batch the job is working on: what `up` names while it waits for the job."""
    batch_id: int
    started: float
    planned_ends: dict[str, int] = field(default_factory=dict)   # gps.reports partition → end offset

    def write(self, redis) -> None:
        pipe = NodePipeline(redis)
        pipe.command(keys.JOB_BATCH, "SET", keys.JOB_BATCH, orjson.dumps(self))
        pipe.execute()


def read_running_batch(redis) -> RunningBatch | None:
    raw = redis.get(keys.JOB_BATCH)
    return RunningBatch(**_known(RunningBatch, orjson.loads(raw))) if raw else None


def read_heartbeat(redis) -> Heartbeat | None:
    """The last batch's heartbeat, None when the job has not finished a batch."""
    raw = redis.get(keys.JOB_HEARTBEAT)
    return Heartbeat.from_json(raw) if raw else None


def recent_heartbeats(redis, n: int = HEARTBEAT_LOG_MAX) -> list[Heartbeat]:
    """The last `n` heartbeats, oldest first."""
    return [Heartbeat.from_json(r) for r in reversed(redis.lrange(keys.JOB_HEARTBEAT_LOG, 0, n - 1))]
