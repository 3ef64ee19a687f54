"""Markdown tables, text files and PNG figures, as every analysis command writes them.

matplotlib is imported on first use only (:func:`pyplot`), so importing this module -- or the
training driver that scores with it -- never loads it.
"""
import logging
import os
from typing import Optional, Sequence


def pyplot():
    """matplotlib.pyplot with the file-only Agg backend (never a window)."""
    # importing fairseq's tasks (text_to_speech) sets the root logger to DEBUG: keep matplotlib quiet
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen

    return plt


def fmt(x: Optional[float], digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_text(path: str, text: str):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def save_figure(fig, path: str, dpi: int = 100):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
