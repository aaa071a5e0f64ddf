"""Uniform 4xx errors: `detail` always names the problem."""
from __future__ import annotations

from fastapi import HTTPException


def unprocessable(detail: str) -> HTTPException:
    return HTTPException(422, detail)


def not_found(what: str) -> HTTPException:
    # Another farm's object and a missing one answer alike: existence never leaks.
    return HTTPException(404, f"{what} not found")
