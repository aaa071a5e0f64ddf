"""One configuration (fencing/config.py, the typed model in fencing/settings_model.py): one on/off
parser, every setting with a default, a description and bounds, one error format naming the variable
and what it accepts (exit 2 for every command), `herdfence config` and docs/configuration.md generated
from the model, and no other module of the core reading the environment."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest
from pydantic_core import PydanticUndefined

from fencing import config_docs
from fencing.config import (ConfigError, DeployError, Settings, flag, load_settings, load_tuning, read_env,
                            spark_cluster_conf)
from fencing.settings_model import FLAG_ACCEPTS, HerdfenceEnv, accepts, var

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
    assert (t.trigger, t.max_offsets_per_trigger, t.elastic, t.keep_warm_seconds) == ("250 milliseconds", 1_000_000, True, 20.0)


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


# --- the typed model (fencing/settings_model.py), its one error format, `herdfence config` -----------
HERDFENCE = str(Path(sys.executable).parent / "herdfence")
FIELDS = HerdfenceEnv.model_fields
# Settings that take any text (a path, JVM options): nothing to refuse.
FREE_TEXT = {"home", "jvm_options", "executor_python", "pyfiles"}


def _kind(field):
    """The field's base type and bounds: (int | float | bool | Literal | str, {"ge"/"gt"/"le": n})."""
    annotation = field.annotation
    args = [a for a in get_args(annotation) if a is not type(None)] if get_origin(annotation) is not Literal else []
    inner = args[0] if len(args) == 1 else annotation
    metadata = [*field.metadata, *getattr(inner, "__metadata__", ())]
    base = inner if get_origin(inner) is Literal else getattr(inner, "__origin__", inner)
    bounds = {k: getattr(m, k) for m in metadata for k in ("ge", "gt", "le") if hasattr(m, k)}
    return base, bounds


def _bad_values(name):
    """Values the setting must refuse, from its type and bounds."""
    base, bounds = _kind(FIELDS[name])
    if get_origin(base) is Literal:
        return ["tape", "1"]
    if base is bool:
        return ["maybe", "2"]
    if base in (int, float):
        out = ["abc", "nan" if base is float else "1.5", "1e400" if base is float else "12abc"]
        if "ge" in bounds:
            out.append(str(bounds["ge"] - 1))
        if "gt" in bounds:
            out.append(str(bounds["gt"]))
        if "le" in bounds:
            out.append(str(bounds["le"] + 1))
        return out
    return {"kafka": ["kafka-without-port", "h:99999", "a:1,b"], "redis": ["redis", "h:0"],
            "spark_master": ["spark:/127.0.0.1", "mesos://h:5050", "local[0]"],
            "redis_save": ["3600", "every hour"], "redis_maxmemory": ["lots", "4 gb"],
            "trigger": ["fast", "250", "250 fortnights"], "driver_host": ["a host"], "driver_bind": ["a b"],
            "driver_memory": ["2x", "0g"], "executor_memory": ["lots"],
            "shuffle_tracking_timeout": ["120", "0s"], "backlog_timeout": ["soon"],
            "executor_idle_timeout": ["-1s"]}[name]


@pytest.mark.parametrize("name", list(FIELDS))
def test_every_setting_has_a_default_a_description_and_what_it_accepts(name):
    field = FIELDS[name]
    assert field.default is not PydanticUndefined
    assert len(field.description or "") > 10 and accepts(field) not in ("", "text")
    if field.default is None:         # an unset optional setting says what it means
        assert field.json_schema_extra["unset"]


@pytest.mark.parametrize("name,value", [(n, v) for n in FIELDS if n not in FREE_TEXT for v in _bad_values(n)])
def test_a_bad_value_is_an_error_naming_the_variable_and_what_it_accepts(name, value):
    with pytest.raises(ConfigError) as e:
        read_env({var(name): value, "HERDFENCE_HOME": "/tmp/elsewhere"})
    assert e.value.problems == [f"{var(name)}={value!r} is not valid: {accepts(FIELDS[name])}"]


@pytest.mark.parametrize("name", [n for n in FIELDS if _kind(FIELDS[n])[0] in (int, float)])
def test_numbers_at_their_bounds_are_accepted(name):
    base, bounds = _kind(FIELDS[name])
    lowest = bounds.get("ge", bounds.get("gt", 0) + (1 if base is int else 0.5))
    for value in (lowest, bounds.get("le", lowest)):
        assert getattr(read_env({var(name): f" {value} "}), name) == value


def test_every_bad_variable_is_named_at_once():
    with pytest.raises(ConfigError) as e:
        load_settings({"HERDFENCE_API_PORT": "abc", "HERDFENCE_ELASTIC": "maybe", "HERDFENCE_TRIGGER": "2"})
    assert [p.split("=")[0] for p in e.value.problems] == ["HERDFENCE_API_PORT", "HERDFENCE_TRIGGER",
                                                           "HERDFENCE_ELASTIC"]      # the model's order
    assert f"HERDFENCE_ELASTIC='maybe' is not valid: {FLAG_ACCEPTS}" in e.value.problems


def test_empty_is_unset_except_where_empty_means_something():
    m = read_env({"HERDFENCE_API_PORT": "", "HERDFENCE_KAFKA": " ", "HERDFENCE_REDIS_SAVE": "",
                  "HERDFENCE_JVM_OPTIONS": ""})
    assert (m.api_port, m.kafka, m.redis_save, m.jvm_options) == (8000, None, "", "")
    m = read_env({"HERDFENCE_BROKER_STORAGE": " Memory ", "HERDFENCE_REDIS_SAVE": " 900  1 300 10 "})
    assert (m.broker_storage, m.redis_save) == ("memory", "900 1 300 10")
    assert load_settings({"HERDFENCE_BROKER_STORAGE": "memory"}).broker_durable is False


