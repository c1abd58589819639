"""The one models.toml writer: edits through tomlkit, so comments and layout survive, and every edit is
validated as the server would read it before the file is replaced."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tomlkit

from .registry import RegistryError, parse_registry


def _read(path: Path) -> tomlkit.TOMLDocument:
    if not path.is_file():
        return tomlkit.document()
    try:
        return tomlkit.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomlkit.exceptions.TOMLKitError) as exc:
        raise RegistryError(f"{path}: cannot parse: {exc}", fix="fix the file by hand, then run the command again") \
            from None


def _write(path: Path, doc: tomlkit.TOMLDocument) -> None:
    text = tomlkit.dumps(doc)
    parse_registry(tomlkit.parse(text).unwrap(), path.resolve())  # never write a file the server would refuse
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def has_model(path: Path, name: str) -> bool:
    return name in _read(path).get("models", {})


def add_model(path: Path, name: str, entry: dict[str, Any]) -> None:
    """Append [models.NAME]; a new file makes it the default."""
    doc = _read(path)
    if name in doc.get("models", {}):
        raise RegistryError(f"{path} already has [models.{name}]", fix="remove that table or pick another --name")
    if "default" not in doc:
        doc["default"] = name
    if "models" not in doc:
        doc["models"] = tomlkit.table(is_super_table=True)
    table = tomlkit.table()
    for key, value in entry.items():
        table[key] = value
    doc["models"][name] = table
    _write(path, doc)


def set_model_keys(path: Path, name: str, values: dict[str, Any]) -> None:
    """Set keys of an existing [models.NAME] table, leaving the rest of the file as it is."""
    doc = _read(path)
    models = doc.get("models", {})
    if name not in models:
        raise RegistryError(f"{path} has no [models.{name}] table", fix="check the model name")
    for key, value in values.items():
        if isinstance(value, dict):
            inline = tomlkit.inline_table()
            inline.update(value)
            value = inline
        models[name][key] = value
    _write(path, doc)
