"""`herdfence export` lives with the history reader."""
from api.history import main

__all__ = ["main"]
