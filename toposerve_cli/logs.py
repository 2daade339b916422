"""Structured logs: one JSON object a line on stderr, for every part, and for
the libraries under it (aiohttp, grpc, kubernetes) too: their records go
through the same renderer, a traceback as one escaped field."""

from __future__ import annotations

import logging
import sys

import structlog
from aiohttp.http_exceptions import HttpProcessingError, InvalidHeader, LineTooLong

# ours and the libraries' records: stamped alike first, rendered alike last
_STAMP: list[structlog.types.Processor] = [
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]
_RENDER: list[structlog.types.Processor] = [
    structlog.processors.format_exc_info,
    structlog.processors.EventRenamer("msg"),
    structlog.processors.JSONRenderer(),
]


class ClientProtocolErrors(logging.Filter):
    """aiohttp logs a client's malformed HTTP (an HTTP/2 preface sent to an
    HTTP/1 port, a header line over the limit) with a full traceback at
    ERROR. The client got its 400; for us it is one warning line, so a
    stream of bad clients cannot flood the logs with tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = f"malformed HTTP: {record.getMessage()}", ()
            record.exc_info, record.exc_text = None, None
            record.__dict__["status"] = exc.code
            # a header line may carry a credential: of those, only the kind is logged
            record.__dict__["error"] = (
                f"{type(exc).__name__}: a header or request line not shown"
                if isinstance(exc, LineTooLong | InvalidHeader)
                else exc.message.strip().splitlines()[0] if exc.message else "")
        return True


class _CurrentStderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging
    was configured: a process that configures logs in-process (tests calling
    ``main``) would otherwise keep writing to a stream since closed."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(level: str = "info") -> None:
    lvl = logging.getLevelName(level.upper())
    stderr = _CurrentStderr()
    handler = logging.StreamHandler(stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_STAMP, structlog.stdlib.add_logger_name,
                           structlog.stdlib.ExtraAdder(("status", "error"))],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *_RENDER]))
    handler.addFilter(ClientProtocolErrors())
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, "toposerve", False)]:
        root.removeHandler(h)  # configured before, in this process
    handler.toposerve = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(lvl)
    structlog.configure(
        processors=[*_STAMP, *_RENDER],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(stderr),  # type: ignore[arg-type]
    )
