"""JSON read the way serde_json reads it, so that the executor accepts exactly the texts the
Rust side accepts.

Where this differs from Python's `json` module, it follows serde_json (1.0):
- numbers: an integer literal is a u64 (non-negative) or an i64 (negative) when it fits,
  otherwise a float; `-0` is the float -0.0; a number that overflows a float (`1e309`) is
  an error; NaN and Infinity are not JSON;
- strings: `\\ud800` without its low half, or a low half alone, is an error (Python keeps it);
- nesting: a value nested 128 containers deep is an error (serde_json's recursion limit),
  where Python raises RecursionError near 1,000 and crashes callers that did not expect it;
- objects keep every key in order, duplicates included: serde decides what a duplicate
  means for each type;
- `skip()` passes over a value as serde_json's `ignore_value` does (what it does for a key
  the target type does not know): syntax checked, but no depth limit, no range check on
  numbers and no pairing check on `\\u` escapes.

Values: None, bool, int (a u64 or i64), float, str, list, and `Obj` for objects.
"""

from __future__ import annotations

import re
from typing import TypeAlias

from hypha.accelerate_executor.errors import JsonError

RECURSION_LIMIT = 128
_U64_MAX = 2**64 - 1
_I64_MIN = -(2**63)
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_PLAIN_CHARS = re.compile(r'[^"\\\x00-\x1f]*')
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_DIGITS = frozenset("0123456789")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class Obj:
    """A JSON object: its members in order, duplicates kept."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Value]]) -> None:
        self.pairs = pairs


Value: TypeAlias = "bool | int | float | str | list[Value] | Obj | None"


def from_python(raw: object) -> Value:
    """What `json.loads` made, as a Value (its objects lost their duplicate keys already)."""
    if isinstance(raw, dict):
        return Obj([(str(key), from_python(item)) for key, item in raw.items()])
    if isinstance(raw, list):
        return [from_python(item) for item in raw]
    assert raw is None or isinstance(raw, bool | int | float | str), raw
    return raw


class Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def fail(self, problem: str) -> JsonError:
        line = self.text.count("\n", 0, self.at) + 1
        column = self.at - (self.text.rfind("\n", 0, self.at) + 1) + 1
        return JsonError(f"{problem} at line {line} column {column}")

    def peek(self) -> str:
        """The next character after whitespace, '' at the end."""
        self.at = _WHITESPACE.match(self.text, self.at).end()  # type: ignore[union-attr]
        return self.text[self.at : self.at + 1]

    def expect(self, char: str, problem: str) -> None:
        if self.peek() != char:
            raise self.fail(problem)
        self.at += 1

    def end(self) -> None:
        if self.peek():
            raise self.fail("trailing characters")

    def value(self, depth_left: int = RECURSION_LIMIT) -> Value:
        """The next value, read strictly. `depth_left` counts the containers that may still
        open, as serde_json's remaining depth does."""
        char = self.peek()
        if char == "{":
            return self.object(depth_left)
        if char == "[":
            return self.array(depth_left)
        if char == '"':
            self.at += 1
            return self.string(strict=True)
        if char == "-" or char in _DIGITS:
            return self.number()
        for word, literal in (("null", None), ("true", True), ("false", False)):
            if self.text.startswith(word, self.at):
                self.at += len(word)
                return literal
        raise self.fail("EOF while parsing a value" if not char else "expected value")

    def enter(self, depth_left: int) -> int:
        if depth_left - 1 == 0:
            raise self.fail("recursion limit exceeded")
        self.at += 1
        return depth_left - 1

    def object(self, depth_left: int) -> Obj:
        depth_left = self.enter(depth_left)
        pairs: list[tuple[str, Value]] = []
        if self.peek() == "}":
            self.at += 1
            return Obj(pairs)
        while True:
            key = self.key()
            pairs.append((key, self.value(depth_left)))
            if not self.after_member("}"):
                return Obj(pairs)

    def key(self) -> str:
        self.expect('"', "key must be a string")
        key = self.string(strict=True)
        self.expect(":", "expected `:`")
        return key

    def array(self, depth_left: int) -> list[Value]:
        depth_left = self.enter(depth_left)
        items: list[Value] = []
        if self.peek() == "]":
            self.at += 1
            return items
        while True:
            items.append(self.value(depth_left))
            if not self.after_member("]"):
                return items

    def after_member(self, close: str) -> bool:
        """True when a comma says another member follows; consumes the closing bracket."""
        char = self.peek()
        self.at += 1
        if char == ",":
            if self.peek() == close:
                raise self.fail("trailing comma")
            return True
        if char == close:
            return False
        self.at -= 1
        raise self.fail("EOF while parsing" if not char else f"expected `,` or `{close}`")

    def number(self) -> int | float:
        match = _NUMBER.match(self.text, self.at)
        if match is None:
            raise self.fail("invalid number")
        self.at = match.end()
        literal = match.group()
        # 20 digits hold every u64; more cannot fit (and int() refuses very long ones).
        if match.group(2) is None and match.group(3) is None and len(match.group(1)) <= 20:
            integer = int(literal)
            if (0 <= integer <= _U64_MAX and literal != "-0") or _I64_MIN <= integer < 0:
                return integer
        number = float(literal)
        if number in (float("inf"), float("-inf")):
            raise self.fail("number out of range")
        return number

    def string(self, strict: bool) -> str:
        """The rest of a string whose opening quote was read. Not strict: as serde_json
        ignores a string, escapes checked for syntax only, nothing kept."""
        text, parts = self.text, []
        while True:
            plain = _PLAIN_CHARS.match(text, self.at).end()  # type: ignore[union-attr]
            parts.append(text[self.at : plain])
            self.at = plain
            char = text[plain : plain + 1]
            if char == '"':
                self.at += 1
                return "".join(parts) if strict else ""
            if not char:
                raise self.fail("EOF while parsing a string")
            if char != "\\":
                raise self.fail("control character (\\u0000-\\u001F) found while parsing a string")
            escape = text[plain + 1 : plain + 2]
            self.at = plain + 2
            if escape in _ESCAPES:
                parts.append(_ESCAPES[escape])
            elif escape == "u":
                code = self.hex4()
                if strict:
                    parts.append(self.code_point(code))
            else:
                raise self.fail("invalid escape")

    def hex4(self) -> int:
        if not _HEX4.fullmatch(self.text, self.at, self.at + 4):
            raise self.fail("invalid escape")
        self.at += 4
        return int(self.text[self.at - 4 : self.at], 16)

    def code_point(self, code: int) -> str:
        if 0xDC00 <= code <= 0xDFFF:
            raise self.fail("lone leading surrogate in hex escape")
        if 0xD800 <= code <= 0xDBFF:
            if not self.text.startswith("\\u", self.at):
                raise self.fail("unexpected end of hex escape")
            self.at += 2
            low = self.hex4()
            if not 0xDC00 <= low <= 0xDFFF:
                raise self.fail("lone leading surrogate in hex escape")
            return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))
        return chr(code)

    def skip(self) -> None:
        """Passes over one value as serde_json's `ignore_value` does: iteratively, so any
        depth passes."""
        open_containers: list[str] = []
        while True:
            char = self.peek()
            if char in ("{", "["):
                self.at += 1
                close = "}" if char == "{" else "]"
                if self.peek() == close:
                    self.at += 1
                else:
                    open_containers.append(close)
                    if close == "}":
                        self.skip_key()
                    continue
            elif char == '"':
                self.at += 1
                self.string(strict=False)
            elif char == "-" or char in _DIGITS:
                if not _NUMBER.match(self.text, self.at):
                    raise self.fail("invalid number")
                self.at = _NUMBER.match(self.text, self.at).end()  # type: ignore[union-attr]
            elif not self.skip_literal():
                raise self.fail("EOF while parsing a value" if not char else "expected value")
            # A value ended: close what it ended, or go on to the next member.
            while open_containers:
                close = open_containers[-1]
                if self.after_member(close):
                    if close == "}":
                        self.skip_key()
                    break
                open_containers.pop()
            else:
                return

    def skip_key(self) -> None:
        self.expect('"', "key must be a string")
        self.string(strict=False)
        self.expect(":", "expected `:`")

    def skip_literal(self) -> bool:
        for word in ("null", "true", "false"):
            if self.text.startswith(word, self.at):
                self.at += len(word)
                return True
        return False


def read_struct(text: str, fields: frozenset[str]) -> Obj | list[Value]:
    """A whole text holding one struct, read as serde_json streams a struct: the members
    named in `fields` strictly, the others skipped as serde_json ignores a key it does not
    know. An array is read whole: serde takes a struct's fields in order from one."""
    reader = Reader(text)
    char = reader.peek()
    if char == "[":
        value: Obj | list[Value] = reader.array(RECURSION_LIMIT)
    elif char == "{":
        depth_left = reader.enter(RECURSION_LIMIT)
        value = Obj([])
        if reader.peek() == "}":
            reader.at += 1
        else:
            while True:
                key = reader.key()
                if key in fields:
                    value.pairs.append((key, reader.value(depth_left)))
                else:
                    reader.skip()
                if not reader.after_member("}"):
                    break
    else:
        reader.value()  # a syntax error, if there is one, is what serde_json reports
        raise reader.fail("invalid type: expected an object")
    reader.end()
    return value
