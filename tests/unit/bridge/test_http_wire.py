"""The HTTP/1.1 response reader the statuses use, fed byte by byte as a socket may give it."""

from __future__ import annotations

import pytest

from hypha.accelerate_executor.bridge.http_wire import Response, ResponseReader, post_request

CONTINUE = b'{"type": "Continue"}'


def read_in_pieces(raw: bytes, piece: int, ended: bool = False) -> Response | None:
    """Feeds `raw` `piece` bytes at a time (then the connection's end, if `ended`); the
    response must be whole only once its last byte is in."""
    reader = ResponseReader()
    pieces = [raw[at : at + piece] for at in range(0, len(raw), piece)]
    for number, data in enumerate(pieces, 1):
        response = reader.feed(data)
        if number < len(pieces) or ended:
            assert response is None, (number, data)
    return reader.feed(b"") if ended else response


@pytest.mark.parametrize("piece", [1, 7, 1000])
def test_a_body_framed_by_content_length(piece: int) -> None:
    raw = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 20\r\n\r\n"
    assert read_in_pieces(raw + CONTINUE, piece) == Response(200, CONTINUE, keep_alive=True)


@pytest.mark.parametrize("piece", [1, 5, 1000])
def test_a_chunked_body_with_extensions_and_trailers(piece: int) -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"8;note=1\r\n" + CONTINUE[:8] + b"\r\nc\r\n" + CONTINUE[8:] + b"\r\n"
        b"0\r\nX-Trailer: 1\r\n\r\n"
    )
    assert read_in_pieces(raw, piece) == Response(200, CONTINUE, keep_alive=True)


def test_a_chunked_body_without_trailers() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n14\r\n" + CONTINUE + b"\r\n0\r\n\r\n"
    )
    assert read_in_pieces(raw, 3) == Response(200, CONTINUE, keep_alive=True)


def test_a_body_read_to_the_connections_end_leaves_it_spent() -> None:
    raw = b"HTTP/1.1 200 OK\r\n\r\n" + CONTINUE
    assert read_in_pieces(raw, 4, ended=True) == Response(200, CONTINUE, keep_alive=False)


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n", False),
        (b"HTTP/1.0 200 OK\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\n", True),
    ],
)
def test_whether_the_connection_carries_another_request(head: bytes, keep_alive: bool) -> None:
    raw = head + b"Content-Length: 20\r\n\r\n" + CONTINUE
    assert read_in_pieces(raw, 1000) == Response(200, CONTINUE, keep_alive)


def test_an_interim_answer_is_passed_over() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n" + CONTINUE
    assert read_in_pieces(raw, 2) == Response(200, CONTINUE, keep_alive=True)


def test_an_error_status_keeps_its_body() -> None:
    raw = b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: 5\r\n\r\noops!"
    assert read_in_pieces(raw, 1000) == Response(422, b"oops!", keep_alive=True)


@pytest.mark.parametrize(
    "raw",
    [
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: twenty\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_what_is_not_an_http_response_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        ResponseReader().feed(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"HTTP/1.1 200 OK\r\nContent-Len",
        b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n" + CONTINUE[:10],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n14\r\n" + CONTINUE,
    ],
)
def test_a_connection_that_ends_before_its_response_does(raw: bytes) -> None:
    reader = ResponseReader()
    if raw:
        assert reader.feed(raw) is None
    with pytest.raises(ConnectionError):
        reader.feed(b"")


def test_the_request_is_a_whole_http_post() -> None:
    assert post_request("/status/send", b'{"a": 1}') == (
        b"POST /status/send HTTP/1.1\r\nHost: hypha\r\nContent-Type: application/json\r\n"
        b"Content-Length: 8\r\n\r\n"
        b'{"a": 1}'
    )
