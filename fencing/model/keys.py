"""The Redis Cluster key layout (documented in docs/architecture.md, "Redis key layout").

Two families of keys:
* group keys carry the H3 cell group (a res-GROUP_RES cell, hex) as hash tag, so one group's fences and
  device state live in one slot, on one node; the job's tasks are aligned with the nodes that hold their
  groups (Amoeba), and the elastic controller moves whole slots when it moves groups;
* farm keys carry the farm id as hash tag: the API's view of one tenant lives in one slot.
"""
from __future__ import annotations

import zlib

FENCE_RES = 9        # fences are covered by res-9 cells (~0.1 km²): interior cells need no polygon test
GROUP_RES = 6        # a cell group is a res-6 parent (~36 km²): the unit of routing and of Redis slots
POS_INDEX_RES = 7    # latest positions are indexed by res-7 cell for query-within

# --- group keys (fencing job) -------------------------------------------------------------------
def group_fences(group: str) -> str:
    """hash fence_uid -> fence record (farm, fence id, version, WKB, cells in this group, debounce)."""
    return f"{{g:{group}}}:fences"


def group_version(group: str) -> str:
    """int, bumped whenever a fence touching the group changes; task caches refresh by it."""
    return f"{{g:{group}}}:ver"


def group_state(group: str) -> str:
    """hash device key -> versioned device state (by batch id) for devices routed to this group."""
    return f"{{g:{group}}}:state"


LOCATION_BUCKETS = 256


def device_location(device_key: str) -> str:
    """hash device key → the group whose state hash holds the device's state (read only for devices new
    to their home group). Bucketed so that one batch reads and writes it with a few commands."""
    return f"dloc:{{{zlib.crc32(device_key.encode()) % LOCATION_BUCKETS}}}"


# --- global keys ---------------------------------------------------------------------------------
FARMS = "farms"                      # set of farm ids
FENCE_GROUPS = "fencegroups"         # set of cell groups that hold (or held) fences: workers preload them
DEVICE_REGISTRY = "devreg"          # hash device_id -> farm_id ("," joined when several farms use it)
ROUTING = "routing"                  # string JSON routing table {"version", "routes": {group: partition}}
# the job's own keys share the lease's slot ({job}): fenced against the lease's epoch itself
JOB_HEARTBEAT = "{job}:heartbeat"    # string JSON: the last batch (fencing.model.heartbeat)
JOB_HEARTBEAT_LOG = "{job}:heartbeat:log"   # list: the last heartbeats, newest first
JOB_PROGRESS = "{job}:progress"      # string JSON: the last batch's id, time and totals (for pollers)
JOB_LOG_GAPS = "{job}:log_gaps"      # hash "topic:partition:start" → JSON gap: log offsets no record held, skipped
JOB_BATCH = "{job}:batch"            # string JSON: the batch the job is running (id, start time, planned ends)
JOB_PING = "{{job}}:ping:{}"          # set when the job has read a control ping from gps.reports
APIKEY = "apikey:{}"                 # apikey:<sha256 hex> -> farm_id
DEVTOKEN = "devtoken:{}"             # devtoken:<sha256 hex> -> "farm_id\tdevice_id"
SINK_DONE = "{{job}}:sinkdone:{}"     # <batch_id> -> "1" once the batch's driver-side sinks ran


def apikey(key_hash: str) -> str:
    return APIKEY.format(key_hash)


def devtoken(token_hash: str) -> str:
    return DEVTOKEN.format(token_hash)


# --- farm keys (API + job sinks) -----------------------------------------------------------------
def farm(farm_id: str) -> str:
    return f"farm:{{{farm_id}}}"


def farm_fences(farm_id: str) -> str:
    """set of fence ids."""
    return f"fences:{{{farm_id}}}"


def fence(farm_id: str, fence_id: str) -> str:
    """string JSON: {"feature": GeoJSON Feature, "version": int, "groups": [group, ...]}."""
    return f"fence:{{{farm_id}}}:{fence_id}"


def farm_devices(farm_id: str) -> str:
    """hash device_id -> JSON {"herd", "token_hash", "created"}."""
    return f"devices:{{{farm_id}}}"


def positions(farm_id: str) -> str:
    """hash device_id -> JSON latest position {"lat","lon","ts","battery","rx","fences"}."""
    return f"pos:{{{farm_id}}}"


def last_seen(farm_id: str) -> str:
    """sorted set device_id scored by its latest report time (ms): the silent scanner's index.
    Devices it has flagged are removed until they report again."""
    return f"lastseen:{{{farm_id}}}"


def position_cell(farm_id: str, cell: str) -> str:
    """set of device ids whose latest position is in this res-POS_INDEX_RES cell."""
    return f"poscell:{{{farm_id}}}:{cell}"


def members(farm_id: str, fence_id: str) -> str:
    """hash device_id -> inside_since (ISO) for devices confirmed inside the fence."""
    return f"members:{{{farm_id}}}:{fence_id}"


def events(farm_id: str) -> str:
    """sorted set event_id scored by event time (ms): the farm's retained events, newest last."""
    return f"events:{{{farm_id}}}"


def event_data(farm_id: str) -> str:
    """hash event_id -> event JSON."""
    return f"evdata:{{{farm_id}}}"


def fence_events(farm_id: str, fence_id: str) -> str:
    """sorted set event_id scored like `events`: the farm's retained events of one fence (an index,
    fencing.model.event_index)."""
    return f"evfence:{{{farm_id}}}:{fence_id}"


def device_events(farm_id: str, device_id: str) -> str:
    """sorted set event_id scored like `events`: the farm's retained events of one device (an index)."""
    return f"evdev:{{{farm_id}}}:{device_id}"


def events_indexed(farm_id: str) -> str:
    """string, present once every event of the farm's log is in its fence and device indexes."""
    return f"evindexed:{{{farm_id}}}"


def event_stream(farm_id: str) -> str:
    """Redis stream of the farm's events in the order they were first written (SSE reads it)."""
    return f"evstream:{{{farm_id}}}"


def fence_windows(farm_id: str) -> str:
    """hash fence_id -> "from,to" (epoch ms, empty = open) for the farm's fences that have an active
    window: member listings answer nothing outside it (by wall clock)."""
    return f"windows:{{{farm_id}}}"


def rate_bucket(farm_id: str, bucket: str, subject: str = "") -> str:
    """string: a request-rate bucket's theoretical arrival time (µs on Redis's clock; api/rate_limits.py),
    expiring once the bucket is full again. bucket names the limit; subject: the device id, if any."""
    return f"rate:{{{farm_id}}}:{bucket}:{subject}"
