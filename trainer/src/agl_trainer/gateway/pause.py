"""Hold new requests while the engine swaps weights.

While paused, new requests wait at the gate (they are not refused); :meth:`PauseGate.pause`
returns once every request already past the gate has finished, so the caller can
swap weights knowing no request straddles two versions.
"""

from __future__ import annotations

import asyncio


class PauseGate:
    """Counts requests in flight and holds new ones while paused. Used on the event loop only."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.held = 0
        """Requests waiting at the gate now."""
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    async def enter(self) -> None:
        """Wait while paused, then count this request as in flight."""
        if not self._open.is_set():
            self.held += 1
            try:
                await self._open.wait()
            finally:
                self.held -= 1
        self.in_flight += 1
        self._idle.clear()

    def exit(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def pause(self, timeout_s: float | None = None) -> bool:
        """Hold new requests; return True once in-flight ones finished (False on timeout)."""
        self._open.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def resume(self) -> None:
        """Let held and new requests through."""
        self._open.set()
