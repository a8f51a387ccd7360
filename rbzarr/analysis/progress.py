"""Progress on stderr: a bar on a terminal, a plain line every few seconds in a pipe or log."""

from __future__ import annotations

import io
import sys
from typing import TextIO

from tqdm import tqdm

__all__ = ["LINE_INTERVAL_S", "progress_bar"]

# Away from a terminal, a line this often (seconds), the first once a run lasts as long.
LINE_INTERVAL_S = 10.0


class _Lines(io.TextIOBase):
    """A stream for tqdm that writes each refresh as a line of its own (no carriage return)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` as one line, the carriage returns and blanks tqdm adds left out."""
        line = text.replace("\r", "").strip()
        if line:
            self._stream.write(line + "\n")
            self._stream.flush()
        return len(text)

    def flush(self) -> None:
        """Flush the stream below."""
        self._stream.flush()


def progress_bar(
    total: int, desc: str, progress: bool, unit: str = "traj", interval: float = LINE_INTERVAL_S
) -> tqdm:
    """A tqdm bar on stderr: drawn on a terminal; elsewhere (a pipe, a log file) a line every
    ``interval`` seconds once the run lasts that long; disabled without ``progress``."""
    if not progress:
        return tqdm(total=total, desc=desc, unit=unit, disable=True)
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit=unit)
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=_Lines(sys.stderr),
        mininterval=interval,
        delay=interval,
        ascii=True,
        ncols=80,
    )
