"""Prepared environments in the pool: building them through the provider, and the pools of
sandboxes made from a prepared image.

Where a provider gives a lease its copy of a prepared environment inside any of its sandboxes (the
local provider's overlay), the pool's own sandboxes serve every row. Where the prepared state is
an image the sandbox must be created from (a remote snapshot, a root filesystem), ``Prepared.image``
names it and the leases of that environment come from a pool of its own, made on first use with
the parent's provider, size, settings and tags, and closed with it. At most ``MAX_IMAGE_POOLS``
such pools are kept; past that, the least recently used one that holds no lease is closed (its
sandboxes deleted).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from trl_sandbox.environments.builds import Prepared
from trl_sandbox.environments.spec import EnvironmentSpec
from trl_sandbox.sandbox import ConfigError

MAX_IMAGE_POOLS = 2


class EnvironmentPools:
    """The prepared-environment part of ``SandboxPool`` (a mixin: it uses the pool's fields)."""

    provider: Any
    spec: Any
    size: int
    settings: Any
    made_by: str

    _by_image: OrderedDict[str, Any]  # image -> its pool, least recently used first
    _by_image_lock: threading.Lock

    async def prepare_environment(self, spec: EnvironmentSpec) -> Prepared:
        """Build ``spec`` once (or find it built) with this pool's provider; a lease then gets its
        own copy with ``sandbox.use_environment``. ``ConfigError`` when the provider cannot."""
        prepare = getattr(self.provider, "prepare_environment", None)
        if prepare is None:
            raise ConfigError(f"the {getattr(self.provider, 'name', '?')!r} provider cannot prepare environments "
                              "(rows with an 'environment' column); use the local or ray provider")
        return await prepare(spec)

    def environment_metrics(self) -> dict[str, float]:
        """Per-step counters of prepared environments (builds, build seconds, hit rate, lease ms)."""
        metrics = getattr(self.provider, "environment_metrics", None)
        if callable(metrics):
            return metrics()
        builds = getattr(getattr(self.provider, "environments", None), "builds", None)
        return builds.drain().metrics() if builds is not None else {}

    def image_pool(self, prepared: Prepared | None) -> Any:
        """The pool whose sandboxes are made from ``prepared.image`` (``None``: this pool serves it)."""
        image = getattr(prepared, "image", None)
        if not image or getattr(self.spec, "image", None) == image:  # none, or this pool is that image's
            return None
        pools = self._by_image
        with self._by_image_lock:
            child = pools.get(image)
            if child is None:
                child = type(self)(self.provider, spec=replace(self.spec, image=image), size=self.size,
                                    settings=self.settings, made_by=self.made_by)
                child.shares_provider = True  # closing it deletes its sandboxes, not the parent's provider
                pools[image] = child
                idle = [k for k, p in pools.items() if k != image and p.leased == 0]
                while len(pools) > MAX_IMAGE_POOLS and idle:
                    pools.pop(idle.pop(0)).close()
            pools.move_to_end(image)
        child.start(wait=False)
        return child

    def owner_of(self, sandbox_id: str) -> Any:
        """The image pool a sandbox belongs to, if any."""
        with self._by_image_lock:
            children = list(self._by_image.values())
        for child in children:
            if sandbox_id in child._members:
                return child
        return None

    def close_image_pools(self) -> None:
        with self._by_image_lock:
            children = list(self._by_image.values())
            self._by_image.clear()
        for child in children:
            child.close()
