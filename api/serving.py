"""How uvicorn serves the API: an HTTP protocol that turns Nagle's algorithm off on every connection.

With `--workers N` uvicorn binds the listening socket itself as `socket.socket(family)` (proto 0), and
asyncio only sets TCP_NODELAY on sockets whose proto is IPPROTO_TCP. Without it, a keep-alive client
(wrk, a browser, an HTTP pool) waits for the delayed ACK — about 40 ms — between the response's header
and body writes: every request after the first on a connection took 44 ms. Run with
`uvicorn api.app:app --http api.serving:NoDelayHTTP`.
"""
from __future__ import annotations

import socket

try:  # the C parser when installed (it is pinned in requirements.lock), else the pure-Python one
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover - httptools missing
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base


class NoDelayHTTP(_Base):
    def connection_made(self, transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - a socket closed under us
                pass
        super().connection_made(transport)


def die_with_master() -> None:
    """In a uvicorn worker: be killed when the master process dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG), so an orphaned worker never keeps the API port. The master itself has no
    multiprocessing parent and is left alone (its parent, `herdfence up --detach`, exits on purpose)."""
    import ctypes
    import multiprocessing
    import os
    import signal
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)          # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):          # pragma: no cover - not Linux
        return
    if os.getppid() != parent.pid:             # the master died before the prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
