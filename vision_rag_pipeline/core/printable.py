"""Text that reaches a terminal or a one-line report stays one harmless line.

A file name is chosen by whoever sends the file: `"line1\\nFAILED fake.pdf"` would print a forged
status line, ANSI escape sequences recolour or clear the terminal, and right-to-left marks show
`report\u202efdp.exe` as `reportexe.pdf`. Names are reduced to printable characters before they are
stored (`printable_name`); whatever is printed from stored text is escaped (`escape_unprintable`),
so rows written before still print as one line.
"""

from __future__ import annotations

import re

# CSI (ESC [ ... final byte) and OSC (ESC ] ... BEL or ESC \) sequences, and any other ESC + one char
_ANSI_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?|\x9b[0-?]*[ -/]*[@-~]"
)
_SPACES = re.compile(r" {2,}")


def printable_name(name: str) -> str:
    """`name` with escape sequences removed and every other unprintable character (controls, line
    breaks, format characters such as bidi marks and zero-width joiners, unassigned code points)
    turned into a space; runs of spaces collapsed, ends stripped."""
    name = _ANSI_SEQUENCE.sub("", name)
    name = "".join(char if char.isprintable() else " " for char in name)
    return _SPACES.sub(" ", name).strip()


def escape_unprintable(text: str) -> str:
    """`text` with each unprintable character written as its Python escape (`\\n`, `\\x1b`,
    `\\u202e`): what it says stays visible, nothing acts on the terminal or starts a new line."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
