"""Re-printing a child's bytes as whole UTF-8 lines (the worker drops non-UTF-8 output)."""

from __future__ import annotations

import os
import tempfile

from hypha.accelerate_executor.shim.line_writer import MAX_LINE_CHARS, LineWriter


def _through(*chunks: bytes) -> bytes:
    with tempfile.TemporaryFile() as file:
        writer = LineWriter(file.fileno())
        for chunk in chunks:
            writer.feed(chunk)
        writer.close()
        file.seek(0)
        return file.read()


def test_lines_are_joined_across_chunks() -> None:
    assert _through(b"one\ntw", b"o\nthr", b"ee\n") == b"one\ntwo\nthree\n"


def test_a_character_split_between_chunks_survives() -> None:
    euro = "€".encode()
    assert _through(b"price " + euro[:1], euro[1:] + b"\n") == "price €\n".encode()


def test_undecodable_bytes_become_replacement_characters() -> None:
    out = _through(b"bad \xff\xfe end\n", b"\xc3\n")
    assert out.decode("utf-8") == "bad \ufffd\ufffd end\n\ufffd\n"


def test_an_unterminated_last_line_is_terminated() -> None:
    assert _through(b"a\nlast") == b"a\nlast\n"


def test_a_line_without_end_is_written_once_it_is_long() -> None:
    long = b"x" * (MAX_LINE_CHARS + 10)
    assert _through(long, b"tail") == long + b"\ntail\n"


def test_a_reader_gone_is_not_an_error() -> None:
    read, write = os.pipe()
    os.close(read)
    writer = LineWriter(write)
    writer.feed(b"nobody reads this\n")
    writer.feed(b"nor this\n")
    assert writer.broken
    os.close(write)
