"""Logging: every line one JSON object (console lines on a terminal), the libraries' stdlib logging included."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

LEVELS = ("debug", "info", "warning", "error")


def configure(level: str = "info", *, json: bool | None = None, stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    if json is None:
        json = not out.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    stamped: list[structlog.typing.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *stamped, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # Libraries (APScheduler, asyncio, aiohttp) log through the standard library: render their records the same way,
    # with the logger's name, so a log pipeline never meets a plain-text line.
    handler = logging.StreamHandler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*stamped, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # The libraries' info lines (every job run) are noise but for debugging; their warnings are worth a line.
    wanted = getattr(logging, level.upper())
    root.setLevel(logging.INFO if wanted <= logging.DEBUG else max(logging.WARNING, wanted))
    # The fleet's one job runs four times a second: its "Running job" lines would drown a debugging session.
    logging.getLogger("apscheduler.executors").setLevel(logging.WARNING)
