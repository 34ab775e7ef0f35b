"""The plugin registry: one pluggy manager for the process, loaded on first use.

Built-in plugins (agl-core's store schemes; agl's own packages add theirs with
:func:`add_builtin`: agl-trainer's credit strategies and loggers) always load.
Installed plugins come from the ``agl`` entry-point group; ``AGL_LOAD_PLUGINS``
limits which: a comma-separated list of entry-point names loads only those, an
empty string loads none, and unset loads all. Every plugin is checked when it is
registered: an ``agl_*`` function that matches no hook of :mod:`agl.hookspecs`,
an implementation whose arguments the hook does not have, an ``async def`` one,
or a provider hook (``agl_register_*``) that registers a bad name or factory is a
:class:`~agl.errors.ConfigError` naming the plugin and the hook.

What plugins provide (backends, engines, credit strategies, store schemes, loggers,
commands) is described by :mod:`agl.providers`; :func:`registrations` collects it from
the provider hooks and :func:`resolve` finds one of them.
"""

from __future__ import annotations

import difflib
import inspect
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import pluggy

from agl import hookspecs, providers
from agl.env import LOAD_PLUGINS
from agl.errors import ConfigError
from agl.providers import ENTRY_POINT_GROUP, Provided, Registrations, kind_of, not_provided

__all__ = [
    "ENTRY_POINT_GROUP",
    "RewardAnswer",
    "add_builtin",
    "builtin_modules",
    "find",
    "fixed_builtins",
    "get_plugin_manager",
    "hook",
    "list_plugins",
    "load_plugin",
    "names",
    "register",
    "registrations",
    "resolve",
    "unregister",
]

_manager: pluggy.PluginManager | None = None
_lock = threading.RLock()  # re-entered when loading a plugin imports agl-trainer, which adds its built-ins

_BUILTINS: list[str] = ["agl.store.schemes"]
"""Modules of agl's own packages that are always registered, whatever ``AGL_LOAD_PLUGINS`` says."""
_HOOKS = frozenset(name for name in dir(hookspecs) if name.startswith("agl_"))


class RewardAnswer(NamedTuple):
    """One plugin's answer to ``agl_reward``, as the relay returns it (and an ``agl_reward`` wrapper sees it)."""

    plugin: str
    """The name of the plugin that answered: the ``source`` of the rewards stored from it."""
    value: float | Mapping[str, float] | None
    """What the plugin returned (None where it raised)."""
    error: Exception | None = None
    """What the plugin raised, if it did; such an answer is counted, logged and gives no reward."""


_ISOLATED: dict[str, Callable[[str, Callable[..., Any]], Callable[..., Any]]] = {}
"""Hooks whose implementations answer for themselves: each is wrapped, when registered, by the function here."""


