"""The plugin manager: loads entry points of the ``trl_sandbox`` group and collects registrations."""

from __future__ import annotations

import functools
import importlib.metadata
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pluggy

from trl_sandbox.plugins import hookspecs
from trl_sandbox.sandbox import ConfigError

ENTRY_POINT_GROUP = "trl_sandbox"


@dataclass(frozen=True)
class Registration:
    """One registered provider or task set, and the plugin it came from."""

    name: str
    obj: Any
    plugin: str
    distribution: str


@functools.lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    # Entry points are loaded one at a time so that one broken plugin names itself instead of
    # taking every other plugin down with it.
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if pm.has_plugin(ep.name):
            continue
        try:
            module = ep.load()
        except Exception as exc:  # a broken third-party plugin must not break the core
            import warnings

            warnings.warn(f"trl-sandbox plugin {ep.name!r} ({ep.value}) failed to load: {exc}", stacklevel=2)
            continue
        pm.register(module, name=ep.name)
        dist = ep.dist.name if ep.dist is not None else "?"
        _PLUGIN_DISTRIBUTIONS[ep.name] = dist
    return pm


_PLUGIN_DISTRIBUTIONS: dict[str, str] = {}


# Registrations per plugin manager: the hooks run once, not for every dataset row a reward
# resolves; a new plugin manager (``plugin_manager.cache_clear()``) collects afresh.
_REGISTRATIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _collect(hook_name: str) -> dict[str, Registration]:
    pm = plugin_manager()
    cached = _REGISTRATIONS.setdefault(pm, {})
    if hook_name not in cached:
        cached[hook_name] = _run_registration_hook(pm, hook_name)
    return dict(cached[hook_name])


def _run_registration_hook(pm: pluggy.PluginManager, hook_name: str) -> dict[str, Registration]:
    found: dict[str, Registration] = {}
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        plugin_name = impl.plugin_name

        def register(name: str, obj: Any, _plugin: str = plugin_name) -> None:
            if name in found and found[name].plugin != _plugin:
                raise ConfigError(
                    f"{name!r} is registered twice: by plugin {found[name].plugin!r} and by {_plugin!r}; "
                    "uninstall one of them"
                )
            found[name] = Registration(name, obj, _plugin, _PLUGIN_DISTRIBUTIONS.get(_plugin, "?"))

        impl.function(register=register)
    return found


def providers() -> dict[str, Registration]:
    """Every registered provider factory, by name."""
    return _collect("trl_sandbox_register_providers")


def task_sets() -> dict[str, Registration]:
    """Every registered task set, by name."""
    return _collect("trl_sandbox_register_tasks")


# The plugins this project publishes, by the names they register: the only packages an error may
# suggest installing (a guess such as "trl-sandbox-<typo>" would invite a look-alike package).
PUBLISHED = {
    "sandbox provider": {"daytona": "trl-sandbox-daytona", "coreweave": "trl-sandbox-coreweave",
                         "aviato": "trl-sandbox-coreweave", "e2b": "trl-sandbox-e2b", "modal": "trl-sandbox-modal"},
    "task set": {"humaneval": "trl-sandbox-humaneval"},
}


def _lookup(kind: str, found: dict[str, Registration], name: str) -> Any:
    if name not in found:
        import difflib

        known = ", ".join(sorted(found)) or "none"
        if name in PUBLISHED[kind]:  # ours, just not installed: no "did you mean" the same name
            raise ConfigError(f"{kind} {name!r} is not installed: it comes with `pip install "
                              f"{PUBLISHED[kind][name]}`. Installed {kind}s: {known}.")
        message = f"unknown {kind} {name!r};"
        close = difflib.get_close_matches(str(name), sorted(set(found) | set(PUBLISHED[kind])), n=1, cutoff=0.6)
        if close:
            message += f" did you mean {close[0]!r}?"
        message += f" Installed {kind}s: {known}."
        package = PUBLISHED[kind].get(close[0] if close else name)
        if package and (close[0] if close else name) not in found:
            message += f" {close[0] if close else name!r} comes with `pip install {package}`."
        elif not close:
            message += " `trl-sandbox plugins` lists what is loaded; a third-party plugin is installed with pip."
        raise ConfigError(message)
    return found[name].obj


def make_provider(name: str, settings: dict[str, Any] | None = None) -> Any:
    """Build a provider by name; unknown names raise ``ConfigError`` listing what is installed."""
    factory: Callable[..., Any] = _lookup("sandbox provider", providers(), name)
    try:
        return factory(**(settings or {}))
    except TypeError as exc:
        raise ConfigError(f"bad settings for sandbox provider {name!r}: {exc}") from exc


def get_task_set(name: str) -> Any:
    """A registered task set by name; unknown names raise ``ConfigError`` listing what is installed."""
    return _lookup("task set", task_sets(), name)


def run_tags(run: Any) -> dict[str, str]:
    """Merge every plugin's ``trl_sandbox_run_tags``; later plugins override earlier keys."""
    merged: dict[str, str] = {}
    for result in reversed(plugin_manager().hook.trl_sandbox_run_tags(run=run)):
        if result:
            merged.update({str(k): str(v) for k, v in result.items()})
    return merged


def loaded_plugins() -> list[tuple[str, str, list[str]]]:
    """(plugin name, distribution, hooks it implements) for ``trl-sandbox plugins``."""
    pm = plugin_manager()
    rows = []
    for name, plugin in pm.list_name_plugin():
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        rows.append((name, _PLUGIN_DISTRIBUTIONS.get(name, "?"), hooks))
    return sorted(rows)
