"""How every chart of the toolkit is drawn (the bench report's, the fleet plan's): a PNG from a
matplotlib ``Figure`` on the Agg canvas, never pyplot, so there is no global state and no display
is needed (any process, any host, headless); one resolution, one grid and legend style; written
atomically. matplotlib is imported when a chart is drawn, not when this module is.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from mme.fsutil import write_bytes_atomic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110
GRID_ALPHA = 0.3
LEGEND_FONT_SIZE = 8


def figure(width: float, height: float) -> "Figure":
    """A new figure of ``width`` x ``height`` inches, laid out so titles and labels fit."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def png(fig: "Figure") -> bytes:
    """``fig`` as PNG bytes (Agg)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def message_png(fig: "Figure", text: str) -> bytes:
    """``fig`` with nothing but ``text`` in its middle (a chart with nothing to draw says so)."""
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=13)
    return png(fig)


def write_png(path: Path, data: bytes) -> Path:
    """Write a chart's PNG bytes to ``path`` atomically (a reader never sees half a file)."""
    write_bytes_atomic(path, data)
    return path