def _answer_for(plugin_name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (an ``agl_reward`` implementation) made to return a :class:`RewardAnswer` and never raise.

    One failing plugin then costs only its own answer: pluggy stops a hook call at
    the first exception, and the answers carry the name their rewards are stored under.
    """

    def answer(*args: Any, **kwargs: Any) -> RewardAnswer | None:
        try:
            value = function(*args, **kwargs)
        except Exception as exc:
            return RewardAnswer(plugin_name, None, exc)
        return None if value is None else RewardAnswer(plugin_name, value)

    answer.__wrapped__ = function  # type: ignore[attr-defined]
    return answer


_ISOLATED["agl_reward"] = _answer_for
for _hook in providers.HOOKS:
    _ISOLATED[_hook] = providers.bind_register


class _Manager(pluggy.PluginManager):
    """pluggy's manager, with agl's rules for what a plugin may hold."""

    def parse_hookimpl_opts(self, plugin: object, name: str) -> pluggy.HookimplOpts | None:
        """As pluggy, and like pytest: a function named ``agl_*`` is a hook implementation even unmarked.

        So a misspelled or unmarked hook is refused at registration instead of being silently ignored.
        """
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("agl_") and inspect.isroutine(inspect.getattr_static(plugin, name, None)):
            opts = {}  # type: ignore[typeddict-item]  # pluggy fills in the defaults
        return opts

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register ``plugin``; an ``async def`` hook or one that does not match its spec is a ConfigError."""
        _check_sync(plugin, name)
        try:
            registered = super().register(plugin, name)
        except pluggy.PluginValidationError as exc:
            raise _refused(name or self.get_canonical_name(plugin), exc) from exc
        if registered is not None:
            self._isolate(plugin, registered)
            try:
                self._check_provides(plugin, registered)
            except ConfigError:
                self.unregister(plugin)
                raise
        return registered

    def _isolate(self, plugin: object, plugin_name: str) -> None:
        for caller in self.get_hookcallers(plugin) or []:
            wrap = _ISOLATED.get(caller.name)
            if wrap is None:
                continue
            provider = caller.name in providers.HOOKS  # a provider's wrapper registers too, so it is bound as well
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin and (provider or not (impl.wrapper or impl.hookwrapper)):
                    impl.function = wrap(plugin_name, impl.function)  # type: ignore[misc]

    def _check_provides(self, plugin: object, plugin_name: str) -> None:
        """Call ``plugin``'s provider hooks alone, so that a bad registration is refused now, naming it."""
        others = [p for p in self.get_plugins() if p is not plugin]
        for caller in self.get_hookcallers(plugin) or []:
            kind = providers.HOOKS.get(caller.name)
            if kind is not None:
                found = Registrations(kind, fixed_builtins(kind.name))
                self.subset_hook_caller(caller.name, remove_plugins=others)(register=found)


def _refused(name: str, exc: pluggy.PluginValidationError) -> ConfigError:
    """pluggy's refusal of a hook implementation, on one line, naming the plugin and the hook."""
    first, *rest = str(exc).splitlines()
    hook = re.search(r"for hook '(\w+)'", first)
    where = f"plugin {name!r}, hook {hook.group(1)!r}" if hook else f"plugin {name!r}"
    return ConfigError(f"{where}: {'; '.join(rest) or first}")


def _check_sync(plugin: Any, name: str | None) -> None:
    for attr in dir(plugin):
        if attr.startswith("agl_") and inspect.iscoroutinefunction(getattr(plugin, attr, None)):
            raise ConfigError(f"plugin {name or plugin!r}: hook {attr} is async; agl hooks must be plain functions")


def _check_pending(pm: pluggy.PluginManager) -> None:
    """pluggy's ``check_pending``, its error turned into a ConfigError naming the plugin and the hook.

    The offending plugin is unregistered first, so the manager is left as it was.
    """
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        plugin = exc.plugin
        name = pm.get_name(plugin) or repr(plugin)
        unknown = sorted(
            hook
            for hook, caller in vars(pm.hook).items()
            if not hook.startswith("_")
            and not caller.has_spec()
            and any(i.plugin is plugin for i in caller.get_hookimpls())
        )
        pm.unregister(plugin)
        raise ConfigError(f"plugin {name!r}: {'; '.join(_unknown_hook(h) for h in unknown)}") from exc


def _unknown_hook(hook: str) -> str:
    close = difflib.get_close_matches(hook, _HOOKS, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"agl's hooks are {', '.join(sorted(_HOOKS))}"
    return f"unknown hook {hook!r} ({hint})"


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    """Load the ``agl`` entry points that ``AGL_LOAD_PLUGINS`` allows (all where it is unset)."""
    wanted = LOAD_PLUGINS.get()
    installed = _installed()
    names = installed if wanted is None else [n for n in (n.strip() for n in wanted.split(",")) if n]
    for name in names:
        if name not in installed:
            known = ", ".join(installed) or "none"
            raise ConfigError(f"{LOAD_PLUGINS}: no installed plugin named {name!r} (installed: {known})")
        if not pm.has_plugin(name):
            _load_entry_point(pm, name)


def _load_entry_point(pm: pluggy.PluginManager, name: str) -> None:
    try:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
    except ImportError as exc:
        raise ConfigError(
            f"plugin {name!r} failed to import: {type(exc).__name__}: {exc} "
            f"(leave it out with {LOAD_PLUGINS}=<the plugins to load, comma-separated>)"
        ) from exc


def _installed() -> list[str]:
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager with built-in and installed plugins loaded."""
    global _manager
    with _lock:
        if _manager is None:
            pm = _Manager("agl")
            pm.add_hookspecs(hookspecs)
            _register_builtins(pm)
            _load_entry_points(pm)
            _register_builtins(pm)  # those added while the entry points loaded (a plugin that imports agl-trainer)
            _check_pending(pm)
            _manager = pm
        return _manager


def _register_builtins(pm: pluggy.PluginManager) -> None:
    for module_name in list(_BUILTINS):
        if not pm.has_plugin(module_name):
            pm.register(__import__(module_name, fromlist=["_"]), name=module_name)


def builtin_modules() -> list[str]:
    """The modules registered as built-in plugins, in the order they were added."""
    return list(_BUILTINS)  # no lock: the registry asks while it is being made, holding it


def add_builtin(module_name: str) -> None:
    """Make the module ``module_name`` a built-in plugin: registered now if the registry exists, else when it is made.

    For agl's own packages (agl-trainer adds its credit strategies and loggers when it is imported);
    a user's plugin is registered with :func:`register` or by entry point instead.
    """
    with _lock:
        if module_name in _BUILTINS:
            return
        _BUILTINS.append(module_name)
        pm = _manager
    if pm is not None and not pm.has_plugin(module_name):
        register(__import__(module_name, fromlist=["_"]), name=module_name)


def register(plugin: Any, name: str | None = None) -> str:
    """Register a plugin object or module in code; returns its name.

    Raises :class:`~agl.errors.ConfigError` naming the plugin and the hook where a
    hook is unknown, async, or takes an argument its spec does not have.
    """
    pm = get_plugin_manager()
    registered = pm.register(plugin, name=name)
    if registered is None:
        raise ConfigError(f"plugin {name!r}: that name is blocked")
    _check_pending(pm)
    return registered


def load_plugin(spec: str, what: str = "plugin") -> str:
    """Register the plugin ``spec`` names, as ``pytest -p`` does; return its registered name.

    ``spec`` is a module (``my_rewards``, ``path/to/rewards.py``) whose functions carry
    ``@agl.hookimpl``, or ``module:attribute`` for an object in one (a class is
    instantiated with no arguments). It is registered under the name ``spec``; a spec
    registered already is left as it is, so loading twice is harmless. Errors name ``what``.
    """
    from agl.imports import import_attribute, import_module

    if get_plugin_manager().get_plugin(spec) is not None:
        return spec
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise ConfigError(f"{what}: expected 'module' or 'module:attribute', got {spec!r}")
    plugin: Any = import_module(module_name, what)
    if attr:
        plugin = import_attribute(plugin, attr, what)
        if inspect.isclass(plugin):
            plugin = plugin()
    return register(plugin, name=spec)


def unregister(plugin: Any = None, name: str | None = None) -> None:
    """Remove a plugin registered with :func:`register`."""
    get_plugin_manager().unregister(plugin=plugin, name=name)


def hook() -> Any:
    """The hook relay: ``hook().agl_reward(rollout=...)``."""
    return get_plugin_manager().hook


def list_plugins() -> list[dict[str, Any]]:
    """What is loaded: each plugin's name, distribution, hooks and what it provides.

    ``provides`` maps a kind (``backends``, ``engines``, ``credit_assignments``,
    ``store_schemes``, ``loggers``, ``commands``) to the names the plugin registered;
    a name another plugin gives first in call order is marked ``(overridden by 'p')``.
    """
    pm = get_plugin_manager()
    dists = {id(p): d for p, d in pm.list_plugin_distinfo()}
    provides = _provides_by_plugin()
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        rows.append(
            {
                "name": name,
                "distribution": _distribution(name, dists.get(id(plugin))),
                "hooks": sorted(h.name for h in (pm.get_hookcallers(plugin) or [])),
                "provides": provides.get(name, {}),
            }
        )
    return rows


def _distribution(name: str, dist: Any) -> str:
    if dist is not None:
        return f"{dist.project_name} {dist.version}"
    return "built in" if name in _BUILTINS else "(registered in code)"


def _provides_by_plugin() -> dict[str, dict[str, list[str]]]:
    """``{plugin: {kinds: [names]}}`` from one call of each provider hook."""
    out: dict[str, dict[str, list[str]]] = {}
    for kind in providers.KINDS:
        found = registrations(kind)
        winners = found.winners()
        for provided in found.found:
            winner = winners[provided.name].plugin
            label = provided.name if winner == provided.plugin else f"{provided.name} (overridden by {winner!r})"
            out.setdefault(provided.plugin, {}).setdefault(f"{kind}s", []).append(label)
    return out


# -- what the plugins provide ----------------------------------------------------------


def registrations(kind: str) -> Registrations:
    """Every registration of ``kind`` by the built-in and installed plugins, in call order."""
    found = Registrations(kind_of(kind), fixed_builtins(kind))
    getattr(hook(), found.kind.hook)(register=found)
    return found


def fixed_builtins(kind: str) -> dict[str, Provided]:
    """agl's own names of ``kind`` where they cannot be replaced (store schemes), found without loading plugins.

    So ``open_store("sqlite:///...")`` neither loads nor depends on installed plugins.
    """
    spec = kind_of(kind)
    if not spec.fixed:
        return {}
    found = Registrations(spec)
    for module_name in builtin_modules():
        function = getattr(__import__(module_name, fromlist=["_"]), spec.hook, None)
        if function is not None:
            function(register=found.bound_to(module_name))
    return found.winners()


def find(kind: str, name: str) -> Provided | None:
    """The registration that provides the ``kind`` called ``name`` (the first in call order), or None."""
    fixed = fixed_builtins(kind).get(name)
    return fixed or registrations(kind).winners().get(name)


def names(kind: str) -> list[str]:
    """Every name of ``kind`` the loaded plugins provide, sorted."""
    return sorted(registrations(kind).winners())


def resolve(kind: str, name: str, config: dict[str, Any] | None = None, *, field: str | None = None) -> Any:
    """The component ``name`` of ``kind`` (backend, engine, credit_assignment, store_scheme, logger, command).

    A backend or an engine is built: its factory is called with ``config`` as keyword
    arguments. The other kinds are returned as registered (a credit-assignment strategy,
    a store opener, a logger class, a command's parser setup). The
    :class:`~agl.errors.ConfigError` for a name nothing provides names the package to
    install where an installed package declares it (``no backend 'verl': pip install agl-verl``,
    see :func:`agl.providers.declared_by`), else the
    closest provided name and what is provided; ``field`` (``store url '...'``) is put
    before it.
    """
    spec = kind_of(kind)
    provided = find(kind, name)
    if provided is None:
        message = not_provided(kind, name, names(kind))
        raise ConfigError(f"{field}: {message}" if field else message)
    if spec.builds:
        return provided.factory(**(config or {}))
    if config:
        raise TypeError(f"resolve: a {spec.what} takes no config (got {sorted(config)})")
    return provided.factory
