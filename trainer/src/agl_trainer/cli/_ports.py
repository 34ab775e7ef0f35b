"""Whether a server command can listen where it was asked to, checked before it creates anything.

``agl store serve``, ``agl dashboard``, ``agl gateway serve`` and ``agl engine serve`` call
:func:`ensure_port_free` right after reading their flags, so that a port in use is one error
line, before a store file is created, a token made up or a model loaded.
"""

from __future__ import annotations

import errno
import socket

from agl.errors import ConfigError


def ensure_port_free(host: str, port: int, flag: str = "--port") -> None:
    """Bind ``host``:``port`` as uvicorn will (``SO_REUSEADDR``, IPv6 when ``host`` has a ``:``) and
    let it go; a ConfigError naming ``flag`` when that fails. Port 0 (any free port) always passes.

    The port is free again when this returns, so a process taking it in the instant before the
    server binds still meets the server's own error; this check is for the common case of a
    server already running there.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except socket.gaierror as exc:
            raise ConfigError(f"--host: cannot listen on {host!r}: {exc.strerror}") from None
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                why = "another process is listening there (stop it, or choose another port)"
            raise ConfigError(f"{flag} {port}: cannot listen on {host}:{port}: {why}") from None
