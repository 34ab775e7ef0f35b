"""The reST-to-Markdown conversion the hooks page and the API reference use (agl_docs.markdown)."""

from __future__ import annotations

import textwrap

from agl_docs.markdown import docstring, inline


def test_roles_and_double_backticks_become_code_spans():
    assert inline("see :class:`~agl.store.Store` and :func:`agl.emit_reward`, ``x | y``") == (
        "see `agl.store.Store` and `agl.emit_reward`, `x | y`"
    )


def test_literal_blocks_directives_and_doctest_lines_become_fences():
    text = textwrap.dedent(
        """\
        One line::

            import agl
            agl.emit_reward(1.0)

        .. code-block:: yaml

            steps: 3

        >>> agl.span("x")
        ... # continued

        Args:
            store: where it goes; an example::

                open_store("sqlite:///x.db")
        """
    )
    assert docstring(text) == textwrap.dedent(
        """\
        One line:

        ```python
        import agl
        agl.emit_reward(1.0)
        ```

        ```yaml
        steps: 3
        ```

        ```python
        agl.span("x")
        # continued
        ```

        Args:
            store: where it goes; an example:

            ```python
            open_store("sqlite:///x.db")
            ```
        """
    )
