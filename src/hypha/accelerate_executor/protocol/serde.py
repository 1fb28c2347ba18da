"""Rust types as serde decodes them from JSON, for values read by `serde_json.py`.

Each class stands for a Rust type with its serde attributes; `decode` accepts exactly what
serde (1.0, with serde_json) accepts for that type and returns it in its canonical JSON
shape (objects as dicts with every tag, absent options left out), or raises SerdeError.
The rules that surprise a Python reader are serde's own:
- a struct also decodes from an array holding its fields in order, all of them;
- keys a struct does not know are ignored, a known key given twice is an error, a missing
  `Option` field is None;
- an internally tagged enum (`#[serde(tag = "type")]`) buffers its content first, so inside
  one every value is read strictly (the depth limit and number ranges apply to ignored keys
  too) and a tag may also be given as the variant's index, `{"type": 0}`; the outermost
  such enum, read straight from serde_json, takes a string tag only;
- a unit variant of an externally tagged enum is a string, or a one-key object whose value
  is null or `{}`.

Messages name the field and the problem and never quote a string from the input: the job
may carry a token.

`serde_type` derives these from pydantic models, so that the job's types are declared once
(job.py): serde's reading follows from the annotations, and the models' own constraints
are what the executor refuses beyond serde.
"""

from __future__ import annotations

import functools
import operator
import re
import types
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from hypha.accelerate_executor.errors import SerdeError
from hypha.accelerate_executor.protocol.serde_json import Obj, Value

Path = tuple[str | int, ...]


