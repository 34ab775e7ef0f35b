"""One module per store backend, each with ``open_backend(tmp_path)``: a context
manager yielding a fresh, empty :class:`agl.store.Store`. The conformance suite
runs once per module found here."""

import importlib
import pkgutil

BACKENDS = {
    info.name: importlib.import_module(f"{__name__}.{info.name}")
    for info in pkgutil.iter_modules(__path__)
    if not info.name.startswith("_")
}
