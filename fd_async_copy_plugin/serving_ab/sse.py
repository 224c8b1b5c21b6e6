"""Server-sent events: the ``data:`` payloads of a streaming OpenAI-compatible response.

Follows the event-stream rules that matter for OpenAI-style servers: an event ends at a blank line;
the ``data`` lines of one event are joined with newlines; one optional space after the colon is
dropped; lines starting with ``:`` are comments; lines end with ``\\n`` or ``\\r\\n``. The stream
ends at EOF or at the ``[DONE]`` sentinel.
"""

from __future__ import annotations

from typing import Callable, Iterator

DONE = "[DONE]"


def iter_sse_data(readline: Callable[[], bytes]) -> Iterator[str]:
    """Yield each event's data (``[DONE]`` excluded) from a ``readline`` callable."""
    data_lines: list[str] = []
    while True:
        raw = readline()
        if not raw:
            break
        line = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
        if line == "":
            if data_lines:
                data, data_lines = "\n".join(data_lines), []
                if data == DONE:
                    return
                yield data
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data_lines.append(value.removeprefix(" "))
    if data_lines:  # EOF without the closing blank line: the last event is still complete
        data = "\n".join(data_lines)
        if data != DONE:
            yield data
