"""What the CLI prints of user data on a terminal: control characters shown, not obeyed.

An inquiry's prompt, a trigger's description, an action's output or an event's payload
may hold escape sequences (``"\\x1b[2J"`` clears the screen, ``"\\x1b]0;...\\x07"`` sets the
window title, others rewrite what was printed before): written raw, they would drive the
operator's terminal. On a terminal every such character is shown as ``\\xNN``; piped
output is left as it is (a script or a file gets the data). ``executions tail`` writes
with :func:`visible`; every other command prints through :class:`SafeConsole`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

# Control characters a terminal would act on (escape sequences, cursor moves, bells), other
# than newline, tab and carriage return (an action's progress bar redraws its line).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# C1 controls (U+0080-U+009F): CSI (U+009B) starts a sequence like ESC [ on many terminals.
_C1 = re.compile(r"[\x80-\x9f]")


def visible(text: str) -> str:
    """``text`` with the control characters a terminal acts on as ``\\xNN``."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return _C1.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class SafeConsole(Console):
    """A rich Console that, on a terminal, prints every string and ``Text`` of user data
    through :func:`visible`. Strings are escaped before they become ``Text`` (so tables
    measure what is shown); segments rendered from ``Text`` built elsewhere are escaped on
    the way out. Rich's own styling and cursor codes are control segments: untouched."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(visible(text) if self.is_terminal else text, **kwargs)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        if self.is_terminal and isinstance(renderable, Text) and _has_control(renderable.plain):
            renderable = _escaped(self, renderable)
        segments = super().render(renderable, options)
        if not self.is_terminal:
            yield from segments
            return
        for segment in segments:
            if segment.control is None and _has_control(segment.text):
                yield Segment(visible(segment.text), segment.style)
            else:
                yield segment


def _has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None or _C1.search(text) is not None


def _escaped(console: Console, text: Text) -> Text:
    """A copy of ``text`` with its control characters shown, each run keeping its style
    (escaping in place would shift the spans)."""
    out = Text(justify=text.justify, overflow=text.overflow, no_wrap=text.no_wrap, end=text.end, style=text.style)
    for segment in text.render(console, end=""):
        out.append(visible(segment.text), segment.style)
    return out
