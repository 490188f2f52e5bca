"""``--where``: which runs, as one expression, parsed once (pure: text in, conditions out).

MLflow's filter-string style, with the short form every command took before::

    metrics.accuracy > 0.8 and params.train.lr = 3e-4 and seed != 1
    task:sst2|ud-pos,seed:0          (key:value|value, conditions joined by ',')
    params.`head_gates.pipeline` IN ('dp', 'sp')

A condition is ``KEY OP VALUE`` with OP one of ``= == != < <= > >=``, ``KEY IN (V, ...)`` or
``KEY:V|V``; conditions are joined by ``and`` (or ``,``) and a run must meet all of them. KEY is
``metrics.<name>``, ``params.<config key>`` (MLflow's names: ``params.train.lr``) or a bare axis or
config key (``seed``, ``task``, ``lambda``, ``train.lr``); a part in backquotes may hold any
character. VALUE is a word (``sst2``, ``3e-4``) or a quoted string. What a key names and how a value
compares (as a number or as text) is the selection's business (``select``); this module only reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from analysis.data.errors import QueryError

OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
"""The comparisons a condition may make (``==`` is read as ``=``, ``:`` and ``IN`` as ``=`` of any value)."""
EXAMPLE = "e.g. metrics.accuracy > 0.8 and params.train.lr = 3e-4 and seed != 1, or task:sst2,seed:0|1"


@dataclass(frozen=True)
class Condition:
    """``key op value``; with ``=`` a run meets it when it equals any of ``values``."""

    key: str
    op: str
    values: tuple[str, ...]

    def __str__(self) -> str:
        if self.op == "=":
            return f"{self.key}:{'|'.join(self.values)}"
        return f"{self.key} {self.op} {self.values[0]}"


Where = tuple[Condition, ...]

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<quoted>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    | (?P<op><=|>=|!=|==|=|<|>|:)
    | (?P<punct>[(),|])
    | (?P<word>(?:[^\s=<>!:(),|'"`]|`[^`]*`)+)
    | (?P<bad>\S)
    )""", re.VERBOSE)


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    at: int


def _tokens(text: str) -> Iterator[_Token]:
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup
        if kind is None:  # trailing blanks
            continue
        raw = match.group(kind)
        if kind == "bad":
            raise _error(text, _Token(kind, raw, match.start(kind)), "an unmatched quote or backquote" if raw in "'\"`"
                         else f"'{raw}' is no operator (=, !=, <, <=, >, >=, :, in)")
        if kind == "quoted":
            raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
        elif kind == "word":
            raw = raw.replace("`", "")
        yield _Token(kind, raw, match.start(kind))


def _error(text: str, token: _Token | None, why: str) -> QueryError:
    where = f"at '{token.text}' (character {token.at + 1})" if token else "at its end"
    return QueryError(f"--where '{text}': {where}: {why} ({EXAMPLE})")


def _keyword(token: _Token | None, word: str) -> bool:
    return token is not None and token.kind == "word" and token.text.lower() == word


def parse_where(text: str | None) -> Where:
    """``"metrics.accuracy > 0.8 and seed:0|1"`` -> its conditions ("" or None -> no condition).

    A malformed expression is a ``QueryError`` naming the token where it went wrong."""
    tokens = list(_tokens(text or ""))
    conditions: list[Condition] = []
    i = 0

    def take(kinds: tuple[str, ...], why: str) -> _Token:
        nonlocal i
        token = tokens[i] if i < len(tokens) else None
        if token is None or token.kind not in kinds:
            raise _error(text or "", token, why)
        i += 1
        return token

    def value(why: str) -> str:
        """A value; a word with ':' inside (``random:minilm-l6``, no blanks) is one value."""
        nonlocal i
        first = take(("word", "quoted"), why)
        out, end = first.text, first.at + len(first.text)
        while (first.kind == "word" and i + 1 < len(tokens) and tokens[i].text == ":" and tokens[i].at == end
               and tokens[i + 1].kind == "word" and tokens[i + 1].at == end + 1):
            out += ":" + tokens[i + 1].text
            end = tokens[i + 1].at + len(tokens[i + 1].text)
            i += 2
        return out

    while i < len(tokens):
        key = take(("word",), "expected a key (metrics.<name>, params.<key> or an axis such as seed)")
        if _keyword(key, "and") or key.text.lower() == "in":
            raise _error(text or "", key, "expected a key before it")
        if _keyword(tokens[i] if i < len(tokens) else None, "in"):
            i += 1
            if take(("punct",), "expected '(' after IN").text != "(":
                raise _error(text or "", tokens[i - 1], "expected '(' after IN")
            values = [value("expected a value")]
            while i < len(tokens) and tokens[i].text == ",":
                i += 1
                values.append(value("expected a value after ','"))
            if take(("punct",), "expected ')' to close IN (...)").text != ")":
                raise _error(text or "", tokens[i - 1], "expected ')' to close IN (...)")
            conditions.append(Condition(key.text, "=", tuple(values)))
        else:
            op = take(("op",), "expected an operator (=, !=, <, <=, >, >=, :, in) after the key")
            values = [value(f"expected a value after '{op.text}'")]
            while op.text == ":" and i < len(tokens) and tokens[i].text == "|":
                i += 1
                values.append(value("expected a value after '|'"))
            name = {"==": "=", ":": "="}.get(op.text, op.text)
            if len(values) > 1 or name == "=":
                conditions.append(Condition(key.text, "=", tuple(values)))
            else:
                conditions.append(Condition(key.text, name, tuple(values)))
        if i < len(tokens):
            joint = tokens[i]
            if not (_keyword(joint, "and") or joint.text == ","):
                raise _error(text or "", joint, "expected 'and' or ',' between two conditions")
            i += 1
            if i == len(tokens):
                raise _error(text or "", None, f"expected a condition after '{joint.text}'")
    return tuple(conditions)


def from_mapping(filters: dict | None) -> Where:
    """``{"task": "sst2", "seed": [0, 1]}`` -> the conditions ``task = sst2`` and ``seed:0|1``."""
    out = []
    for key, values in (filters or {}).items():
        values = [values] if isinstance(values, str | int | float) else list(values)
        if values:
            out.append(Condition(str(key), "=", tuple(str(v) for v in values)))
    return tuple(out)


def describe(where: Where) -> str:
    """The conditions as one line that parses back (``all runs`` when none)."""
    return ",".join(map(str, where)) or "all runs"
