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
    parser = _Parser(text or "")
    conditions: list[Condition] = []
    while not parser.done():
        conditions.append(parser.condition())
        parser.joint()
    return tuple(conditions)


class _Parser:
    """The tokens of one expression and the position of the next one."""

    def __init__(self, text: str) -> None:
        self.text, self.tokens, self.i = text, list(_tokens(text)), 0

    def done(self) -> bool:
        return self.i >= len(self.tokens)

    def peek(self) -> _Token | None:
        return None if self.done() else self.tokens[self.i]

    def take(self, kinds: tuple[str, ...], why: str) -> _Token:
        token = self.peek()
        if token is None or token.kind not in kinds:
            raise _error(self.text, token, why)
        self.i += 1
        return token

    def punct(self, text: str, why: str) -> None:
        if self.take(("punct",), why).text != text:
            raise _error(self.text, self.tokens[self.i - 1], why)

    def value(self, why: str) -> str:
        """A value; a word with ':' inside (``random:minilm-l6``, no blanks) is one value."""
        first = self.take(("word", "quoted"), why)
        out, end, tokens = first.text, first.at + len(first.text), self.tokens
        while (first.kind == "word" and self.i + 1 < len(tokens) and tokens[self.i].text == ":"
               and tokens[self.i].at == end and tokens[self.i + 1].kind == "word" and tokens[self.i + 1].at == end + 1):
            out += ":" + tokens[self.i + 1].text
            end = tokens[self.i + 1].at + len(tokens[self.i + 1].text)
            self.i += 2
        return out

    def values(self, separator: str, why: str) -> list[str]:
        """A value and each further one after ``separator``."""
        values = [self.value(why)]
        while not self.done() and self.tokens[self.i].text == separator:
            self.i += 1
            values.append(self.value(f"expected a value after '{separator}'"))
        return values

    def condition(self) -> Condition:
        """``KEY IN (V, ...)``, ``KEY:V|V`` or ``KEY OP VALUE``."""
        key = self.take(("word",), "expected a key (metrics.<name>, params.<key> or an axis such as seed)")
        if _keyword(key, "and") or key.text.lower() == "in":
            raise _error(self.text, key, "expected a key before it")
        if _keyword(self.peek(), "in"):
            self.i += 1
            self.punct("(", "expected '(' after IN")
            values = self.values(",", "expected a value")
            self.punct(")", "expected ')' to close IN (...)")
            return Condition(key.text, "=", tuple(values))
        op = self.take(("op",), "expected an operator (=, !=, <, <=, >, >=, :, in) after the key")
        values = self.values("|", f"expected a value after '{op.text}'") if op.text == ":" else \
            [self.value(f"expected a value after '{op.text}'")]
        name = {"==": "=", ":": "="}.get(op.text, op.text)
        return Condition(key.text, "=" if len(values) > 1 or name == "=" else name, tuple(values))

    def joint(self) -> None:
        """``and`` or ``,`` between two conditions (nothing after the last)."""
        joint = self.peek()
        if joint is None:
            return
        if not (_keyword(joint, "and") or joint.text == ","):
            raise _error(self.text, joint, "expected 'and' or ',' between two conditions")
        self.i += 1
        if self.done():
            raise _error(self.text, None, f"expected a condition after '{joint.text}'")



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
