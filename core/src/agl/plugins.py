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

Two kinds of hook are called so that each implementation's answer carries its plugin's
name, through pluggy's public calls and without changing what pluggy registered: each
provider hook implementation alone (:meth:`pluggy.PluginManager.subset_hook_caller`), with a
``register`` bound to its plugin; and ``agl_reward`` by :func:`reward_answers`, where
pluggy's ``call_extra`` runs one answering function per implementation, in pluggy's call
order, inside the ``wrapper=True`` implementations.
"""

from __future__ import annotations

import difflib
import inspect
import re
import threading
from collections.abc import Callable, Iterator, Mapping
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
    "reward_answers",
    "unregister",
]

_manager: pluggy.PluginManager | None = None
_lock = threading.RLock()  # re-entered when loading a plugin imports agl-trainer, which adds its built-ins

_BUILTINS: list[str] = ["agl.store.schemes"]
"""Modules of agl's own packages that are always registered, whatever ``AGL_LOAD_PLUGINS`` says."""
_HOOKS = frozenset(name for name in dir(hookspecs) if name.startswith("agl_"))


class RewardAnswer(NamedTuple):
    """One plugin's answer to ``agl_reward``, as :func:`reward_answers` returns it (and a wrapper sees it)."""

    plugin: str
    """The name of the plugin that answered: the ``source`` of the rewards stored from it."""
    value: float | Mapping[str, float] | None
    """What the plugin returned (None where it raised)."""
    error: Exception | None = None
    """What the plugin raised, if it did; such an answer is counted, logged and gives no reward."""


def reward_answers(**kwargs: Any) -> list[Any]:
    """Call ``agl_reward`` with ``kwargs``: each plugin's answer as a :class:`RewardAnswer`, in pluggy's call order.

    An implementation that raises answers with its error, so one failing plugin costs only its
    own answer (pluggy's own call stops at the first exception); one that returns None abstains.
    The ``wrapper=True`` implementations run around the others as pluggy runs them, and see the
    answers (and may change them). The relay itself, ``hook().agl_reward(...)``, is pluggy's plain
    call: the implementations' values as they return them, without their plugins' names.

    Its cost, same run (2026-11-29, two plugins, best of 5 x 20,000 calls on the shared 2-core
    host): 10.2 us a call, against 7.5 us for the relay over the rewritten ``HookImpl.function`` it
    replaces; about 1.7 % of a rollout's build time in ``tests/benchmarks/bench_transitions.py``,
    whose whole run stayed within its own noise (+-15 % at load 7 to 9).
    """
    pm = get_plugin_manager()
    answering = [i for i in pm.hook.agl_reward.get_hookimpls() if not (i.wrapper or i.hookwrapper)]
    wrappers = pm.subset_hook_caller("agl_reward", remove_plugins=[i.plugin for i in answering])
    # get_hookimpls lists the implementations in the reverse of call order, and call_extra runs the
    # methods it is given in the reverse of their order, after the wrappers: pluggy's call order again.
    return wrappers.call_extra([_answer_for(i) for i in answering], kwargs)


def _answer_for(impl: pluggy.HookImpl) -> Callable[..., RewardAnswer | None]:
    """A function that calls the ``agl_reward`` implementation ``impl`` and answers for it, never raising."""
    function, plugin = impl.function, impl.plugin_name

    def answer(*args: Any) -> RewardAnswer | None:
        try:
            value = function(*args)
        except Exception as exc:
            return RewardAnswer(plugin, None, exc)
        return None if value is None else RewardAnswer(plugin, value)

    # pluggy reads the arguments to pass from the function a wrapper wraps: those ``impl`` takes, in its order
    answer.__wrapped__ = function  # type: ignore[attr-defined]
    return answer


def _each_alone(pm: pluggy.PluginManager, hook_name: str) -> Iterator[tuple[str, Callable[..., Any]]]:
    """Each implementation of the hook ``hook_name``, in call order: its plugin's name, and a caller of it alone."""
    impls = getattr(pm.hook, hook_name).get_hookimpls()
    for impl in reversed(impls):  # get_hookimpls lists them in the reverse of call order
        others = [i.plugin for i in impls if i is not impl]
        yield impl.plugin_name, pm.subset_hook_caller(hook_name, remove_plugins=others)


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
            try:
                self._check_provides(plugin, registered)
            except ConfigError:
                self.unregister(plugin)
                raise
        return registered

    def _check_provides(self, plugin: object, plugin_name: str) -> None:
        """Call ``plugin``'s provider hooks alone, so that a bad registration is refused now, naming it."""
        others = [p for p in self.get_plugins() if p is not plugin]
        for caller in self.get_hookcallers(plugin) or []:
            kind = providers.HOOKS.get(caller.name)
            if kind is not None:
                found = Registrations(kind, fixed_builtins(kind.name))
                self.subset_hook_caller(caller.name, remove_plugins=others)(register=found.bound_to(plugin_name))


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
    """pluggy's hook relay: ``hook().agl_rollout_ended(rollout=...)`` (``agl_reward``: :func:`reward_answers`)."""
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
    for plugin, call in _each_alone(get_plugin_manager(), found.kind.hook):
        call(register=found.bound_to(plugin))
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
