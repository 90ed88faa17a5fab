"""What a ``SandboxPool`` removes: sandboxes that dead runs on this host left behind (at start), and
all of its own at close.

``close()`` lets the deletes already under way finish (a replacement removes its sandbox from the
pool before the delete is sent, so cancelling it would leak the sandbox), destroys the members,
sweeps by the run's tags, and reports whatever is still alive. It runs on the pool's loop thread;
``SandboxPool`` (``pool/sandbox_pool.py``) mixes it in with ``PoolHealing`` (``pool/heal.py``), whose
``_destroy`` it uses.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("trl_sandbox.pool.sandbox_pool")


class PoolClosing:
    """Mixin for ``SandboxPool``; it relies on the attributes ``SandboxPool.__init__`` sets."""

    settings: Any
    provider: Any
    spec: Any

    async def _reap_stale(self) -> None:
        """Destroy sandboxes that a dead process on this host left behind (e.g. a SIGKILLed run)."""
        from trl_sandbox.pool.tags import HOST_TAG, MANAGED_TAG, owner_is_dead

        host = self.spec.tags.get(HOST_TAG)
        if not host:
            return
        try:
            found = await asyncio.wait_for(
                self.provider.list({MANAGED_TAG: "1", HOST_TAG: host}), self.settings.destroy_timeout_s
            )
            stale = [info for info in found if owner_is_dead(info.tags, host)]
            await asyncio.gather(
                *(asyncio.wait_for(self.provider.destroy(i.id), self.settings.destroy_timeout_s) for i in stale),
                return_exceptions=True,
            )
            self._count("reaped", len(stale))
            if stale:
                log.warning("removed %d sandbox(es) left by dead runs on this host", len(stale))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.info("could not look for stale sandboxes: %r", exc)

    async def _aclose(self) -> None:
        current = asyncio.current_task()
        # Deletes and creates already sent finish first, for up to destroy_timeout_s (a create
        # cancelled client-side may still be made server-side, after the sweep; one that finishes
        # now is destroyed by _adopt); everything else (backoff, resets, health loop) is cancelled.
        in_flight = (self._deleting | self._creating) - {current}
        for task in list(self._tasks):
            if task is not current and task not in in_flight:
                task.cancel()
        if in_flight:
            await asyncio.wait(in_flight, timeout=self.settings.destroy_timeout_s + 1)
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        await asyncio.gather(*[t for t in self._tasks if t is not current], return_exceptions=True)
        # Members and sandboxes whose delete failed or was cut short: a second delete of one
        # already gone is quiet (a provider contract), a missed one would live on.
        doomed = {**self._dropping, **self._members}
        self._members.clear()
        self._dropping.clear()
        await asyncio.gather(*(self._destroy(s) for s in doomed.values()), return_exceptions=True)
        await self._sweep()
        if getattr(self, "shares_provider", False):  # an image pool (environment_pools.py)
            return
        try:
            await asyncio.wait_for(self.provider.aclose(), self.settings.destroy_timeout_s)
        except BaseException as exc:
            log.warning("closing the sandbox provider failed: %r", exc)

    async def _sweep(self) -> None:
        """Delete what the run's tags still find (creates that timed out after the provider made
        the sandbox), then look once more and report what could not be removed."""
        from trl_sandbox.pool.tags import RUN_TAG

        if RUN_TAG not in self.spec.tags:
            return  # without a run id a sweep could hit another run's sandboxes
        wait = self.settings.destroy_timeout_s
        try:
            found = await asyncio.wait_for(self.provider.list(self.spec.tags), wait)
            await asyncio.gather(
                *(asyncio.wait_for(self.provider.destroy(info.id), wait) for info in found), return_exceptions=True
            )
            self._count("swept", len(found))
            left = [info.id for info in await asyncio.wait_for(self.provider.list(self.spec.tags), wait)]
        except BaseException as exc:
            log.warning("final sweep of sandboxes by tags failed: %r", exc)
            return
        self.leftovers = left
        if left:
            log.warning("%d sandbox(es) of this run could not be removed and may still cost money: %s",
                        len(left), ", ".join(left[:20]))