def test_the_settings_dataclass_defaults_are_the_models():
    assert load_tuning({}) is read_env({})          # the knobs are the model itself
    s = load_settings({})
    for name, value in vars(Settings(home=s.home, kafka=None, redis=None, spark_master=None, api_port=8000)).items():
        assert getattr(s, name) == value, name


def test_cluster_conf_from_the_model():
    conf = spark_cluster_conf({"HERDFENCE_MIN_EXECUTORS": "3", "HERDFENCE_MAX_EXECUTORS": "2",
                               "HERDFENCE_DRIVER_PORT": "7079", "HERDFENCE_EXECUTOR_CORES": "2"})
    assert (conf["spark.dynamicAllocation.maxExecutors"], conf["spark.dynamicAllocation.initialExecutors"]) == ("3", "3")
    assert (conf["spark.driver.port"], conf["spark.executor.cores"]) == ("7079", "2")
    assert "spark.dynamicAllocation.enabled" not in spark_cluster_conf({"HERDFENCE_DYNAMIC_ALLOCATION": "off"})


def test_the_deployment_manifests_values_are_accepted():
    """Every HERDFENCE_* value the compose file, the Kubernetes config and the Dockerfile set."""
    found = {}
    for path in [*(ROOT / "deploy").rglob("*.yaml"), *(ROOT / "deploy").rglob("*.yml"), ROOT / "deploy/docker/Dockerfile"]:
        for name, quoted, bare in re.findall(r"(HERDFENCE_[A-Z_]+)(?::\s*|=)(?:\"([^\"]*)\"|([^\s\\\\]+))",
                                             path.read_text()):
            value = quoted or bare
            if name in {var(n) for n in FIELDS} and "$" not in value:
                found.setdefault(name, set()).add(value)
    assert {"HERDFENCE_KAFKA", "HERDFENCE_SPARK_MASTER", "HERDFENCE_DRIVER_PORT"} <= set(found)
    for name, values in found.items():
        for value in values:
            read_env({name: value})


def test_the_committed_reference_is_generated_from_the_model():
    """docs/configuration.md is `herdfence config --markdown docs/configuration.md`'s output: after
    changing a setting, run that and commit both."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert text == config_docs.render_markdown()
    for name in FIELDS:
        assert f"| `{var(name)}` |" in text


@pytest.mark.parametrize("name,value,shown", [
    ("HERDFENCE_API_TOKEN", "s3cr3t", "***"), ("HERDFENCE_DB_PASSWORD", "pw", "***"),
    ("HERDFENCE_SIGNING_KEY", "k", "***"), ("HERDFENCE_WEBHOOK_SECRET", "x", "***"),
    ("HERDFENCE_SINK", "https://bob:hunter2@example.org/x", "https://bob:***@example.org/x"),
    ("HERDFENCE_SINK", "redis://:hunter2@h:6379", "redis://:***@h:6379"),
    ("HERDFENCE_SINK", "https://tok3n@example.org", "https://***@example.org"),
    ("HERDFENCE_SPARK_MASTER", "spark://h:7077", "spark://h:7077"), ("HERDFENCE_API_PORT", "8000", "8000")])
def test_mask(name, value, shown):
    assert config_docs.mask(name, value) == shown


def _herdfence(*args, **env_vars):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDFENCE_")}
    env.update(env_vars)
    return subprocess.run([HERDFENCE, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_herdfence_config_lists_every_setting_and_masks_secrets(tmp_path):
    done = _herdfence("config", HERDFENCE_HOME=str(tmp_path), HERDFENCE_API_PORT="18001",
                      HERDFENCE_API_TOKEN="s3cr3t-value", HERDFENCE_SINK="https://bob:hunter2@example.org")
    assert done.returncode == 0, done.stderr
    lines = {line.split("=", 1)[0]: line for line in done.stdout.splitlines() if line.startswith("HERDFENCE_")}
    assert list(lines) == [var(n) for n in FIELDS]
    assert re.match(r"HERDFENCE_API_PORT=18001 +# set; default: 8000$", lines["HERDFENCE_API_PORT"])
    assert re.match(r"HERDFENCE_ELASTIC=1 +# default: 1$", lines["HERDFENCE_ELASTIC"])
    assert "s3cr3t-value" not in done.stdout and "hunter2" not in done.stdout
    assert "# HERDFENCE_API_TOKEN='***'" in done.stdout and "https://bob:***@example.org" in done.stdout

    done = _herdfence("config", "--json", HERDFENCE_HOME=str(tmp_path), HERDFENCE_ELASTIC="off",
                      HERDFENCE_API_TOKEN="s3cr3t-value")
    out = json.loads(done.stdout)
    assert list(out["settings"]) == [var(n) for n in FIELDS]
    assert out["settings"]["HERDFENCE_ELASTIC"] == {"value": False, "default": True, "set": True}
    assert out["settings"]["HERDFENCE_API_PORT"] == {"value": 8000, "default": 8000, "set": False}
    assert out["ignored"] == {"HERDFENCE_API_TOKEN": "***"}


@pytest.mark.parametrize("command", [["status"], ["config"], ["down"], ["bench", "--help"]])
def test_a_bad_value_stops_every_command_with_exit_2(tmp_path, command):
    done = _herdfence(*command, HERDFENCE_HOME=str(tmp_path), HERDFENCE_API_PORT="abc")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == "herdfence: HERDFENCE_API_PORT='abc' is not valid: an integer from 1 to 65535\n"
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "run").exists()
