"""The machinery of agl's documentation site (not a package agl ships).

- :mod:`agl_docs.pages`: the reference pages made from the code at build time
  (the CLI, the trainer config, the hooks, the environment variables);
- :mod:`agl_docs.griffe_extensions`: griffe extensions for the API reference (pydantic
  fields' ``Field(description=...)`` as docstrings, reST markup as Markdown, exported names
  that shadow a submodule);
- :mod:`agl_docs.snippets`: the collector that runs (or records why it does not run)
  every code block of the documentation.

``docs/_hooks/mkdocs_hooks.py`` puts this directory on ``sys.path`` and adds the
generated pages to the site; the tests in ``tests/docs`` do the same.
"""
