"""Mixed mode of the transformers engine: one base model, one LoRA adapter per policy version.

Once a named policy is loaded (:meth:`TransformersEngine.load_version` with
``version.policy``), the engine serves an :class:`AdapterSet`: the base model wrapped by peft,
with each policy's current weights loaded as a named adapter (or ``"__base__"``, peft's name
for the base weights, for a policy frozen at the base model). Every forward pass takes one
adapter name per row (peft's mixed adapter batches, ``adapter_names=[...]``), so rows of
different policies decode together; each row keeps the adapter it was admitted with until it
finishes.

A new version of a policy is loaded under a fresh internal name; the old adapter is deleted
once no row holds it. peft applies ``adapter_names`` through forward hooks it registers and
removes around each call, so the replicas' forward passes on the shared model take turns
(:attr:`AdapterSet.lock`), as do loads and deletions.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from pathlib import Path
from typing import Any

BASE = "__base__"
"""peft's adapter name for the base model's own weights in a mixed batch."""


class AdapterSet:
    """The base model with one adapter per policy; callable like the model, with ``adapter_names``.

    ``base``: the engine's base model (plain transformers). ``policy_models`` maps a request's
    ``model`` to the named policy that answers it; any other name goes to the default policy
    (``None``).
    """

    def __init__(self, base: Any) -> None:
        self.model = base
        self.lock = threading.RLock()
        self.policy_models: dict[str, str] = {}
        self._routes: dict[str | None, tuple[str, str]] = {}
        self._held: Counter[str] = Counter()
        self._names = itertools.count(1)
        #: forward passes run, and of them those whose rows used more than one adapter
        self.passes = 0
        self.mixed_passes = 0

    def set_policy(
        self, policy: str | None, adapter_path: str | Path | None, version: str, model_name: str | None = None
    ) -> None:
        """Serve ``policy`` with the adapter at ``adapter_path`` (None: the base weights) as ``version``,
        to the requests for ``model_name`` (a named policy's).

        Rows admitted from now on get the new weights; rows running keep theirs.
        """
        with self.lock:
            name = BASE if adapter_path is None else self._load(adapter_path, policy)
            if policy is not None and model_name is not None:
                self.policy_models[model_name] = policy
            self._routes[policy] = (name, version)
            self._sweep()

    def _load(self, path: str | Path, policy: str | None) -> str:
        from peft import PeftModel

        name = f"{policy or 'default'}-{next(self._names)}"
        if hasattr(self.model, "load_adapter") and hasattr(self.model, "peft_config"):
            self.model.load_adapter(str(path), adapter_name=name)
        else:
            self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=name)
        self.model.eval()
        return name

    def route(self, model_name: str | None) -> tuple[str, str]:
        """The adapter and version that answer a request for ``model_name`` now."""
        with self.lock:
            policy = self.policy_models.get(model_name) if model_name else None
            return self._routes[policy if policy in self._routes else None]

    def acquire(self, model_name: str | None) -> tuple[str, str]:
        """:meth:`route`, the adapter held until :meth:`release`."""
        with self.lock:
            name, version = self.route(model_name)
            self._held[name] += 1
            return name, version

    def release(self, name: str) -> None:
        """A row admitted with adapter ``name`` finished; an old version's adapter goes once unused."""
        with self.lock:
            self._held[name] -= 1
            if self._held[name] <= 0:
                del self._held[name]
                self._sweep()

    def _sweep(self) -> None:
        """Delete the adapters no policy serves now and no row holds (peft needs one: the last stays)."""
        current = {route[0] for route in self._routes.values()}
        for name in list(getattr(self.model, "peft_config", {})):
            if name in current or self._held[name] or len(self.model.peft_config) == 1:
                continue
            if name in self.model.active_adapters:
                others = [other for other in self.model.peft_config if other != name]
                self.model.set_adapter(others[-1])  # which one is active does not matter with adapter_names
            self.model.delete_adapter(name)

    @property
    def adapters(self) -> list[str]:
        """The peft adapters loaded now (current versions and old ones rows still hold)."""
        with self.lock:
            return list(getattr(self.model, "peft_config", {}))

    def served(self) -> list[tuple[str, str]]:
        """``(model name, version)`` of each named policy."""
        with self.lock:
            by_policy = {policy: model for model, policy in self.policy_models.items()}
            return [(by_policy[p], route[1]) for p, route in self._routes.items() if p is not None and p in by_policy]

    def __call__(self, *, adapter_names: list[str], **kwargs: Any) -> Any:
        """One forward pass, row ``i`` through adapter ``adapter_names[i]``."""
        with self.lock:
            self.passes += 1
            self.mixed_passes += len(set(adapter_names)) > 1
            if hasattr(self.model, "peft_config"):
                return self.model(adapter_names=adapter_names, **kwargs)
            return self.model(**kwargs)  # no adapter loaded: every row is on the base weights
