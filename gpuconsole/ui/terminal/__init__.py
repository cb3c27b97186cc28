"""What the console writes to the terminal: only the cells that changed, as curses does.

Textual repaints whole widget lines and resets the attributes after every segment; over a slow SSH
link that is most of what an admin's session carries. `diff.ScreenDiff` keeps a copy of the screen
and turns each frame into the few cursor moves, attribute changes and characters that differ;
`driver.DiffDriver` puts it between Textual and a real terminal.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textual.driver import Driver

PLAIN_OUTPUT_ENV = "GPUCONSOLE_PLAIN_OUTPUT"
"""Set (to anything but 0) to write Textual's output unfiltered, to tell whether a display
problem comes from the filter."""


def console_driver(default: type[Driver]) -> type[Driver]:
    """The driver for the console: `DiffDriver` where Textual would use its Linux driver (Linux,
    macOS), else Textual's choice (Windows, ``TEXTUAL_DRIVER``, ``GPUCONSOLE_PLAIN_OUTPUT``).
    Headless and inline runs never use this choice."""
    if sys.platform == "win32" or os.environ.get(PLAIN_OUTPUT_ENV, "") not in ("", "0"):
        return default
    from textual.drivers.linux_driver import LinuxDriver

    from gpuconsole.ui.terminal.driver import DiffDriver

    return DiffDriver if default is LinuxDriver else default
