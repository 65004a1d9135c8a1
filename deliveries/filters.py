"""Target filters: which events a target receives.

A target's `filters` is a list of rules, all of which must match:

    {"source": "header", "name": "X-GitHub-Event", "op": "equals", "value": "push"}
    {"source": "json", "name": "data.object.status", "op": "one_of", "value": ["paid", "open"]}
    {"source": "json", "name": "livemode", "op": "exists"}
    {"source": "event", "name": "type", "op": "one_of", "value": ["push", "release"]}

An `event` rule reads what webhooker knows of the event: its `type` (from the
entrypoint's verification preset or event-type header, "" when unknown). Header
names match case-insensitively, against every line of that header. A JSON path is
dotted; a number in it indexes a list. A body that is not JSON, or a path that is
missing, matches only `not_equals` (and never `exists`): a rule that cannot be
evaluated filters the event out, it never raises. The engine evaluates rules at
attempt time, never the inbound endpoint.
"""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError

SOURCES = ("header", "json", "event")
# What an `event` rule may read.
EVENT_FIELDS = ("type",)
OPS = ("equals", "one_of", "exists", "not_equals")
MAX_RULES = 20
_MISSING = object()


def clean_filters(rules) -> list[dict]:
    """Return the normalised rules, or raise ValidationError naming the bad rule."""
    if rules in (None, ""):
        return []
    if not isinstance(rules, list):
        raise ValidationError("Filters must be a list of rules.")
    if len(rules) > MAX_RULES:
        raise ValidationError(f"At most {MAX_RULES} filter rules.")
    return [_clean_rule(n, rule) for n, rule in enumerate(rules, 1)]


def _clean_rule(n: int, rule) -> dict:
    if not isinstance(rule, dict):
        raise ValidationError(f"Rule {n} must be an object with source, name, op and value.")
    unknown = set(rule) - {"source", "name", "op", "value"}
    if unknown:
        raise ValidationError(f"Rule {n}: unknown keys {', '.join(sorted(unknown))}.")
    source, name, op = rule.get("source"), rule.get("name"), rule.get("op")
    if source not in SOURCES:
        raise ValidationError(f"Rule {n}: source must be one of {', '.join(SOURCES)}.")
    if not isinstance(name, str) or not name.strip():
        what = {"header": "a header name", "json": "a dotted JSON path"}.get(source, "type")
        raise ValidationError(f"Rule {n}: name must be {what}.")
    if source == "event" and name.strip() not in EVENT_FIELDS:
        raise ValidationError(f"Rule {n}: an event rule's name is {', '.join(EVENT_FIELDS)}.")
    if op not in OPS:
        raise ValidationError(f"Rule {n}: op must be one of {', '.join(OPS)}.")
    cleaned = {"source": source, "name": name.strip(), "op": op}
    if op == "exists":
        return cleaned
    if "value" not in rule:
        raise ValidationError(f"Rule {n}: {op} needs a value.")
    value = rule["value"]
    if op == "one_of" and (not isinstance(value, list) or not value):
        raise ValidationError(f"Rule {n}: one_of needs a non-empty list of values.")
    if source != "json" and not all(isinstance(v, str) for v in _values(op, value)):
        raise ValidationError(f"Rule {n}: {source} values are text.")
    cleaned["value"] = value
    return cleaned


def _values(op, value) -> list:
    return value if op == "one_of" else [value]


def matches(rules: list[dict], headers: list, body: bytes, *, event_type: str = "") -> bool:
    """Whether an event with these headers, body and type passes every rule."""
    document = _MISSING
    for rule in rules:
        if rule["source"] == "header":
            name = rule["name"].lower()
            found = [value for key, value in headers if key.lower() == name]
        elif rule["source"] == "event":
            found = [event_type] if event_type else []
        else:
            if document is _MISSING:
                document = _parse(body)
            value = _lookup(document, rule["name"])
            found = [] if value is _MISSING else [value]
        if not _test(rule, found):
            return False
    return True


def _test(rule: dict, found: list) -> bool:
    op = rule["op"]
    if op == "exists":
        return bool(found)
    wanted = _values(op, rule["value"])
    hit = any(_equal(value, want) for value in found for want in wanted)
    return not hit if op == "not_equals" else hit


def _equal(value, want) -> bool:
    # True == 1 in Python; in JSON they are different things. 1 and 1.0 are not.
    if isinstance(value, bool) or isinstance(want, bool):
        return value is want
    if isinstance(value, int | float) and isinstance(want, int | float):
        return value == want
    return type(value) is type(want) and value == want


def _parse(body: bytes):
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        return _MISSING


def _lookup(document, path: str):
    current = document
    for part in path.split("."):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return _MISSING
    return current
