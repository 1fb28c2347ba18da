"""Re-printing a child's byte stream line by line, as UTF-8 the worker can read.

The worker stops reading the child's stdout at the first line that is not UTF-8, so
undecodable bytes become U+FFFD; it may lose lines still buffered when the child exits, so
each line goes out with one unbuffered write. Writing to the file descriptor directly also
keeps a daemon thread from holding the interpreter's stdout lock at exit.
"""

from __future__ import annotations

import codecs
import os

# A child that never writes a newline (a progress bar on '\r') still gets its output out.
MAX_LINE_CHARS = 64 * 1024


class LineWriter:
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        # Set when the reader went away: output is then dropped, the child keeps running.
        self.broken = False

    def feed(self, data: bytes) -> None:
        *lines, self._pending = (self._pending + self._decoder.decode(data)).split("\n")
        for line in lines:
            self._emit(line)
        if len(self._pending) > MAX_LINE_CHARS:
            self._emit(self._pending)
            self._pending = ""

    def close(self) -> None:
        """Writes what is left of an unterminated last line."""
        rest = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        if rest:
            self._emit(rest)

    def _emit(self, line: str) -> None:
        if self.broken:
            return
        data = (line + "\n").encode("utf-8")
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except BrokenPipeError:
            self.broken = True
