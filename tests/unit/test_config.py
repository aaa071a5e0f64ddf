"""One configuration (fencing/config.py): one on/off parser, numbers and sizes checked at start with
errors that name the variable, and no other module of the core reading the environment."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from fencing.config import DeployError, flag, load_settings, load_tuning

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("YES", True), ("on", True),
                                            ("0", False), ("False", False), ("no", False), ("OFF", False),
                                            ("", True), (None, True)])
def test_one_parser_for_on_and_off(value, expected):
    env = {} if value is None else {"HERDFENCE_ELASTIC": value}
    assert flag(env, "HERDFENCE_ELASTIC", True) is expected
    assert load_tuning(env).elastic is expected


@pytest.mark.parametrize("env,names", [
    ({"HERDFENCE_ELASTIC": "maybe"}, "HERDFENCE_ELASTIC"),
    ({"HERDFENCE_FENCE_PRELOAD": "2"}, "HERDFENCE_FENCE_PRELOAD"),
    ({"HERDFENCE_MAX_OFFSETS_PER_TRIGGER": "lots"}, "HERDFENCE_MAX_OFFSETS_PER_TRIGGER"),
    ({"HERDFENCE_SILENT_SECONDS": "-5"}, "HERDFENCE_SILENT_SECONDS"),
    ({"HERDFENCE_RATE_DEVICE": "nan"}, "HERDFENCE_RATE_DEVICE"),
])
def test_malformed_tuning_is_a_clear_error(env, names):
    with pytest.raises(DeployError, match=names):
        load_tuning(env)


@pytest.mark.parametrize("env,names", [
    ({"HERDFENCE_BROKER_STORAGE": "tape"}, "HERDFENCE_BROKER_STORAGE"),
    ({"HERDFENCE_REDIS_MAXMEMORY": "lots"}, "HERDFENCE_REDIS_MAXMEMORY"),
    ({"HERDFENCE_WEBHOOK_ALLOW_PRIVATE": "perhaps"}, "HERDFENCE_WEBHOOK_ALLOW_PRIVATE"),
    ({"HERDFENCE_STREAMS_PER_FARM": "0"}, "HERDFENCE_STREAMS_PER_FARM"),
])
def test_malformed_settings_are_a_clear_error(env, names):
    with pytest.raises(DeployError, match=names):
        load_settings(env)


def test_defaults():
    s, t = load_settings({}), load_tuning({})
    assert (s.broker_durable, s.redis_maxmemory, s.webhook_allow_private) == (True, "4gb", False)
    assert (t.trigger, t.max_offsets_per_trigger, t.elastic, t.keep_warm_s) == ("250 milliseconds", 1_000_000, True, 20.0)


def test_only_the_configuration_reads_the_environment():
    readers = []
    for pkg in ("fencing", "ingest", "api"):
        for path in (ROOT / pkg).rglob("*.py"):
            if "node_modules" in path.parts or path == ROOT / "fencing" / "config.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"os\.environ(\.get|\[)\s*\(?[\"']HERDFENCE_|getenv\([\"']HERDFENCE_", line):
                    readers.append(f"{path.relative_to(ROOT)}:{n}")
    assert readers == []
