"""``torchring run --config-file FILE``: the launcher's flags from a YAML file; flags given on the
command line win.

Keys are the long flag names, with ``-`` or ``_`` (``num-proc``/``np``, ``hosts``, ``ssh-port``,
``fusion-threshold-mb``, ...). horovodrun's sections are understood too::

    params: {fusion_threshold_mb: 32, cycle_time_ms: 2, cache_capacity: 2048}
    timeline: {filename: /tmp/t.json, mark_cycles: true}
    stall_check: {enabled: true, warning_time_seconds: 30, shutdown_time_seconds: 0}
    logging: {level: INFO}

``env`` may be a mapping (``{NAME: VALUE}``); list-valued flags (``network-interface``, ``x``) take lists.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

#: horovodrun's config sections: (section, key) -> our flag's destination.
_SECTIONS = {
    ("params", "fusion_threshold_mb"): "fusion_threshold_mb",
    ("params", "cycle_time_ms"): "cycle_time_ms",
    ("params", "cache_capacity"): "cache_capacity",
    ("timeline", "filename"): "timeline_filename",
    ("timeline", "mark_cycles"): "timeline_mark_cycles",
    ("stall_check", "warning_time_seconds"): "stall_check_warning_time_seconds",
    ("stall_check", "shutdown_time_seconds"): "stall_check_shutdown_time_seconds",
    ("logging", "level"): "log_level",
}
#: Names that differ from the flag's destination.
_ALIASES = {"np": "num_proc", "x": "forward", "env": "extra_env", "ssh_identity_file": "ssh_identity_file",
            "hostfile": "hostfile", "output_filename": "output_filename"}
_NOT_FROM_FILE = {"command", "config_file"}


class ConfigFileError(ValueError):
    """A config file that cannot be read or has keys the launcher does not know."""


def config_file_argument(argv: Sequence[str]) -> str | None:
    """The value of ``--config-file`` in ``argv`` (before the command), if given."""
    for index, arg in enumerate(argv):
        if arg == "--config-file" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--config-file="):
            return arg.split("=", 1)[1]
        if arg == "--":
            break
    return None


def _destinations(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {action.dest: action for action in parser._actions if action.dest not in _NOT_FROM_FILE}


def load_config_file(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The defaults ``path`` sets for ``parser`` (``ConfigFileError`` naming any unknown key)."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as error:
        raise ConfigFileError(f"--config-file {path}: cannot read it ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise ConfigFileError(f"--config-file {path}: not valid YAML ({error})") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"--config-file {path}: expected a mapping of flag names to values")
    actions = _destinations(parser)
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in ("params", "timeline", "stall_check", "logging") and isinstance(value, dict):
            for inner, inner_value in value.items():
                inner_name = str(inner).replace("-", "_")
                if (name, inner_name) == ("stall_check", "enabled"):
                    values["no_stall_check"] = not inner_value
                elif (name, inner_name) in _SECTIONS:
                    dest = _SECTIONS[(name, inner_name)]
                    values[dest] = _coerce(dest, inner_value, actions[dest], path)
                else:
                    raise ConfigFileError(f"--config-file {path}: unknown key '{key}.{inner}'")
            continue
        dest = _ALIASES.get(name, name)
        if dest not in actions:
            raise ConfigFileError(f"--config-file {path}: unknown key '{key}' (use the long flag names, "
                                  "e.g. num-proc, hosts, ssh-port)")
        values[dest] = _coerce(dest, value, actions[dest], path)
    return values


def _coerce(dest: str, value: Any, action: argparse.Action, path: str) -> Any:
    if dest == "extra_env" and isinstance(value, dict):
        return [f"{name}={item}" for name, item in value.items()]
    if isinstance(action, argparse._AppendAction):
        return [str(item) for item in (value if isinstance(value, list) else [value])]
    if action.type is not None and value is not None and not isinstance(value, bool):
        try:
            return action.type(value) if action.type is not str.upper else str(value).upper()
        except (TypeError, ValueError):
            raise ConfigFileError(f"--config-file {path}: '{dest.replace('_', '-')}' has a bad value "
                                  f"{value!r}") from None
    if dest == "hosts" and isinstance(value, list):
        return ",".join(str(item) for item in value)
    return value


def apply_config_file(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Make the values of ``--config-file`` (if any in ``argv``) the defaults of ``parser``."""
    path = config_file_argument(argv)
    if path is not None:
        parser.set_defaults(**load_config_file(path, parser))
