"""Errors of the client layer."""

from __future__ import annotations


class ApiError(Exception):
    """An apiserver answer other than success (``status`` 0: no answer at all)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
