"""The plugin registry: one pluggy manager for the process, loaded on first use."""

from __future__ import annotations

import inspect
import threading
from typing import Any

import pluggy

from agl import hookspecs
from agl.errors import ConfigError

ENTRY_POINT_GROUP = "agl"

_manager: pluggy.PluginManager | None = None
_lock = threading.Lock()

_BUILTINS = ("agl.credit",)


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager with built-in and installed plugins loaded."""
    global _manager
    with _lock:
        if _manager is None:
            pm = pluggy.PluginManager("agl")
            pm.add_hookspecs(hookspecs)
            for module_name in _BUILTINS:
                module = __import__(module_name, fromlist=["_"])
                pm.register(module, name=module_name)
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
            for plugin in pm.get_plugins():
                _check_sync(plugin)
            _manager = pm
        return _manager


def _check_sync(plugin: Any) -> None:
    for name in dir(plugin):
        if name.startswith("agl_") and inspect.iscoroutinefunction(getattr(plugin, name, None)):
            raise ConfigError(f"plugin {plugin!r}: hook {name} is async; agl hooks must be plain functions")


def register(plugin: Any, name: str | None = None) -> str:
    """Register a plugin object or module in code; returns its name."""
    _check_sync(plugin)
    pm = get_plugin_manager()
    return pm.register(plugin, name=name)


def unregister(plugin: Any = None, name: str | None = None) -> None:
    """Remove a plugin registered with :func:`register`."""
    get_plugin_manager().unregister(plugin=plugin, name=name)


def hook() -> Any:
    """The hook relay: ``hook().agl_reward(rollout=...)``."""
    return get_plugin_manager().hook


def list_plugins() -> list[dict[str, Any]]:
    """What is installed: each plugin's name, distribution and what it provides."""
    pm = get_plugin_manager()
    dists = {id(p): d for p, d in pm.list_plugin_distinfo()}
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        dist = dists.get(id(plugin))
        provides = getattr(plugin, "agl_list_components", lambda: None)() or {}
        hooks = sorted(h.name for h in (pm.get_hookcallers(plugin) or []))
        rows.append(
            {
                "name": name,
                "distribution": f"{dist.project_name} {dist.version}" if dist else "(registered in code)" if name not in _BUILTINS else "agl-core (built in)",
                "hooks": hooks,
                "provides": provides,
            }
        )
    return rows


def resolve(kind: str, name: str, config: dict | None = None) -> Any:
    """Find the component ``name`` of ``kind`` (credit_assignment, backend, engine) or fail clearly."""
    caller = getattr(hook(), f"agl_{kind}")
    found = caller(name=name) if kind == "credit_assignment" else caller(name=name, config=config or {})
    if found is None:
        known = sorted({n for row in list_plugins() for n in row["provides"].get(_PLURAL[kind], [])})
        raise ConfigError(f"{kind.replace('_', ' ')}: no plugin provides {name!r} (installed: {', '.join(known) or 'none'})")
    return found


_PLURAL = {"credit_assignment": "credit_assignments", "backend": "backends", "engine": "engines"}
