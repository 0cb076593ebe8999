"""Draws the pattern pictures of docs/semantics.md as SVG, straight from haloattn.geometry.

    python docs/figures/draw.py      # rewrites docs/figures/*.svg
"""

from __future__ import annotations

import os

import torch

from haloattn.geometry import Axis, attends, window_range

CELL = 16
QUERY, KEY, EMPTY, GRID = "#d1495b", "#66a182", "#f4f4f4", "#bbbbbb"
WINDOW_COLOURS = ["#edae49", "#00798c", "#8d96a3", "#30638e", "#d1495b", "#66a182", "#b8b8ff", "#ff9f1c"]
HERE = os.path.dirname(os.path.abspath(__file__))


def _grid(x0, y0, rows, cols, fill, title):
    parts = [f'<text x="{x0}" y="{y0 - 6}" font-family="sans-serif" font-size="12">{title}</text>']
    for r in range(rows):
        for c in range(cols):
            parts.append(
                f'<rect x="{x0 + c * CELL}" y="{y0 + r * CELL}" width="{CELL}" height="{CELL}" '
                f'fill="{fill(r, c)}" stroke="{GRID}" stroke-width="1"/>'
            )
    return parts


def _svg(panels, width, height):
    body = "\n".join(p for panel in panels for p in panel)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">\n<rect width="100%" height="100%" fill="white"/>\n{body}\n</svg>\n')


def neighbourhood_panel(x0, y0, shape, window, query, title, stride=1, dilation=1, causal=(False, False)):
    axes = [Axis(shape[a], window, stride, dilation, causal[a]) for a in range(2)]

    def fill(r, c):
        if (r, c) == query:
            return QUERY
        sees = all(bool(attends(axes[a], "neighborhood", query[a], (r, c)[a])) for a in range(2))
        return KEY if sees else EMPTY

    return _grid(x0, y0, shape[0], shape[1], fill, title)


def window_panel(x0, y0, shape, window, shift, title):
    def window_id(coord, length):
        lo, _ = window_range(Axis(length, window, shift=shift), torch.tensor(coord), length)
        return int(lo)

    ids = {}

    def fill(r, c):
        key = (window_id(r, shape[0]), window_id(c, shape[1]))
        ids.setdefault(key, len(ids))
        return WINDOW_COLOURS[ids[key] % len(WINDOW_COLOURS)]

    return _grid(x0, y0, shape[0], shape[1], fill, title)


def main() -> None:
    shape = (12, 12)
    step = shape[1] * CELL + 30
    figures = {
        "neighborhood.svg": [
            neighbourhood_panel(10, 30, shape, 5, (5, 6), "window 5x5, centre"),
            neighbourhood_panel(10 + step, 30, shape, 5, (0, 1), "at a border: shifts inward"),
            neighbourhood_panel(10 + 2 * step, 30, shape, 5, (5, 6), "dilation 2", dilation=2),
        ],
        "stride_causal.svg": [
            neighbourhood_panel(10, 30, shape, 5, (4, 4), "stride 3: query (4,4)", stride=3),
            neighbourhood_panel(10 + step, 30, shape, 5, (5, 5), "stride 3: query (5,5), same keys", stride=3),
            neighbourhood_panel(10 + 2 * step, 30, shape, 5, (6, 6), "causal on axis 0", causal=(True, False)),
        ],
        "window_shift.svg": [
            window_panel(10, 30, shape, 4, 0, "window 4x4, shift 0"),
            window_panel(10 + step, 30, shape, 4, 2, "window 4x4, shift 2 (partial edges)"),
        ],
    }
    for name, panels in figures.items():
        width = 10 + len(panels) * step
        height = 40 + shape[0] * CELL
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            f.write(_svg(panels, width, height))
        print("wrote", name)


if __name__ == "__main__":
    main()
