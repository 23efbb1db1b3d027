"""The stored fields a repro script is built from, each checked to be what a result holds, and the
script's text made safe: every stored value enters a script as a Python literal (:func:`literal`)
or as escaped docstring text (:func:`doc_text`), and :func:`check_script` parses the script back
to see that nothing stored leaked into its code. Shared by :mod:`.repro` (OpInfo, schema and
traced items) and :mod:`.repro_customops` (the custom-op lane's items).

Each check raises ValueError naming the result (``where``), the field and its value.

Example::

    >>> int_field(3, "result 7", "sample")
    3
    >>> int_field("3", "result 7", "sample")
    Traceback (most recent call last):
    ...
    ValueError: result 7: field sample is '3', not an integer
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

import torch


def str_field(row: dict[str, Any], name: str, where: str) -> str:
    value = row.get(name)
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {name} is {value!r}, not a string")
    return value


_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


def opt_str(value: Any, where: str, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}: field {name} is {value!r}, not a string")
    return value


def env_pairs(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(e, str) and "=" in e for e in value):
        raise ValueError(f"{where}: its run's config env is {value!r}, not a list of NAME=VALUE")
    return tuple(value)


def module_names(value: Any, where: str) -> list[str]:
    """The run's ``--import`` modules: dotted Python names only."""
    mods = list(value or ())
    for m in mods:
        if not (isinstance(m, str) and _MODULE.match(m)):
            raise ValueError(f"{where}: its run's config imports {m!r}, not a dotted module name")
    return mods


def int_field(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: field {name} is {value!r}, not an integer")
    return value


def tol_field(value: Any, where: str, name: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: field {name} is {value!r}, not a finite non-negative number")
    return float(value)


def dtype_field(value: Any, where: str) -> torch.dtype:
    found = getattr(torch, value, None) if isinstance(value, str) and value.isidentifier() else None
    if not isinstance(found, torch.dtype):
        raise ValueError(f"{where}: field dtype is {value!r}, not a torch dtype")
    return found


def run_config(text: Any, where: str) -> dict[str, Any]:
    try:
        config = json.loads(text or "{}")
    except (TypeError, ValueError):
        config = None
    if not isinstance(config, dict):
        raise ValueError(f"{where}: its run's config is not a JSON object")
    return config


def literal(value: Any) -> str:
    """A Python literal for plain data (str, int, float, bool, None, dicts/lists of them)."""
    text = repr(value)
    if ast.literal_eval(text) != value:
        raise ValueError(f"cannot write {value!r} as a literal")
    return text


def doc_text(text: str) -> str:
    """``text`` escaped for a triple-quoted docstring: it reads back as ``text`` and cannot close it."""
    out = []
    for c in text:
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n" or c.isprintable():
            out.append(c)
        else:
            out.append(repr(c)[1:-1])
    return "".join(out)


def check_script(text: str, record: dict[str, Any]) -> None:
    # Defence in depth: the script must parse, its docstring must be the one module docstring,
    # and the record must be the literal it was built from (nothing stored leaked into code).
    tree = ast.parse(text)
    first = tree.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)):
        raise ValueError("repro script: the docstring did not parse as one string")
    assigns = [n for n in tree.body if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "RECORD" for t in n.targets)]
    if len(assigns) != 1 or ast.literal_eval(assigns[0].value) != record:
        raise ValueError("repro script: the record did not parse back as written")
