"""A shared docstring text stands where its placeholder line stood, at that line's indent."""

from __future__ import annotations

import inspect

import pytest

from rbzarr.shared_doc import shared_doc

KEYS = """
keys
    Flat keys to read.
"""


class Reader:
    """Reads."""

    @shared_doc(keys=KEYS)
    def read(self, keys: list[str], deep: bool = False) -> None:
        """Read ``keys``.

        Parameters
        ----------
        {keys}
        deep
            Read deeply.
        """


def test_the_text_takes_the_placeholders_indent():
    want = "Read ``keys``.\n\nParameters\n----------\nkeys\n    Flat keys to read.\ndeep\n"
    assert inspect.getdoc(Reader.read).startswith(want)


def test_braces_inside_a_line_are_left_as_they_are():
    @shared_doc(keys=KEYS)
    def read() -> None:
        """A set ``{1, 2}`` and a dict ``{key}`` in prose."""

    assert read.__doc__ == "A set ``{1, 2}`` and a dict ``{key}`` in prose."


def test_a_placeholder_without_its_text_fails_at_once():
    with pytest.raises(KeyError, match="values"):

        @shared_doc(keys=KEYS)
        def read() -> None:
            """Read.

            {values}
            """