def _kind(value: Value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a floating point number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


class SerdeType:
    def decode(self, value: Value, path: Path) -> Any:
        raise NotImplementedError

    def mismatch(self, value: Value, path: Path, expected: str) -> SerdeError:
        return SerdeError(path, f"invalid type: {_kind(value)}, expected {expected}")


class Str(SerdeType):
    def decode(self, value: Value, path: Path) -> str:
        if not isinstance(value, str):
            raise self.mismatch(value, path, "a string")
        return value


class Bool(SerdeType):
    def decode(self, value: Value, path: Path) -> bool:
        if not isinstance(value, bool):
            raise self.mismatch(value, path, "a boolean")
        return value


class Integer(SerdeType):
    def __init__(self, rust: str) -> None:
        bits = int(rust[1:])
        self.rust = rust
        self.low = 0 if rust[0] == "u" else -(2 ** (bits - 1))
        self.high = 2**bits - 1 if rust[0] == "u" else 2 ** (bits - 1) - 1

    def decode(self, value: Value, path: Path) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.mismatch(value, path, self.rust)
        if not self.low <= value <= self.high:
            raise SerdeError(path, f"invalid value: integer {value}, expected {self.rust}")
        return value


class F64(SerdeType):
    def decode(self, value: Value, path: Path) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.mismatch(value, path, "f64")
        return float(value)


class Checked(SerdeType):
    """A string type whose syntax is checked (Uuid, PeerId)."""

    def __init__(self, what: str, valid: Callable[[str], bool]) -> None:
        self.what, self.valid = what, valid

    def decode(self, value: Value, path: Path) -> str:
        if not isinstance(value, str):
            raise self.mismatch(value, path, self.what)
        if not self.valid(value):
            raise SerdeError(path, f"invalid value: a string, expected {self.what}")
        return value


class Vec(SerdeType):
    def __init__(self, item: SerdeType) -> None:
        self.item = item

    def decode(self, value: Value, path: Path) -> list[Any]:
        if not isinstance(value, list):
            raise self.mismatch(value, path, "a sequence")
        return [self.item.decode(item, (*path, i)) for i, item in enumerate(value)]


class Array(SerdeType):
    def __init__(self, item: SerdeType, length: int) -> None:
        self.item, self.length = item, length

    def decode(self, value: Value, path: Path) -> list[Any]:
        if not isinstance(value, list):
            raise self.mismatch(value, path, f"an array of length {self.length}")
        if len(value) != self.length:
            raise SerdeError(path, f"invalid length {len(value)}, expected {self.length}")
        return [self.item.decode(item, (*path, i)) for i, item in enumerate(value)]


class Option(SerdeType):
    def __init__(self, inner: SerdeType) -> None:
        self.inner = inner

    def decode(self, value: Value, path: Path) -> Any:
        return None if value is None else self.inner.decode(value, path)


class Default(Option):
    """`#[serde(default)]`: may be left out (the reader supplies the default), not null."""

    def decode(self, value: Value, path: Path) -> Any:
        return self.inner.decode(value, path)


class Struct(SerdeType):
    """A struct by its fields as spelled on the wire, in declaration order."""

    def __init__(self, fields: dict[str, SerdeType]) -> None:
        self.fields = fields

    def decode(self, value: Value, path: Path) -> dict[str, Any]:
        if isinstance(value, list):
            if len(value) != len(self.fields):
                raise SerdeError(
                    path,
                    f"invalid length {len(value)}, expected {len(self.fields)} fields in order",
                )
            pairs = list(zip(self.fields, value, strict=True))
        elif isinstance(value, Obj):
            pairs = [(key, item) for key, item in value.pairs if key in self.fields]
        else:
            raise self.mismatch(value, path, "an object")
        decoded: dict[str, Any] = {}
        for key, item in pairs:
            if key in decoded:
                raise SerdeError(path, f"duplicate field `{key}`")
            decoded[key] = self.fields[key].decode(item, (*path, key))
        for key, kind in self.fields.items():
            if key not in decoded and not isinstance(kind, Option):
                raise SerdeError(path, f"missing field `{key}`")
        return decoded


def _expected(names: list[str]) -> str:
    if len(names) > 6:
        return f"one of the {len(names)} names upstream knows (hypha-accelerate schema lists them)"
    return "one of " + ", ".join(names)


class UnitEnum(SerdeType):
    """An externally tagged enum of unit variants, as serde derives it."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)

    def decode(self, value: Value, path: Path) -> str:
        if isinstance(value, str):
            name, payload = value, None
        elif isinstance(value, Obj):
            if len(value.pairs) != 1:
                raise SerdeError(path, "invalid value: a map, expected a map with a single key")
            name, payload = value.pairs[0]
        else:
            raise self.mismatch(value, path, "a string or a map")
        if name not in self.names:
            raise SerdeError(path, f"unknown variant, expected {_expected(self.names)}")
        if not (payload is None or (isinstance(payload, Obj) and not payload.pairs)):
            raise self.mismatch(payload, path, "unit variant")
        return name


class Tagged(SerdeType):
    """An internally tagged enum, `#[serde(tag = ...)]`; a variant is a Struct or None (a
    unit variant). `index_tags`: the content was buffered by an enclosing tagged enum, so a
    variant's index may stand for its name."""

    def __init__(self, tag: str, variants: dict[str, Struct | None], index_tags: bool = True):
        self.tag, self.variants, self.index_tags = tag, variants, index_tags

    def decode(self, value: Value, path: Path) -> dict[str, Any]:
        rest: Obj | list[Value]
        if isinstance(value, Obj):
            tags = [item for key, item in value.pairs if key == self.tag]
            if len(tags) > 1:
                raise SerdeError(path, f"duplicate field `{self.tag}`")
            if not tags:
                raise SerdeError(path, f"missing field `{self.tag}`")
            name = self.variant(tags[0], (*path, self.tag))
            rest = Obj([(key, item) for key, item in value.pairs if key != self.tag])
        elif isinstance(value, list):
            if not value:
                raise SerdeError(path, f"missing field `{self.tag}`")
            name, rest = self.variant(value[0], (*path, 0)), value[1:]
        else:
            raise self.mismatch(value, path, f"an object tagged by `{self.tag}`")
        body = self.variants[name]
        if body is None:
            if isinstance(rest, list) and rest:
                raise SerdeError(path, f"invalid length {len(rest) + 1}, expected 1")
            return {self.tag: name}
        return {self.tag: name, **body.decode(rest, path)}

    def variant(self, tag: Value, path: Path) -> str:
        names = list(self.variants)
        if isinstance(tag, str):
            if tag in self.variants:
                return tag
            raise SerdeError(path, f"unknown variant, expected {_expected(names)}")
        if self.index_tags and isinstance(tag, int) and not isinstance(tag, bool) and tag >= 0:
            if tag < len(names):
                return names[tag]
            raise SerdeError(
                path, f"invalid value: variant index {tag}, expected below {len(names)}"
            )
        raise self.mismatch(tag, path, "a variant name")


class TryFrom(SerdeType):
    """`#[serde(try_from = ...)]`: the inner type, then a check that may refuse it."""

    def __init__(self, inner: SerdeType, problem: Callable[[Any], str | None]) -> None:
        self.inner, self.problem = inner, problem

    def decode(self, value: Value, path: Path) -> Any:
        decoded = self.inner.decode(value, path)
        problem = self.problem(decoded)
        if problem:
            raise SerdeError(path, problem)
        return decoded


# uuid 1.x `Uuid::parse_str`: simple, hyphenated, braced or URN, hex digits of either case.
_HEX = "[0-9a-fA-F]"
_HYPHENATED = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
_UUID = re.compile(f"{_HEX}{{32}}|{_HYPHENATED}|\\{{{_HYPHENATED}\\}}|urn:uuid:{_HYPHENATED}")


def is_uuid(text: str) -> bool:
    return _UUID.fullmatch(text) is not None


_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_MULTIHASH_IDENTITY, _MULTIHASH_SHA2_256 = 0x00, 0x12
_MAX_INLINE_KEY_LENGTH = 42  # libp2p: longer keys are hashed
_MAX_DIGEST = 64  # libp2p-identity's Multihash<64>
# A longer base58 string decodes to more than the 66 bytes of the longest multihash.
_MAX_PEER_ID_CHARS = 200


def _base58(text: str) -> bytes | None:
    number = 0
    for char in text:
        digit = _BASE58.find(char)
        if digit < 0:
            return None
        number = number * 58 + digit
    zeros = len(text) - len(text.lstrip("1"))
    return bytes(zeros) + number.to_bytes((number.bit_length() + 7) // 8, "big")


def _varint(data: bytes, at: int) -> tuple[int, int] | None:
    """unsigned-varint's u64: at most 10 bytes, minimal, bits past 64 dropped."""
    value = 0
    for i, byte in enumerate(data[at : at + 10]):
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return None if byte == 0 and i > 0 else (value & (2**64 - 1), at + i + 1)
    return None


def is_peer_id(text: str) -> bool:
    """libp2p's `PeerId::from_str`: base58btc of a multihash whose code is sha2-256, or
    identity with an inlined key of at most 42 bytes."""
    if len(text) > _MAX_PEER_ID_CHARS:
        return False
    data = _base58(text)
    code = _varint(data, 0) if data is not None else None
    size = _varint(data, code[1]) if data is not None and code else None
    if data is None or code is None or size is None:
        return False
    length, digest_at = size
    if length > _MAX_DIGEST or len(data) - digest_at != length:
        return False
    return code[0] == _MULTIHASH_SHA2_256 or (
        code[0] == _MULTIHASH_IDENTITY and length <= _MAX_INLINE_KEY_LENGTH
    )


UUID = Checked("a UUID", is_uuid)
PEER_ID = Checked("a libp2p peer id", is_peer_id)


# Derived from pydantic annotations: serde's reading of a model follows from its fields.


def serde_type(annotation: Any, metadata: Sequence[Any] = ()) -> SerdeType:
    """The serde type of a pydantic annotation. A SerdeType among its `Annotated` metadata
    states it outright (the width of an integer, a checked string, a field whose model is
    narrower than what serde accepts); otherwise str, bool, float, Literal (an enum of unit
    variants), list, a tuple of one type (an array), `X | None`, a model (a struct) and a
    union of tagged models (`tagged`) are read as serde derives them."""
    for item in metadata:
        if isinstance(item, SerdeType):
            return item
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return serde_type(args[0], [*metadata, *annotation.__metadata__])
    if annotation is str:
        return Str()
    if annotation is bool:
        return Bool()
    if annotation is float:
        return F64()
    if origin is Literal:
        return UnitEnum(*args)
    if origin is list:
        return Vec(serde_type(args[0]))
    if origin is tuple and len(set(args)) == 1:
        return Array(serde_type(args[0]), len(args))
    if origin in (Union, types.UnionType):
        present = [arg for arg in args if arg is not types.NoneType]
        if len(present) < len(args):
            return Option(serde_type(functools.reduce(operator.or_, present)))
        return tagged(*present)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return struct(annotation)
    raise TypeError(f"no serde type for {annotation!r}: annotate it with a SerdeType")


def struct(model: type[BaseModel], skip: str | None = None) -> Struct:
    """A model's fields, by their wire names, in declaration order (serde's for arrays)."""
    fields: dict[str, SerdeType] = {}
    for name, field in model.model_fields.items():
        if name == skip:
            continue
        kind = serde_type(field.annotation, field.metadata)
        if not field.is_required() and not isinstance(kind, Option):
            raise TypeError(f"{model.__name__}.{name}: only an Option may be left out in serde")
        fields[field.alias or name] = kind
    return Struct(fields)


def tagged(*models: type[BaseModel], index_tags: bool = True) -> Tagged:
    """An internally tagged enum of models whose first field is the tag, a Literal: each
    model a variant (its other fields the variant's struct), or, for a model with the tag
    alone, each of the Literal's names a unit variant."""
    variants: dict[str, Struct | None] = {}
    tags = set()
    for model in models:
        name, field = next(iter(model.model_fields.items()))
        tags.add(field.alias or name)
        names = get_args(field.annotation)
        if len(model.model_fields) == 1:
            variants.update(dict.fromkeys(names))
        else:
            (variant,) = names
            variants[variant] = struct(model, skip=name)
    (tag,) = tags
    return Tagged(tag, variants, index_tags)
