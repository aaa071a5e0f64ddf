"""`herdfence config`: the effective HERDFENCE_* settings, one per line with its value and default
(secrets masked), `--json` for tools, and `--markdown [FILE]`: docs/configuration.md, generated from
the model in fencing/settings_model.py (tests/unit/test_config.py checks the committed file is current).

    herdfence config --markdown docs/configuration.md      # after changing a setting
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fencing.settings_model import HerdfenceEnv, accepts, extra, read_env, unknown_vars, var

SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD", re.IGNORECASE)
URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@\s:]*)(?P<pw>:[^/@\s]*)?@")
MASK = "***"
INTRO = """\
# Configuration

<!-- Generated from fencing/settings_model.py by `herdfence config --markdown docs/configuration.md`;
     tests/unit/test_config.py fails when this file and the model differ. -->

herdfence reads its settings from `HERDFENCE_*` environment variables, once per process, and checks \
every one of them before any command runs. An empty variable is the same as an unset one (except \
where the table says that empty means something). A value a setting does not accept stops every \
command, `make up` included, with exit code 2 and one line per bad variable:

```
herdfence: HERDFENCE_API_PORT='abc' is not valid: an integer from 1 to 65535
```

`herdfence config` prints the settings in effect, one `HERDFENCE_*` per line with its value and \
default (`set` marks those the environment gives); `herdfence config --json` prints the same as \
JSON. Values of variables named like a secret (`KEY`, `SECRET`, `TOKEN`, `PASSWORD`) and the \
credentials in URLs are shown as `***`. `HERDFENCE_*` variables that are no setting (a typo?) are \
listed as ignored.
"""


def mask(name: str, value: str) -> str:
    """The value as it may be shown: all of it hidden for a secret's name, the credentials of a URL."""
    if value and SECRET_NAME.search(name):
        return MASK
    return URL_CREDENTIALS.sub(lambda m: m["scheme"] + (f"{m['user']}:{MASK}" if m["pw"] else MASK) + "@", value)


def as_text(value: Any) -> str:
    """A value as its variable would be written: on/off as 1/0, unset as "", 20.0 as 20."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def rows(env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every setting in the model's order: variable, effective value, default, whether the
    environment set it, what it accepts and means. Values of secrets are masked."""
    env = os.environ if env is None else env
    current = read_env(env)
    raw = {k.upper(): v for k, v in env.items()}
    out = []
    for name, field in HerdfenceEnv.model_fields.items():
        value, default, given = getattr(current, name), field.default, raw.get(var(name))
        is_set = given is not None and bool(given.strip() or extra(field).get("keep_empty"))
        out.append({"variable": var(name), "value": value, "default": default, "set": is_set,
                    "accepts": accepts(field), "description": field.description or "",
                    "unset": extra(field).get("unset"), "group": extra(field)["group"]})
        for key in ("value", "default"):
            if isinstance(out[-1][key], str):
                out[-1][key] = mask(var(name), out[-1][key])
    return out


def render_text(env: Mapping[str, str] | None = None) -> str:
    lines = []
    for r in rows(env):
        default = shlex.quote(as_text(r["default"])) if r["default"] is not None else f"unset ({r['unset'].replace('`', '')})"
        setting = f"{r['variable']}={shlex.quote(as_text(r['value'])) if r['value'] is not None else ''}"
        lines.append(f"{setting:44} # {'set; ' if r['set'] else ''}default: {default}")
    ignored = unknown_vars(os.environ if env is None else env)
    if ignored:
        lines.append("# not herdfence settings (ignored):")
        lines += [f"# {k}={shlex.quote(mask(k, v))}" for k, v in ignored.items()]
    return "\n".join(lines) + "\n"


def render_json(env: Mapping[str, str] | None = None) -> str:
    ignored = unknown_vars(os.environ if env is None else env)
    return json.dumps({"settings": {r["variable"]: {k: r[k] for k in ("value", "default", "set")} for r in rows(env)},
                       "ignored": {k: mask(k, v) for k, v in ignored.items()}}, indent=1)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    """docs/configuration.md: the model's settings by section, defaults and not the environment's values."""
    out = [INTRO.rstrip("\n")]
    section = None
    for r in rows({}):
        if r["group"] != section:
            section = r["group"]
            out += ["", f"## {section}", "", "| variable | default | accepts | meaning |", "|---|---|---|---|"]
        default = f"`{as_text(r['default'])}`" if r["default"] is not None else f"unset: {r['unset']}"
        if r["default"] == "":
            default = "empty"
        out.append(f"| `{r['variable']}` | {_cell(default)} | {_cell(r['accepts'])} | {_cell(r['description'])} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="herdfence config", description="the effective HERDFENCE_* settings")
    p.add_argument("--json", action="store_true", help="one JSON object: settings (value, default, set), ignored")
    p.add_argument("--markdown", nargs="?", const="-", metavar="FILE",
                   help="the settings' reference as Markdown (docs/configuration.md), to FILE or stdout")
    args = p.parse_args(argv)
    if args.markdown:
        text = render_markdown()
        if args.markdown == "-":
            sys.stdout.write(text)
        else:
            Path(args.markdown).write_text(text)
            print(f"wrote {args.markdown}")
        return 0
    sys.stdout.write(render_json() + "\n" if args.json else render_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
