"""Draws the pattern pictures of docs/semantics.md (and the key-query convolution's tiles of
docs/backend-triton.md) as SVG, straight from haloattn.geometry.

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


SOURCE, MASKED_SOURCE = "#edae49", "#d9d9d9"


def kq_conv_panels(x0, y0, length=24, window=11, c_q=3, c_k=5, rows=(12, 16), n0=10, block_n=6, halo=2):
    """The score matrix of a causal 1-D window (queries down, keys across): a target tile (red),
    the sources its convolution reads (the c_q - 1 rows above, HALO columns either side: orange
    where attended, grey where the pattern masks them to 0), other attended pairs (green); and
    the band matrix of one kernel row, tap t on its diagonal."""
    axis = Axis(length, window, causal=True)
    reach = (c_k - 1) // 2

    def fill(r, c):
        target = rows[0] <= r < rows[1] and n0 <= c < n0 + block_n
        source = rows[0] - (c_q - 1) <= r < rows[1] and n0 - halo <= c < n0 + block_n + halo
        seen = bool(attends(axis, "neighborhood", r, c))
        if target:
            return QUERY
        if source:
            return SOURCE if seen else MASKED_SOURCE
        return KEY if seen else EMPTY

    def band(u, j):
        t = u - halo - j + reach
        return WINDOW_COLOURS[t] if 0 <= t < c_k else EMPTY

    scores = _grid(x0, y0, length, length, fill,
                   f"causal window {window}, c_q={c_q}, c_k={c_k}")
    bands = _grid(x0 + length * CELL + 40, y0, block_n + 2 * halo, block_n, band,
                  "band matrix, row a")
    return [scores, bands]


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
    sizes = {name: (10 + len(panels) * step, 40 + shape[0] * CELL) for name, panels in figures.items()}
    figures["kq_conv_tiles.svg"] = kq_conv_panels(10, 30)
    sizes["kq_conv_tiles.svg"] = (10 + 24 * CELL + 40 + 6 * CELL + 60, 40 + 24 * CELL)
    for name, panels in figures.items():
        width, height = sizes[name]
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            f.write(_svg(panels, width, height))
        print("wrote", name)


if __name__ == "__main__":
    main()
