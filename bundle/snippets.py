"""Named sections of a markdown result file, which the documentation includes by name.

The site includes committed results (``benchmarks/**/*.md``) with pymdownx.snippets. A report
writer puts each part a page shows between the lines of :func:`section_start` and
:func:`section_end`: HTML comments, invisible on GitHub, that hold the snippet marker and
``[start:steps]`` or ``[end:steps]``; the page then includes the file's path followed by
``:steps``. A section keeps its name when the file is written again with other figures or more
lines, where a line range would then show the wrong lines without a word. Sections may nest; an
include of the whole file, or of another section, leaves the marker lines out. (This docstring
spells no marker out: the site's snippets extension would take it for one.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from bundle.errors import ConfigError

#: A section name as pymdownx.snippets reads it.
NAME = re.compile(r"[a-z][-_0-9a-z]*")


def _checked(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ConfigError(f"a snippet section name is lower-case letters, digits, '-' and '_', got {name!r}")
    return name


def name_for(text: str) -> str:
    """A section name made of ``text`` (a model's name, say): lower case, other characters ``-``."""
    name = re.sub(r"[^-_0-9a-z]+", "-", text.lower()).strip("-_")
    return name if name[:1].isalpha() else f"s-{name}"


def section_start(name: str) -> str:
    """The line that opens section ``name``."""
    return f"<!-- --8<-- [start:{_checked(name)}] -->"


def section_end(name: str) -> str:
    """The line that closes section ``name``."""
    return f"<!-- --8<-- [end:{_checked(name)}] -->"


def section(name: str, lines: Sequence[str]) -> list[str]:
    """``lines`` as section ``name``: between its opening and closing lines."""
    return [section_start(name), *lines, section_end(name)]
