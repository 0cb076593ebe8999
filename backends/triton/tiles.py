"""Tile shapes, warps and stages: the heuristic default and the tuning candidates.

A config is a dict of three kernel configs, ``{"fwd": ..., "dq": ..., "dkdv": ...}``, each
``{"q": [per-axis query tile], "kv": [per-axis key tile], "warps": w, "stages": s}`` with one
entry per spatial axis (powers of two); the forward's ``"gluon": true`` names the Gluon kernel on
Hopper (gluon_forward_launch.py; its tiles, warps and stages then serve the Triton forward that
runs where a call's inputs do not suit it), and the dK/dV part's the Gluon dK/dV pass
(gluon_dkdv_launch.py) on the same tiles. JSON-friendly so the core tuning cache can store it.
Configs are fitted to the problem (``normalise``) at launch, so a stored config never breaks one.

The heuristic picks the forward/dQ tile shapes by a cost model: the key tiles a query tile
visits (exact, from the window rule: the union of the tile's neighbourhoods rounded up to whole
key tiles, walked as the kernels walk them) divided by the relative speed of that block size,
measured on an H100 (bf16, D=128, benchmarks/RESULTS.md), plus the per-axis masks the key tiles
that cross a tile's common range pay. Small windows favour small query tiles (less union
overhead), large windows the larger, faster blocks; key tiles that fit inside the common range
on more axes need fewer masks. The dK/dV kernel, which walks query tiles by the inverse rule,
weighs its own boxes by the same model over that walk (key_major_cost, KEY_MAJOR_BOXES).
"""

from __future__ import annotations

import itertools
import math
import os
from functools import lru_cache
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from haloattn.geometry import Axis, key_range, query_range, window_query_range
from haloattn.problem import Problem

from . import host_descriptors
from .gluon_regroup import dilation_groups, regrouped
from .device_limits import (HOPPER_TILE_BUDGET, hopper_for_gluon, multiprocessors, tile_shared_budget,
                            tiles_for_copy_engine)

MIN_TILE = 16  # tl.dot needs at least 16 rows

# (BLOCK_M, BLOCK_N) -> (warps, stages, relative speed on computed pairs) of the forward kernel,
# per way of reading K/V tiles, relative to 128 x 128 blocks with pointer loads. Pointer loads:
# the tuning sweep of the first H100 run (2-D 31x31 and 63x63: about 340-390, 315-350 and
# 310-345 TFLOP/s on computed pairs). Tensor descriptors (TMA): the H100 variant sweep of
# 2026-11-23 (bench_kernel_variants.py), where they lift 64 x 64 blocks by 1.11-1.31x (to about
# 1.00-1.06 on 1-D, 2-D 31x31 and 63x63) but 128-query blocks hardly (0.94-1.05; 0.66 once).
FORWARD_BLOCKS = {
    False: {(128, 128): (8, 2, 1.00), (128, 64): (8, 3, 0.91), (64, 64): (4, 3, 0.92)},
    True: {(128, 128): (8, 2, 0.97), (128, 64): (8, 3, 0.93), (64, 64): (4, 3, 1.02)},
}
# Head dims above this read K/V through tensor descriptors by default: on the H100 that was
# 1.07-1.31x faster at D=128 on every benchmark problem, and 0.76x at D=64 (pointer gathers of
# 128-byte rows win there).
DESCRIPTOR_MIN_HEAD_DIM = 65
# ...except on short walks at up to 128 channels: a program that walks at most this many key
# tiles (blocked problems with stride == window, small windows) pays the in-kernel descriptor
# set-up for few copies. H100, forward, D=128: pointer loads 1.14-1.22x on eight problems walking
# 1-4 tiles (16x16 stride 16, 8x8 stride 8, 3-D 2x8x8 stride 2x8x8, 1-D 256 stride 256, 7x7,
# 1-D causal 127, 7x7 windows), 0.95x on 32x32 stride 32 (16 tiles), 0.81x on 31x31; at D=256
# 0.98x on a 5x5 window (RESULTS.md, "Short walks read by pointer").
SHORT_WALK_STEPS = 4
SHORT_WALK_MAX_HEAD_DIM = 128
# The backward reads its streamed tiles (Q and dO in dK/dV, K and V in dQ) through tensor
# descriptors for head dims in this range: on an H200 (2026-11-26, kernels with anchored walks)
# that was 1.12-1.19x faster than pointer loads on nine of the ten benchmark problems (D = 64 and
# 128) and 0.99x on 16x16 stride 16. (On the 2026-11-23 kernels it had measured 0.88-1.01x.)
BACKWARD_DESCRIPTOR_HEAD_DIMS = (64, 128)
# ...except where the dQ kernel's walk visits at most this many streamed tiles: H100 (2026-11-28,
# `bench_short_walks.py --backward`), pointer loads 1.24x (D=64) and 1.06x (D=128) on one-tile
# walks (8x8 stride 8) and 1.04x on 3-D 2x8x8 stride 2x8x8 (two tiles); from three tiles on the
# descriptors won or tied (0.94-1.01x at 3-4 tiles: 16x16 stride 16, 7x7, 7x7 windows, 1-D causal
# 127; 0.74-0.90x on longer walks).
BACKWARD_SHORT_WALK_STEPS = 2
# Where the launcher builds the descriptors on the host (host_descriptors.py: undilated problems),
# no program pays a set-up, and descriptor loads won where the rules above chose pointers for
# it: H200, 2026-12-05 (RESULTS.md, "Descriptors built on the host"), the default's tiles with
# every kernel reading through host descriptors, against pointers: forward 1.07x on 2-D 31x31 and
# 1.08x on 3-D 3x7x7 at D=64, 1.14x on 16x16 stride 16 (four key tiles) at D=128, but 0.97x at
# D=32; backward 1.32x at D=32 (2-D 56x56, 7x7). So on such problems the forward's descriptor
# rule starts at this head dim and ignores walk length, and the backward's takes head dims from
# HOST_DESCRIPTOR_BACKWARD_MIN_HEAD_DIM and ignores walk length too: H100, 2026-12-06
# (`bench_short_walks.py --backward`), host descriptors against the short-walk rule's pointers
# 1.14x (8x8 stride 8, D=128), 1.09x (D=64) and 1.15x (3-D 2x8x8 stride 2x8x8). Packed forwards
# keep their pointer loads (0.97-1.02x either way on the same run).
HOST_DESCRIPTOR_FORWARD_MIN_HEAD_DIM = 64
HOST_DESCRIPTOR_BACKWARD_MIN_HEAD_DIM = 32
# Streamed tiles are walked anchored at the program's common range (index_math.tile_start: more
# tiles need no mask, never more steps): on the H100 the forward and the backward were as fast or
# up to 1.09x faster on the ten benchmark problems (RESULTS.md, "Anchored walks").
ANCHOR_TILES = True
# The forward masks a partial tile only on the axes it crosses where head dims are at most this:
# there (D = 64, 128) it was 1.00-1.14x the one-mask forward but for two problems at 0.96-0.97.
# The backward keeps one mask: per-axis masks measured 0.95-1.02x there, and their branches cost
# the dK/dV kernel 40 KiB more shared memory at D = 256 (246272 bytes: more than the H100 has).
AXIS_MASKS_MAX_HEAD_DIM = 128
# A step's extra cost per axis on which its key tile crosses the common range (that axis' two
# compares and a select per score), relative to a step without a mask.
MASKED_AXIS_COST = 0.2
# The forward moves its running row maxima only when a tile raises one by more than 2^8
# (forward_kernel.online_softmax_rescale), skipping most accumulator rescales.
LAZY_RESCALE = False

# The forward's exp2s split between the multi-function unit and the FMA pipe (exp2_split.py):
# one score in EVERY on the latter, by the widest head of a 16-bit problem (float32: none). Off by
# default: on the H100 (2026-12-07 17:50 UTC, RESULTS.md "The exp2 split and P before the mask")
# one in four ran the 64-channel forward 0.97-0.99x on four problems and 1.03x on one (1-D,
# window 2047), one in two 0.92-0.97x: the Triton forward's 64 x 64 step issues about as many
# instructions as its tensor cores and exp2 units take cycles, so the polynomial's eight more per
# score cost what the exp2 units save. A tuning candidate for 16-bit problems (every choice).
EXP2_SPLIT_EVERY: Dict[int, int] = {}
EXP2_SPLIT_CHOICES = (0, 2, 4)


def exp2_split_every(problem: Problem) -> int:
    """The forward config's ``exp2_split`` for this problem (EXP2_SPLIT_EVERY)."""
    if problem.dtype.itemsize != 2:
        return 0
    width = max(problem.head_dim, problem.value_dim)
    return next((every for widest, every in sorted(EXP2_SPLIT_EVERY.items()) if width <= widest), 0)


# Whether the kernels multiply heads whose dim is not a power of two in two power-of-two blocks
# (head_split) instead of one padded block.
SPLIT_HEADS = True


# The dK/dV kernel on narrow heads: with 2 warps instead of 4 on its 64-token tiles the backward
# ran 1.05-1.27x faster on eight 16-bit problems with heads of 16-32 channels on the H100
# (1.17-1.20x on the NAT / DiNAT layers; 2026-11-27, RESULTS.md "Narrow heads"); at 64 channels
# 2 warps spill (25x slower).
NARROW_HEAD_DIM = 32
NARROW_DKDV_WARPS = 2
# Narrow heads also take small query tiles where those compute fewer pairs: with a 7x7 window an
# 8x8 query tile walks a 14x14 key box (4.85 computed pairs per attended one on a 56x56 grid), a
# 2x8 tile an 8x14 box (2.4). At 32 channels the scores' softmax, not the products, sets a
# step's time, so a one-warp program on mma.sync tiles pays for the fewer pairs. Forward blocks
# (queries, keys) -> (warps, stages, speed on computed pairs, on FORWARD_BLOCKS' scale), from two
# H200 runs of 2026-11-29 (benchmarks/bench_small_query_tiles.py; RESULTS.md, "Small query tiles
# on narrow heads"): on eleven narrow problems 16 x 32 forwards ran at 0.51-0.57 of the 64 x 64
# default's rate on computed pairs and 32 x 64 at 0.66-0.76; at head dim 64 every small tile
# lost (0.45-0.6 with the fewer pairs counted), so the rule stops at NARROW_HEAD_DIM.
NARROW_FORWARD_BLOCKS = {(32, 64): (1, 3, 0.66), (16, 32): (1, 3, 0.50)}
# The 128 x 128 forward block at 16-bit head dims of at most POINTER_BLOCK_MAX_HEAD_DIM (read by
# pointer, DESCRIPTOR_MIN_HEAD_DIM) on GPUs with a copy engine: FORWARD_BLOCKS' speed for it
# (1.00) was measured at 128 channels; at 64 and 32 it ran slower per computed pair than 128 x 64
# on 8 warps or 64 x 64 on 4 (H200, 2026-12-05, bench_forward_configs.py --set narrow_1d: the
# 1-D forwards with windows of 2047 to 16384 keys, on which the cost model chose it, ran
# 1.22-1.31x faster on either smaller block at 64 channels and 1.33-1.48x at 32), so its speed
# there is 0.91 x 0.8 (RESULTS.md, "Triton's own ceiling beside the kernel"). Walks of at most
# NARROW_128_KEEP_MAX_STEPS key tiles would keep FORWARD_BLOCKS' speed; none do since 2026-12-06.
# On the H100 the 128 x 128 block ran 2-D 16x16 stride 16 at 64 channels (two tiles a walk) 1.52x
# slower than 64 x 64 on 4 warps (RESULTS.md, "Blocked windows on 128-query tiles"), and one-tile
# walks, packed four pairs a program, 1.04-1.13x slower than 64 x 64 tiles unpacked (RESULTS.md,
# "Gluon probes").
NARROW_128_BLOCK_SPEED = 0.73
POINTER_BLOCK_MAX_HEAD_DIM = 64
NARROW_128_BLOCK_RULE = True
# Where the forward takes such a tile, the backward runs (resident, streamed) boxes of these
# tokens with this many warps: 1.03-1.46x the 64-token backward on the same runs. Its own cost
# comparison (same model, 0.62-0.86 of the rate) separated the winners from the two losers
# (0.91x at 13x13 with dilation 2) by less than its noise; following the forward's choice kept
# every measured win above 1.03x and lost nowhere.
NARROW_BACKWARD_TILES = (32, 32, 1)
# Narrow heads whose forward walks are short enough to pack (PACK_MAX_STEPS: DiNAT's dilated
# layers, whose 7x7 dilation groups one tile covers, and grids no larger than the window) run
# ((queries, keys), (warps, stages)) with the pairs packed: 1.39-1.43x the forward of 8x8 tiles
# with 8 warps on the three such problems of the 2026-11-29 run (one warp: 1.02-1.52x). Their
# backward keeps its tiles (32-token ones measured 0.97-1.01x there).
NARROW_SHORT_WALK_BLOCK = ((32, 64), (2, 3))

# Small windows on wider heads: the backward's 64-token tiles compute 4-21 pairs per attended one
# on windows of 3x3 to 7x7 (5x3 at 80 channels: 12.4). Tiles of (resident, streamed, warps) below,
# read by pointer, compute 2-4x fewer: on an H200 (2026-12-01, bench_small_query_tiles.py
# --small-windows; RESULTS.md "Small windows on wider heads") they ran the backward 1.14-1.58x
# faster on the five problems at head dims 64-256 where the default's tiles (as fitted to shared
# memory) cost 2.29-4.00 times theirs (forward_cost), and 1.20x, 1.02x and 0.74x on the three
# where that ratio was 2.14, 2.01 and 1.92 (7x7 dilated and strided at 256 channels, 7x7 at 64,
# 3-D 3x5x5 at 128). 13x13 windows (1.82-1.85) and the tuned 3-D 5x9x9 at 160 channels (2.21)
# stay below it. The forward keeps its tiles: small ones gained only 1.0-1.3x, and no one shape won.
SMALL_WINDOW_BACKWARD_TILES = (16, 32, 2)
SMALL_WINDOW_BACKWARD_RATIO = 2.25
# Tuning candidates on small windows above NARROW_HEAD_DIM: the small forwards (queries, keys,
# warps, stages) that won there, 1.03-1.30x, each on a problem of its own, and the 32 / 32-token
# two-warp backward (resident, streamed, warps) that won 1.57x on a 5x3 window at 80 channels;
# offered where the default forward costs at least SMALL_TILE_CANDIDATE_RATIO times the cheapest
# 16 x 32 boxes (forward_cost), so that large windows' tuning runs time none of them.
SMALL_TILE_FORWARD_CANDIDATES = ((16, 32, 1, 3), (16, 32, 2, 3), (16, 64, 2, 3), (32, 64, 4, 3))
SMALL_TILE_BACKWARD_CANDIDATES = (SMALL_WINDOW_BACKWARD_TILES, (32, 32, 2))
SMALL_TILE_CANDIDATE_RATIO = 1.5

# The dK/dV kernel's own boxes. It walks query tiles past a resident key tile by the inverse rule,
# whose ranges are not the forward's mirror image: near a border a key is seen by up to
# K + K // 2 queries (every clamped window there reaches it), and strides and causal axes skew
# them too. The forward's boxes, which the backward used to take for both kernels, made dK/dV
# compute 1.2-1.6x the pairs it needs on 3-D windows and strided 2-D ones (key_major_cost), and
# on an H200 (2026-12-02, bench_backward_shapes.py) it took 2.3x the dQ kernel's time on 3-D video
# windows at 64 channels, where its share of the products is 4/3. Where the rule applies (16-bit
# heads of at most 128 channels on the default 64-token, 4-warp tiles), dK/dV takes the
# (resident, streamed) boxes of least key_major_cost if they save at least KEY_MAJOR_MIN_SAVING.
# Streamed boxes of 32 tokens are weighed at KEY_MAJOR_STREAM_32_SPEED, and offered at up to 64
# channels only (their rate on computed pairs measured 0.92-1.05 of 64's on five problems at 64
# channels, 0.78 on a sixth, and 0.79-0.85 at 128). Measured against the forward's boxes on the
# 16 of 22 problems the rule changes (RESULTS.md "The dK/dV kernel's own boxes"): the backward
# 1.03-1.26x faster (dK/dV 1.05-1.40x), the video layers 1.21-1.22x; weighed at 0.95 the 32-token
# boxes ran one strided 3-D problem 0.88x, at 0.85 it takes 64-token ones there (1.03x).
KEY_MAJOR_BOXES = True
KEY_MAJOR_MIN_SAVING = 1.05
KEY_MAJOR_STREAM_32_SPEED = 0.85
KEY_MAJOR_STREAM_32_MAX_HEAD_DIM = 64
# Tuning candidates: the first of the ranked dK/dV boxes (the default's, the forward's and the
# next cheapest).
KEY_MAJOR_CANDIDATES = 3

# Packed forward programs (forward_kernel's PACK): a program runs its query tile for up to
# PACK_MAX (batch, head) pairs in one flat loop, as long as the launch keeps PACK_MIN_WAVES
# programs per SM. The packed loop reloads the queries at every step and holds more registers,
# so a step costs more: on the H100 (2026-11-27, bench_forward_pack.py) packing ran walks of one
# key tile 1.42x faster (DiNAT-T, 16 pairs), broke even at two and lost 1.07-1.5x from 2.5 steps
# up. So only walks of at most PACK_MAX_STEPS key tiles are packed by default; the tuning
# candidates try every pair count. Only where K/V come by pointer loads and the problem has no
# additional tokens (the packed loop has neither).
PACK_MAX_STEPS = 1.5
# Heads of 33-64 channels keep the 128 x 128 forward block's speed on walks this short (see
# NARROW_128_BLOCK_SPEED): on none, since one-tile walks were measured. At up to NARROW_HEAD_DIM
# channels one-tile walks keep it (_narrow_128_keep_max_steps): NARROW_SHORT_WALK_BLOCK then
# takes their forward, and the backward's boxes follow the block.
NARROW_128_KEEP_MAX_STEPS = 0
PACK_MAX = 16
PACK_MIN_WAVES = 2


# The Gluon forward (gluon_forward_kernel.py): on Hopper, two consumer warpgroups of 64 queries
# share each key tile of a 128-query box, a producer warp feeds them by TMA, and the softmax of
# one tile overlaps the tensor cores' work on the previous one. Its cost on the model's scale:
# gluon_forward_cost of its cheapest boxes at GLUON_FORWARD_SPEEDS[key-tile tokens], plus
# GLUON_PROGRAM_STEPS 128-key steps a program (its prologue and epilogue: loading the query
# halves, filling the ring, the last product, the output's store), which short walks feel. The
# 128-key speed and the program steps were fitted to the Gluon / Triton time ratios of 14
# problems at 128 channels on the H100 (2026-12-06 19:08 UTC, RESULTS.md "The Gluon forward in
# the backend"): predicted within 0.90-1.05 of each measured ratio, and on the measured side of 1
# wherever that was more than 3 % away from it. The forward takes it where that cost is below the
# Triton forward's (forward_cost at its block's FORWARD_BLOCKS speed). The config's Triton forward
# runs wherever a call's inputs do not suit the Gluon kernel (gluon_forward_launch.inputs_fit).
# At 64 channels the kernel computes pairs slower (GLUON_HEAD_DIM_RATE below).
#
# The split walk (gluon_split_walk_kernel.py): each consumer computes only the key tiles its own
# half of the box sees (gluon_split_walk.py; the cost counts each half's tile rows on the cut axis,
# _axis_split_steps), and the box may be cut along any axis. Its first tiles, those of one half
# only, run unpipelined, so it computes pairs slower than the whole walk: on the H100 (2026-12-07
# 06:51 UTC, RESULTS.md "The split walk and dilated problems on the Gluon forward") the fitted
# speed of 128-key tiles with three ring slots was 1.10-1.46 over 13 problems (median 1.27), that
# of 64-key tiles 0.97-1.27. 1.22 weighs it where it computes enough fewer pairs: the 3-D issue
# rows (2.31 -> 1.88 pairs per attended pair, 1.11x the whole walk measured, 1.07x predicted).
# 64-key tiles are not weighed: no problem ran faster on them than on the better of the others.
#
# (split walk, key-tile tokens) -> speed on computed pairs, of the tilings the forward weighs
GLUON_FORWARD = True
GLUON_FORWARD_HEAD_DIM = 128  # the head dim the speeds below were fitted at
# Head dims the Gluon forward runs at, with its speed there relative to GLUON_FORWARD_SPEEDS' (a
# rate on computed pairs against the Triton forward's, which changes with the head dim). At 64
# channels (H100, 2026-12-07 23:07 UTC, bench_forward_configs.py --set gluon_narrow, its GPU tests
# passed) the Gluon forward ran 1.07-1.09x the Triton forward on long walks (1-D window 2047,
# 63x63, 1-D causal 4096 with GQA) and 0.74-0.97x on shorter ones (31x31, 3-D 7x15x15, 17x17):
# fitted speeds 1.15-1.26 on the whole walk (median 1.22 against 1.40 at 128 channels), 0.96-0.98
# on the split walk (1.22): 0.85 of them puts all seven on the side they measured. Its exp2 split
# ran slower than without on all seven (GLUON_EXP2_SPLIT).
GLUON_HEAD_DIM_RATE = {128: 1.0, 64: 0.85}
GLUON_FORWARD_HEAD_DIMS = tuple(sorted(GLUON_HEAD_DIM_RATE))
# Whether the Gluon forward honours a config's "exp2_split" (exp2_split.py): the same PTX as the
# Triton forward's, GPU-tested (test_gluon_forward_gpu.py, "exp2_split"); off as at 64 channels
# one exp2 in four on the FMA pipe ran 0.91-1.00x the Gluon forward without it, one in two
# 0.76-0.95x (H100, 2026-12-07 23:07 UTC): the Gluon forward computes every exp2 on the exp2 units.
GLUON_EXP2_SPLIT = False
GLUON_FORWARD_SPEED = 1.40  # whole walk, 128-key tiles (also what the programs' steps are weighed at)
GLUON_FORWARD_SPEEDS = {(False, 128): GLUON_FORWARD_SPEED, (True, 128): 1.22}
# Dilated problems on the Gluon forward as their undilated regrouping (gluon_regroup.py). With
# boxes one dilation group deep (1.50 computed pairs per attended pair on the dilation-2 issue row,
# where boxes spanning both groups computed 2.70 and ran 0.71x the Triton forward) the whole walk
# ran 1.20x the Triton forward on that row (H100, 2026-12-07 23:04 UTC, bench_gluon_split_walk.py;
# predicted 1.11x), the row's forward 0.45 -> 0.53 of dense cuDNN (RESULTS.md "Timed: window-1
# boxes ...").
GLUON_REGROUP_DILATED = True
GLUON_PROGRAM_STEPS = 0.8
GLUON_FORWARD_TOKENS = 128  # queries of a box (two consumers)
# K/V ring slots per (split walk, key-tile tokens): 128 KiB of tiles at 128 channels, and a third
# 128-key slot for the split walk (229,880 B of the 232,448 an H100 block may take;
# benchmarks/compile_report_gluon_forward.py), which lets a consumer's next tile come while the
# other half's tile between them is computed; the whole walk measured no faster with it.
GLUON_RING_SLOTS = {(False, 128): 2, (True, 128): 3, (False, 64): 4, (True, 64): 4}
# The whole walk's kernel on a persistent grid (gluon_forward_launch.persistent_query_slots): a
# program a multiprocessor walks a row of query boxes the host deals (gluon_schedule.py), the
# producer loading the next box's queries and first tiles while the consumers finish one. On the
# H100 (2026-12-07, RESULTS.md "The persistent Gluon forward") 0.98-1.08x a grid of one program a
# box on the 2-D and 3-D rows, 1.07-1.29x on rows round-robin dealt as evenly (1-D,
# strided, Swin windows, GQA). The cost model still charges GLUON_PROGRAM_STEPS a box: the rule's
# choices were right on every row measured with it (16x16 stride 16 still a tie with Triton).
GLUON_PERSISTENT = True
GLUON_PERSISTENT_PROGRAMS = None  # programs of that grid: None for a multiprocessor each (tests set a few)
# One tiling at a time, for the benchmarks and tests that compare them (use_gluon_tiling):
# name -> ((split walk, key-tile tokens), ring slots, persistent grid). Only the whole walk on two
# slots has room for a persistent program's second query slots.
GLUON_TILINGS = {"whole": ((False, 128), 2, True), "whole-per-box": ((False, 128), 2, False),
                 "whole3": ((False, 128), 3, False), "split128": ((True, 128), 2, False),
                 "split128x3": ((True, 128), 3, False), "split64": ((True, 64), 4, False)}


class GluonBoxes(NamedTuple):
    """The Gluon forward's tiling: its cost, the query box, the key box, the axis the box is cut
    along into the consumers' halves, and whether each half computes only its own key tiles."""
    cost: float
    q: Tuple[int, ...]
    kv: Tuple[int, ...]
    split: int
    split_walk: bool


def _gluon_features(problem: Problem, head_dims: Sequence[int]) -> bool:
    """Whether the Gluon kernels compute this problem: 16-bit heads of one of ``head_dims``
    channels (queries and values alike), undilated, no bias, softcap, mods, additional tokens or
    key-query convolution, on a Hopper GPU (or no GPU to ask: device_limits.hopper_for_gluon)."""
    return (problem.dtype in (torch.float16, torch.bfloat16)
            and problem.head_dim == problem.value_dim and problem.head_dim in head_dims
            and all(a.dilation == 1 for a in problem.axes) and not problem.has_rpb and problem.softcap is None
            and not problem.has_mods and not problem.extra_tokens and problem.kq_conv_shape is None
            and hopper_for_gluon(problem.device))


def _gluon_regrouping(problem: Problem):
    """``regrouped(problem)`` where the Gluon forward may take it (GLUON_REGROUP_DILATED for dilated
    problems), else None."""
    if not GLUON_REGROUP_DILATED and any(a.dilation > 1 for a in problem.axes):
        return None
    return regrouped(problem)


def gluon_forward_problem(problem: Problem) -> bool:
    """Whether the Gluon forward can compute this problem (heads of GLUON_FORWARD_HEAD_DIMS
    channels), dilated ones as their undilated regrouping (gluon_regroup.py)."""
    regrouping = _gluon_regrouping(problem)
    return (GLUON_FORWARD and regrouping is not None
            and _gluon_features(regrouping.problem, GLUON_FORWARD_HEAD_DIMS))


def _axis_split_steps(axis: Axis, pattern: str, q_tile: int, kv_tile: int, anchor: bool) -> Tuple[float, float]:
    """``_axis_steps`` on the cut axis of the split walk: each box's walk as the kernel takes it
    (index_math.key_walk), of which each half computes its own tile rows (gluon_split_walk.half_rows);
    per box the mean of the halves' rows (the cost multiplies by the whole box's queries), and
    of their rows inside the half's common range."""
    group_len = axis.group_length(0)
    half = q_tile // 2
    visited = inside = 0.0
    for start in range(0, group_len, q_tile):
        last = min(start + q_tile, group_len) - 1
        _, lo, common_hi = key_range(axis, pattern, start)
        _, common_lo, hi = key_range(axis, pattern, last)
        first = walk_start(lo, hi, common_lo, common_hi, kv_tile, anchor)
        steps = -(-(hi - first) // kv_tile)
        last0 = min(start + half, group_len) - 1
        _, common_lo0, hi0 = key_range(axis, pattern, last0)
        end0 = min(-(-(hi0 - first) // kv_tile), steps)
        inside += tiles_inside(first, end0, kv_tile, common_lo0, common_hi) / 2
        if start + half < group_len:
            _, lo1, common_hi1 = key_range(axis, pattern, start + half)
            begin1 = (lo1 - first) // kv_tile
            inside += tiles_inside(first + begin1 * kv_tile, steps - begin1, kv_tile, common_lo, common_hi1) / 2
        else:
            begin1 = steps
        visited += (end0 + steps - begin1) / 2
    return visited, inside


def gluon_forward_cost(problem: Problem, q: Sequence[int], kv: Sequence[int], split: int, split_walk: bool,
                       speed: float) -> float:
    """``forward_cost`` of the Gluon forward on these boxes, cut along axis ``split``: with the
    split walk, that axis' steps are each half's own (_axis_split_steps)."""
    per_axis = _axis_walks(problem, q, kv)
    if split_walk:
        per_axis[split] = _axis_split_steps(problem.axes[split], problem.pattern, q[split], kv[split], ANCHOR_TILES)
    return _walk_cost(per_axis, q, kv, speed)


def _gluon_cuts(q: Sequence[int], split_walk: bool) -> List[int]:
    """Axes a query box may be cut along into the consumers' halves: any of at least two queries
    with the split walk (the halves are boxes of their own), else the slowest such axis (where the
    cut does not change the work)."""
    cuts = [axis for axis, extent in enumerate(q) if extent >= 2]
    return cuts if split_walk else cuts[:1]


@lru_cache(maxsize=256)
def gluon_forward_boxes(problem: Problem) -> Optional[GluonBoxes]:
    """The Gluon forward's tiling: of GLUON_FORWARD_SPEEDS' walks and key-tile sizes, the boxes of
    GLUON_FORWARD_TOKENS queries and of those keys, and the cut, of least gluon_forward_cost at
    that tiling's speed; its cost adds the programs' GLUON_PROGRAM_STEPS. None where the cheapest
    boxes hold fewer tokens than that (the grid's axes are too short for them). A dilated
    problem's tiling is its regrouping's (gluon_regroup.py; None where it has none)."""
    regrouping = _gluon_regrouping(problem)
    if regrouping is None:
        return None
    return _cheapest_gluon_boxes(regrouping.problem, GLUON_FORWARD_SPEEDS)


def _cheapest_gluon_boxes(problem: Problem, speeds: Dict[Tuple[bool, int], float]) -> Optional[GluonBoxes]:
    """``gluon_forward_boxes`` of an undilated problem over the tilings of ``speeds``."""
    best = None
    # the token rule here: window-relative boxes moved the 3-D issue row's tiling and ran it 1.19x
    # slower (THIN_RELATIVE_TO_WINDOW)
    queries = _shapes(problem, GLUON_FORWARD_TOKENS, window_relative=False)
    for (split_walk, keys), speed in speeds.items():  # (ties go to the first listed)
        key_boxes = _shapes(problem, keys, window_relative=False)
        for q in queries:
            for kv in key_boxes:
                for split in _gluon_cuts(q, split_walk):
                    cost = gluon_forward_cost(problem, q, kv, split, split_walk, speed)
                    if best is None or cost < best.cost:
                        best = GluonBoxes(cost, q, kv, split, split_walk)
    if (best is None or math.prod(best.q) != GLUON_FORWARD_TOKENS
            or (best.split_walk, math.prod(best.kv)) not in speeds):
        return None
    programs = math.prod(-(-a.length // t) for a, t in zip(problem.axes, best.q))
    overhead = programs * GLUON_PROGRAM_STEPS * GLUON_FORWARD_TOKENS * 128 / GLUON_FORWARD_SPEED
    return best._replace(cost=best.cost + overhead)


def set_gluon_forward_tiling(speeds: Dict[Tuple[bool, int], float], slots: Optional[Dict[Tuple[bool, int], int]] = None,
                             regroup_dilated: Optional[bool] = None, persistent: Optional[bool] = None) -> None:
    """Make the Gluon forward weigh the tilings of ``speeds`` ((split walk, key-tile tokens) ->
    speed), with ``slots`` ring slots per tiling, GLUON_REGROUP_DILATED and GLUON_PERSISTENT where
    given (benchmarks and tests that compare tilings; callers restore the old values:
    ``gluon_forward_tiling()`` returns them). The cached tilings and defaults are dropped; launch
    plans made before keep theirs (fast_launch.clear_plans drops them)."""
    global GLUON_FORWARD_SPEEDS, GLUON_RING_SLOTS, GLUON_REGROUP_DILATED, GLUON_PERSISTENT
    GLUON_FORWARD_SPEEDS = dict(speeds)
    GLUON_RING_SLOTS = dict(slots or GLUON_RING_SLOTS)
    if regroup_dilated is not None:
        GLUON_REGROUP_DILATED = regroup_dilated
    if persistent is not None:
        GLUON_PERSISTENT = persistent
    gluon_forward_boxes.cache_clear()
    getattr(default_config, "cache_clear", lambda: None)()  # (tests may have swapped it for a wrapper)


def use_gluon_tiling(name: str) -> None:
    """Make the Gluon forward take GLUON_TILINGS[name] only (at GLUON_FORWARD_SPEED, dilated
    problems regrouped), for benchmarks and tests that compare tilings."""
    kind, slots, persistent = GLUON_TILINGS[name]
    set_gluon_forward_tiling({kind: GLUON_FORWARD_SPEED}, {**GLUON_RING_SLOTS, kind: slots}, regroup_dilated=True,
                             persistent=persistent)


def gluon_forward_tiling() -> Tuple[Dict[Tuple[bool, int], float], Dict[Tuple[bool, int], int], bool, bool]:
    """The settings ``set_gluon_forward_tiling`` takes, as they are now."""
    return dict(GLUON_FORWARD_SPEEDS), dict(GLUON_RING_SLOTS), GLUON_REGROUP_DILATED, GLUON_PERSISTENT


def gluon_forward_chosen(problem: Problem, fwd: Dict) -> bool:
    """Whether the default forward is the Gluon kernel's rather than ``fwd`` (the Triton
    forward's tiles): by forward_cost, each at its block's speed."""
    rate = GLUON_HEAD_DIM_RATE.get(problem.head_dim)
    if not gluon_forward_problem(problem) or rate is None:
        return False
    gluon = gluon_forward_boxes(problem)
    if gluon is None:
        return False
    block = (math.prod(fwd["q"]), math.prod(fwd["kv"]))
    triton_speed = FORWARD_BLOCKS[bool(fwd["tma"])].get(block, (None, None, 1.0))[2]
    # per head of the problem: forward_cost counts dilation group 0's walks, the regrouping's
    # cost every group but those of the last axis, which became heads
    triton_cost = forward_cost(problem, fwd["q"], fwd["kv"], triton_speed) * dilation_groups(problem)
    return gluon.cost / rate * _gluon_regrouping(problem).heads_factor < triton_cost


# The Gluon dK/dV pass (gluon_dkdv_kernel.py): the forward's producer warp and two consumer
# warpgroups over the Triton dK/dV kernel's walk and tiles (a resident box of 64 keys, streamed
# boxes of 64 queries), the consumers taking the steps in turn. On the H100 (2026-12-06 22:29 UTC,
# RESULTS.md "The Gluon dK/dV pass") the backward ran 1.00-1.06x the Triton kernel's where a
# program walks GLUON_DKDV_MIN_STEPS steps or more (query boxes times query heads of the kv
# head), 0.96-1.02x from 15 to 35 and 0.81-0.95x below 10: its program has one block a
# multiprocessor, whose prologue (K and V) and epilogue (the consumers' sums meeting in shared
# memory) short walks feel, where the Triton kernel runs two or three.
GLUON_DKDV = True
GLUON_DKDV_HEAD_DIMS = (64, 128)
GLUON_DKDV_TOKENS = 64  # keys of the resident box, queries of a streamed one
GLUON_DKDV_MIN_STEPS = 36


def gluon_dkdv_tiles(problem: Problem, dkdv: Dict) -> bool:
    """Whether the Gluon dK/dV pass computes this problem on these tiles (GLUON_DKDV_TOKENS each)."""
    return (_gluon_features(problem, GLUON_DKDV_HEAD_DIMS) and math.prod(dkdv["q"]) == GLUON_DKDV_TOKENS
            and math.prod(dkdv["kv"]) == GLUON_DKDV_TOKENS)


def key_major_steps(problem: Problem, kv: Sequence[int], q: Sequence[int]) -> float:
    """Steps a program of the dK/dV kernel walks, on average over the grid: query tiles ``q`` past
    its key tile ``kv`` (group 0's, as ``_axis_query_steps`` counts them), times the query heads
    that share a kv head."""
    per_axis = [_axis_query_steps(a, problem.pattern, u, t, ANCHOR_TILES) for a, u, t in zip(problem.axes, kv, q)]
    key_tiles = math.prod(-(-a.group_length(0) // u) for a, u in zip(problem.axes, kv))
    return math.prod(visited for visited, _ in per_axis) / key_tiles * (problem.heads // problem.kv_heads)


def gluon_dkdv_chosen(problem: Problem, dkdv: Dict) -> bool:
    """Whether the default dK/dV pass is the Gluon kernel's on ``dkdv``'s tiles: where they are
    its tiles and its programs walk at least GLUON_DKDV_MIN_STEPS steps."""
    return (GLUON_DKDV and gluon_dkdv_tiles(problem, dkdv)
            and key_major_steps(problem, dkdv["kv"], dkdv["q"]) >= GLUON_DKDV_MIN_STEPS)


# The Gluon dQ pass (gluon_dq_kernel.py): the Gluon forward's whole walk (boxes of 128 queries
# cut into two consumers' halves that share each key tile, a persistent grid of the host's
# schedule) with the Triton dQ kernel's arithmetic; it writes the statistics rows, as that kernel
# does. Its key tiles hold GLUON_DQ_KEYS keys: a consumer holds dQ (64 x D float32) and a tile's S
# and dP, and at 128 channels on 128-key tiles ptxas serialised every wgmma for want of registers
# (C7512), so those walk 64-key tiles. (At 64 channels 128-key tiles build without serialising,
# 44 B of scalars spilled: untimed as yet.) Ring slots by head dim: four at 128 channels (the
# query and dO halves, 64 KiB, and four K/V slots, 128 KiB: 192 of a block's 227 KiB), four at 64.
#
# On the H100 (2026-12-07 14:46 UTC, RESULTS.md "The Gluon dQ pass") the backward ran 1.03-1.07x
# the Triton dQ kernel's at 128 channels on walks of 16 key tiles and more, 0.99x on 4 (16x16
# stride 16) and 0.91x on 6 (16x16 windows); at 64 channels 0.96-1.00x. So the default takes it
# at 128 channels on walks of GLUON_DQ_MIN_STEPS tiles or more; tuning weighs it elsewhere.
GLUON_DQ = True
GLUON_DQ_HEAD_DIMS = (64, 128)
GLUON_DQ_DEFAULT_HEAD_DIMS = (128, )
GLUON_DQ_MIN_STEPS = 12
GLUON_DQ_KEYS = {128: 64, 64: 64}  # key-tile tokens by head dim (those the GPU tests and timings ran)
GLUON_DQ_RING_SLOTS = {128: 4, 64: 4}
GLUON_DQ_PERSISTENT = True
# Up to this rank a step forms P before the window's mask (zeroing it after, which lets ptxas put
# all of a tile's exp2s under dP); 3-D problems mask the scores first. On the H100 (2026-12-07
# 17:50 UTC, RESULTS.md "The exp2 split and P before the mask") P first ran the backward 1.08x on
# 1-D, 1.01-1.03x on the 2-D rows and 0.95-0.96x on both 3-D rows, whose tiles mostly cross the
# window on two or three axes.
GLUON_DQ_EXP_FIRST_MAX_RANK = 2


@lru_cache(maxsize=256)
def gluon_dq_boxes(problem: Problem) -> Optional[GluonBoxes]:
    """The Gluon dQ pass's tiling: the whole walk's cheapest boxes of 128 queries and
    GLUON_DQ_KEYS keys, as the Gluon forward weighs them; None for dilated problems, other head
    dims and grids too short for 128-query boxes."""
    if any(a.dilation > 1 for a in problem.axes):
        return None
    keys = GLUON_DQ_KEYS.get(problem.head_dim)
    return None if keys is None else _cheapest_gluon_boxes(problem, {(False, keys): GLUON_FORWARD_SPEED})


def gluon_dq_problem(problem: Problem) -> bool:
    """Whether the Gluon dQ pass computes this problem (the Gluon kernels' features, heads of
    GLUON_DQ_HEAD_DIMS channels, boxes that fit the grid)."""
    return _gluon_features(problem, GLUON_DQ_HEAD_DIMS) and gluon_dq_boxes(problem) is not None


def gluon_dq_chosen(problem: Problem) -> bool:
    """Whether the default dQ pass is the Gluon kernel's: where it takes the problem, at
    GLUON_DQ_DEFAULT_HEAD_DIMS channels, on walks of GLUON_DQ_MIN_STEPS key tiles or more."""
    if not (GLUON_DQ and problem.head_dim in GLUON_DQ_DEFAULT_HEAD_DIMS and gluon_dq_problem(problem)):
        return False
    boxes = gluon_dq_boxes(problem)
    return steps_per_tile(problem, boxes.q, boxes.kv) >= GLUON_DQ_MIN_STEPS


# HALOATTN_DETERMINISTIC=0 allows configs whose backward adds dQ with atomics in the KV-major pass
# (``"dkdv": {"atomic_dq": true}``: one pass, 5 matrix products per pair instead of 7, rounding that
# varies from run to run; ``"tma_dq": false`` forces element-wise atomics instead of bulk
# reductions, for measurements). They join the tuning candidates; the default never uses them,
# because on the H100 they were faster on one benchmark problem only (RESULTS.md, "Atomic dQ").
DETERMINISTIC_ENV = "HALOATTN_DETERMINISTIC"


def atomic_dq_allowed() -> bool:
    """Whether the user allowed a non-deterministic backward, and torch's deterministic mode
    (``torch.use_deterministic_algorithms(True)``) does not forbid it."""
    return os.environ.get(DETERMINISTIC_ENV, "1") == "0" and not torch.are_deterministic_algorithms_enabled()


def pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# Value tiles of problems with additional tokens are at least this wide. On Hopper, Triton 3.6
# compiles the kernels' additional-token loop (after the key walk) with value tiles of 16 or 32
# columns into reads of the wrong shared memory: infinite outputs, or an illegal address, on a
# random GPU test (RESULTS.md, 2026-11-26). Tiles padded to 64 columns (masked off in loads and
# stores) avoid the miscompiled shape, at the cost of a wider P·V product on those problems only.
EXTRA_MIN_VALUE_BLOCK = 64


def value_block(problem: Problem) -> int:
    """BLOCK_DV, the value tile width of every kernel for this problem."""
    block = max(16, pow2_ceil(problem.value_dim))
    return max(block, EXTRA_MIN_VALUE_BLOCK) if problem.extra_tokens else block


def head_split(dim: int) -> Tuple[int, int]:
    """``(block, tail)``: the widths the kernels multiply a head of ``dim`` channels in. Triton's
    tiles are powers of two, so one block pads the head to the next one (tail 0). Where ``dim``
    is at most a quarter past the largest power of two below it, that block and a tail of its own
    power-of-two width (at least 16, tl.dot's least) are taken instead: 160 channels as 128 + 32,
    not 256; 80 as 64 + 16, not 128 (the kernels' TAIL_D / TAIL_DV). Only tails the head fills
    (80, 144, 160): a value dim of 72 (64 + 16 with 8 channels masked) came out wrong in
    bfloat16 on 64-query tiles on an H200 (errors 0.2-0.4; RESULTS.md "Random problems through
    the compiled kernels"), so such dims keep one padded block. Measured on an H200
    (RESULTS.md, "Off-list shapes"): forwards 1.64-1.84x faster at 160, 1.05-1.18x at 80,
    backwards 1.14-1.16x and 1.33x; a tail of half the block was no faster than the padding
    (forwards at 96 = 64 + 32: 0.81-0.98x, 192 = 128 + 64: 0.93-1.03x), so those keep one block."""
    padded = max(MIN_TILE, pow2_ceil(dim))
    block = padded // 2
    tail = max(MIN_TILE, pow2_ceil(dim - block)) if dim > block else 0
    if tail == 0 or 4 * tail > block or block + tail != dim:
        return padded, 0
    return block, tail


def head_blocks(problem: Problem, split: bool = True) -> Tuple[int, int, int, int]:
    """``(BLOCK_D, TAIL_D, BLOCK_DV, TAIL_DV)`` of the neighbourhood kernels (forward, dQ, dK/dV):
    head and value dims split by head_split, unless ``split`` is off (a config's
    ``split_heads``) or the problem has additional tokens (their loops take one padded block,
    value_block)."""
    if not split or problem.extra_tokens:
        return max(MIN_TILE, pow2_ceil(problem.head_dim)), 0, value_block(problem), 0
    return (*head_split(problem.head_dim), *head_split(problem.value_dim))


def splits_heads(problem: Problem) -> bool:
    """Whether the default kernels take this problem's head or value dim as a block and a tail."""
    return any(head_blocks(problem, SPLIT_HEADS)[1::2])


def group_extents(problem: Problem) -> List[int]:
    """Largest dilation group length per axis (group 0): ``ceil(L / Dl)``."""
    return [-(-a.length // a.dilation) for a in problem.axes]


def fit(shape: Sequence[int], extents: Sequence[int], tokens: int) -> List[int]:
    """A box of ``tokens`` tokens (a power of two) shaped like ``shape`` but no longer on an axis
    than that axis' (power-of-two rounded) extent; freed factors go to the fastest axes first."""
    caps = [pow2_ceil(e) for e in extents]
    tile = [min(int(s), c) for s, c in zip(shape, caps)]
    for axis in reversed(range(len(tile))):
        while math.prod(tile) < tokens and tile[axis] < caps[axis]:
            tile[axis] *= 2
    while math.prod(tile) > tokens:
        axis = max(range(len(tile)), key=lambda a: tile[a])
        tile[axis] //= 2
    while math.prod(tile) < MIN_TILE:
        tile[-1] *= 2
    return tile


def walk_start(lo: int, hi: int, common_lo: int, common_hi: int, tile: int, anchor: bool) -> int:
    """Host twin of the kernels' ``index_math.tile_start``: where the walk over ``[lo, hi)`` in
    ``tile``-wide tiles starts, anchored at ``common_lo`` where that keeps the step count and the
    common range holds a whole tile."""
    if anchor and common_hi - common_lo >= tile:
        anchored = lo - (-(common_lo - lo)) % tile
        if -(-(hi - anchored) // tile) == -(-(hi - lo) // tile):
            return anchored
    return lo


def tiles_inside(first: int, steps: int, tile: int, common_lo: int, common_hi: int) -> int:
    """How many of the ``steps`` tiles from ``first`` lie inside ``[common_lo, common_hi)``."""
    return sum(common_lo <= first + j * tile and first + (j + 1) * tile <= common_hi for j in range(steps))


@lru_cache(maxsize=4096)
def axis_tile_steps(axis: Axis, pattern: str, q_tile: int, kv_tile: int, anchor: bool) -> List[Tuple[int, int]]:
    """Per query tile of group 0 on one axis (in order), its walk's key-tile steps on that axis
    and how many of them lie inside the tile's common range (no mask on this axis).
    (``key_range`` takes grid coordinates: group 0's coordinate ``x`` is token ``x * dilation``.)"""
    group_len = axis.group_length(0)
    out = []
    for start in range(0, group_len, q_tile):
        last = min(start + q_tile, group_len) - 1
        _, lo, common_hi = key_range(axis, pattern, start * axis.dilation)
        _, common_lo, hi = key_range(axis, pattern, last * axis.dilation)
        first = walk_start(lo, hi, common_lo, common_hi, kv_tile, anchor)
        steps = -(-(hi - first) // kv_tile)
        out.append((steps, tiles_inside(first, steps, kv_tile, common_lo, common_hi)))
    return out


def _axis_steps(axis: Axis, pattern: str, q_tile: int, kv_tile: int, anchor: bool) -> Tuple[int, int]:
    """``axis_tile_steps`` summed over the axis' query tiles: (steps visited, steps inside)."""
    per_tile = axis_tile_steps(axis, pattern, q_tile, kv_tile, anchor)
    return sum(steps for steps, _ in per_tile), sum(inside for _, inside in per_tile)


def forward_cost(problem: Problem, q: Sequence[int], kv: Sequence[int], speed: float) -> float:
    """Relative time of the forward with these tiles: computed pairs over the block size's speed,
    plus MASKED_AXIS_COST of a step for every axis a step's key tile crosses (it pays that axis'
    compares). Per axis the query tiles' steps are independent, so the step counts multiply and
    a step crosses axis ``a`` with probability ``1 - inside_a / visited_a``."""
    return _walk_cost(_axis_walks(problem, q, kv), q, kv, speed)


def _walk_cost(per_axis: Sequence[Tuple[int, int]], resident: Sequence[int], streamed: Sequence[int],
               speed: float) -> float:
    """The cost model of forward_cost from each axis' (steps visited, steps inside) of a walk."""
    steps = math.prod(visited for visited, _ in per_axis)
    crossings = sum(1 - inside / visited for visited, inside in per_axis)
    return steps * (1 + MASKED_AXIS_COST * crossings) * math.prod(resident) * math.prod(streamed) / speed


@lru_cache(maxsize=4096)
def _axis_query_steps(axis: Axis, pattern: str, kv_tile: int, q_tile: int, anchor: bool) -> Tuple[int, int]:
    """``_axis_steps`` of the dK/dV kernel (the host twin of index_math.query_walk): query-tile
    steps on one axis summed over the key tiles of group 0, and how many of them lie inside the
    tile's common range (the queries that see every key of it)."""
    group_len = axis.group_length(0)
    inverse = window_query_range if pattern == "window" else query_range
    visited = inside = 0
    for start in range(0, group_len, kv_tile):
        last = min(start + kv_tile, group_len) - 1
        lo, common_hi = inverse(axis, start, group_len)
        common_lo, hi = inverse(axis, last, group_len)
        first = walk_start(lo, hi, common_lo, common_hi, q_tile, anchor)
        steps = -(-(hi - first) // q_tile)
        visited += steps
        inside += tiles_inside(first, steps, q_tile, common_lo, common_hi)
    return visited, inside


def key_major_cost(problem: Problem, kv: Sequence[int], q: Sequence[int], speed: float = 1.0) -> float:
    """``forward_cost`` of the dK/dV kernel: resident key tiles ``kv`` walking streamed query
    tiles ``q`` by the inverse rule."""
    per_axis = [_axis_query_steps(a, problem.pattern, u, t, ANCHOR_TILES) for a, u, t in zip(problem.axes, kv, q)]
    return _walk_cost(per_axis, kv, q, speed)


def _axis_walks(problem: Problem, q: Sequence[int], kv: Sequence[int]) -> List[Tuple[int, int]]:
    """``_axis_steps`` of every axis for these forward tiles."""
    return [_axis_steps(a, problem.pattern, t, u, ANCHOR_TILES) for a, t, u in zip(problem.axes, q, kv)]


def steps_per_tile(problem: Problem, q: Sequence[int], kv: Sequence[int]) -> float:
    """Key tiles a query tile of the forward walks, on average over the grid (group 0's query
    tiles, as ``_axis_steps`` counts them)."""
    tiles = math.prod(-(-a.group_length(0) // t) for a, t in zip(problem.axes, q))
    return math.prod(visited for visited, _ in _axis_walks(problem, q, kv)) / tiles


def packed_pairs(problem: Problem, q: Sequence[int], kv: Sequence[int], descriptors: bool) -> int:
    """(batch, head) pairs per forward program (see PACK_MAX_STEPS): a power of two, 1 where
    walks are longer, K/V come through descriptors, the problem has additional tokens, or packing
    would leave too few programs to fill the GPU."""
    if descriptors or problem.extra_tokens or steps_per_tile(problem, q, kv) > PACK_MAX_STEPS:
        return 1
    pairs = problem.batch * problem.heads
    tiles = math.prod(a.dilation * -(-a.group_length(0) // t) for a, t in zip(problem.axes, q))
    min_programs = PACK_MIN_WAVES * multiprocessors(problem.device)
    pack = 1
    while 2 * pack <= min(PACK_MAX, pairs) and tiles * -(-pairs // (2 * pack)) >= min_programs:
        pack *= 2
    return pack


# Whether the thin-box rule of the Triton kernels' boxes measures a box's axes against the window
# on them too (a 2 x 32 box is as thin as a 32 x 32 box is under a 3 x 63 window: its key tiles
# cross the union's border alike), not in tokens only: the Triton forward then computes 1.1-1.8x
# fewer pairs on anisotropic windows (3 x 3 x 31, 15 x 127 causal, 3 x 63). Measured on the H100
# (2026-12-07 23:04 UTC, every kernel's boxes relative, benchmarks/gpu_run_thin_boxes.sh):
# forward 1.24x / 1.39x / 1.14x, backward 1.42x / 1.19x / 1.13x on those three, the 3-D 3x7x7
# extra even (forward 1.03x, backward 0.98x); but the Gluon forward's tiling of the 3-D issue row moved and ran
# 1.19x slower, so the Gluon forward's boxes keep the token rule (_cheapest_gluon_boxes).
THIN_RELATIVE_TO_WINDOW = True


def _thinness(wide: List[Tuple[int, float]], relative: bool) -> float:
    """Longest over shortest extent of a box on its axes of window above 1 ((tokens, tokens per
    window token) per axis): in tokens, or if ``relative``, the lesser of that and the same in
    window lengths (a box shaped like its window is never thin)."""
    if not wide:
        return 1.0
    tokens, windows = zip(*wide)
    thin = max(tokens) / min(tokens)
    return min(thin, max(windows) / min(windows)) if relative else thin


def _shapes(problem: Problem, tokens: int, window_relative: Optional[bool] = None) -> List[Tuple[int, ...]]:
    """Power-of-two boxes of exactly ``tokens`` tokens that fit the problem's grid (its dilation
    groups; deduplicated), thin ones left out (``window_relative``: whether thinness is measured
    against the window too; THIN_RELATIVE_TO_WINDOW where not given)."""
    relative = THIN_RELATIVE_TO_WINDOW if window_relative is None else window_relative
    extents = group_extents(problem)
    logs = range(int(math.log2(tokens)) + 1)
    thinness = {}
    for combo in itertools.product(logs, repeat=problem.rank):
        if sum(combo) == int(math.log2(tokens)):
            shape = tuple(fit([1 << c for c in combo], extents, tokens))
            # An axis of window 1 has no border to cross (a query sees one key there), and one
            # token deep is the box it wants: without it axial attention (window 1 x 63) took
            # boxes 4 rows deep, 4.6x the pairs it attends, and a dilated problem's regrouping
            # (gluon_regroup.py) boxes spanning two dilation groups, 2.7x.
            wide = [(t, t / min(a.window, e)) for t, e, a in zip(shape, extents, problem.axes)
                    if e > 1 and a.window > 1]
            thinness[shape] = _thinness(wide, relative)
    # Thin boxes put most key tiles on the union's border (per-pair masks): keep them out, unless
    # the grid leaves no other (a 96 x 2 grid with a window of 2 on its short axis has only
    # boxes 16 or more times longer than deep).
    limit = max(8.0, min(thinness.values()))
    return sorted(shape for shape, thin in thinness.items() if thin <= limit)


def descriptor_loads(problem: Problem) -> bool:
    """Whether the forward reads K/V through tensor descriptors by default: 16-bit data with large
    head dims on a GPU with a copy engine (elsewhere the tiles measured with pointer loads are
    chosen). The launcher still checks alignment and offsets, and falls back to pointer loads."""
    return (problem.dtype.itemsize == 2 and problem.head_dim >= DESCRIPTOR_MIN_HEAD_DIM
            and tiles_for_copy_engine(problem.device))


def backward_descriptor_loads(problem: Problem) -> bool:
    """Whether the backward streams its tiles through tensor descriptors by default: 16-bit data
    with head dims in BACKWARD_DESCRIPTOR_HEAD_DIMS on a GPU with a copy engine."""
    low, high = BACKWARD_DESCRIPTOR_HEAD_DIMS
    dims = (problem.head_dim, problem.value_dim)
    return (problem.dtype.itemsize == 2 and low <= min(dims) and max(dims) <= high
            and tiles_for_copy_engine(problem.device))


def waits_for_dk(problem: Problem, descriptors: bool) -> bool:
    """Whether dK/dV waits for its last product within each step (dkdv_kernel, WAIT_DK): where
    ptxas would otherwise serialise the loop's wgmmas: with descriptor loads at head dims above
    64 (measured on an H100, 2026-11-26: 1.04-1.12x the backward at D=128, 0.98x at D=64, where
    nothing was serialised), and on the 8-warp tiles above head dim 128 (wide_backward; with
    waits_for_dq 1.06x at D=192 and 256 on an H200, 2026-11-29)."""
    return (descriptors and max(problem.head_dim, problem.value_dim) > 64) or wide_backward(problem)


# Streamed tokens of the backward on split heads above head dim 128 (144, 160: their 128 + 16 /
# 32 channels let 128 resident tokens fit the shared memory, where a 256-wide padding did not):
# 128 resident past 32 streamed ran a 3-D 5x9x9, D = 160 backward in 4.96 ms against 6.39-6.59 for
# every 64-resident candidate (`haloattn tune --backward` on an H200, 2026-11-29, RESULTS.md
# "Off-list shapes"); as the default, 4.05 ms against 5.66 ms for 64 / 64 (bench_wide_backward_tiles.py),
# and forward+backward within 1.05x of the best of 30 tuning candidates ("Random problems through
# the compiled kernels").
WIDE_SPLIT_STREAM = 32
# 16-bit heads wider than 128 channels: the backward's (resident tokens, streamed tokens, warps)
# in both kernels, by width. Measured on an H200 (2026-12-01, bench_wide_backward_tiles.py;
# RESULTS.md "Wide heads' backward tiles"), the dQ and dK/dV kernels timed apart on every variant,
# then the rule against the tiles before it on fourteen problems:
# * 129-160 channels (split 128 + 16 / 32): 64 / 32 tokens on 4 warps, 1.10-1.33x the 8-warp
#   128 / 32 tiles on four problems (dQ up to 1.77x); they are also the tiles the small-window
#   rule then weighs: on three problems that rule had taken (6x4x17, 6x6x6, 32x5 windows) they
#   ran 1.06-1.19x faster than its tiles, and the rule still takes a 3x3 window (where they ran
#   0.77x its).
#   Their dK/dV kernel does not wait for its dK product within a step (waits_for_dk is for the
#   8-warp loops ptxas serialises): waiting, it ran 1.19-1.25x slower on those three problems.
# * 193-256 channels: 32 / 64 tokens on 4 warps where the default's tiles compute at least
#   WIDE_256_BACKWARD_RATIO times their pairs (forward_cost): 1.21-1.25x at 1.40-1.43,
#   0.95-0.96x at 1.00 (large 2-D and 1-D windows keep 64 / 64 on 8 warps); weighed after the
#   small-window rule, which was measured there first.
# * 161-192 channels (padded to 256) keep their tiles: 128 / 32 for dQ ran 1.27x on one problem
#   and 0.97x on another.
WIDE_160_BACKWARD_TILES = (64, 32, 4)
WIDE_256_BACKWARD_TILES = (32, 64, 4)
WIDE_256_BACKWARD_RATIO = 1.3
# Whether the two rules above apply (False: the tiles before them, for benchmarks to compare).
WIDE_16BIT_BACKWARD_RULES = True
# 16-bit heads wider than 128 channels: the forward's 64-query programs take two stages and the
# widest key tile, halved down to WIDE_FORWARD_MIN_KEYS, with which two programs share a
# multiprocessor's shared memory (half the device's tile budget). The cost model's tiles on three
# stages (3-D, 160 channels: 143 KiB) or 64 keys (192-256 channels: 120-160 KiB) ran one program a
# multiprocessor, each waiting out its own loads. On an H200 (2026-12-05,
# bench_wide_forward_tiles.py; RESULTS.md "The wide forward: two programs a multiprocessor"):
# 64 x 64 on two stages ran the 3-D 5x9x9, 160-channel forward 1.49x faster, 64 x 32 the 2-D
# 12x12 ones at 192 and 256 channels 1.25x and 1.37x, and the 1-D 4096-token causal window at
# 256 channels as fast (1.00x).
WIDE_FORWARD_MIN_KEYS = 32
WIDE_16BIT_FORWARD_RULE = True
# ...but 1-D problems at 161-256 channels take 128 queries x 64 keys on 8 warps (one program a
# multiprocessor) wherever those tiles' cost (forward_cost: computed pairs and masked steps) is at
# most WIDE_1D_MAX_COST_RATIO times the two-program tiles': on 1-D windows the wider walk costs
# few extra pairs, and per computed pair it ran 1.16-1.34x faster. Measured (H100, 2026-12-05,
# bench_wide_forward_tiles.py; RESULTS.md "Triton's own ceiling beside the kernel"): 1.02-1.27x
# (four of them 1.09x or more) on the five 1-D problems at cost ratios 1.02-1.13 (windows of 511
# to 4096 keys, GQA, dilation), 0.90x and 1.01x at ratios 1.40 (window 127) and 1.33 (stride 64);
# at 160 channels, where the two-program tiles keep 64 keys, 0.93x.
WIDE_1D_FORWARD_TILES = (128, 64, 8, 2)  # queries, keys, warps, stages
WIDE_1D_MIN_WIDTH = 161
WIDE_1D_MAX_COST_RATIO = 1.15
# The forward never runs on one stage: on an H200 (2026-12-05, probe_forward_configs.py --set
# stage_one) Triton's one-stage forward of heads split as 160 = 128 + 32 channels read an illegal
# address on a 3-D problem and returned silently wrong outputs on three others (ranks 1-3), where
# two stages, and on one stage unsplit heads and 192 = 128 + 64, ran right. A tuning candidate
# from 2026-12-04 to 2026-12-05, never a default; a cache entry asking for one stage runs two.
MIN_FORWARD_STAGES = 2


def waits_for_dq(problem: Problem) -> bool:
    """Whether the dQ kernel waits for its dQ products within each step (dq_kernel, WAIT_DQ):
    where ptxas would otherwise serialise the loop's wgmmas (wide_backward)."""
    return wide_backward(problem)


def wide_backward(problem: Problem) -> bool:
    """Head dims above 128: the backward's 8-warp tiles, whose loops ptxas serialises (every wgmma
    waiting for the one before) unless each step waits for its dQ or dK products."""
    return max(problem.head_dim, problem.value_dim) > 128


def narrow_16bit(problem: Problem) -> bool:
    """16-bit products on heads of at most NARROW_HEAD_DIM channels (value heads included)."""
    return problem.dtype.itemsize == 2 and max(problem.head_dim, problem.value_dim) <= NARROW_HEAD_DIM


def _pointer_width_16bit_on_copy_engine(problem: Problem) -> bool:
    """16-bit heads of at most POINTER_BLOCK_MAX_HEAD_DIM channels on a GPU with a copy engine,
    where NARROW_128_BLOCK_SPEED was measured."""
    return (problem.dtype.itemsize == 2 and max(problem.head_dim, problem.value_dim) <= POINTER_BLOCK_MAX_HEAD_DIM
            and tiles_for_copy_engine(problem.device))


@lru_cache(maxsize=256)
def _best_forward(problem: Problem, descriptors: bool) -> Tuple[Tuple[int, ...], Tuple[int, ...], int, int]:
    """Query and key tile shapes, warps and stages of the cheapest forward for this problem."""
    blocks = dict(FORWARD_BLOCKS[descriptors])
    if narrow_16bit(problem):  # (read by pointer: descriptors start at DESCRIPTOR_MIN_HEAD_DIM)
        blocks.update(NARROW_FORWARD_BLOCKS)
    best = _cheapest_forward(problem, blocks)
    if NARROW_128_BLOCK_RULE and not descriptors and _pointer_width_16bit_on_copy_engine(problem):
        if steps_per_tile(problem, best[0], best[1]) > _narrow_128_keep_max_steps(problem):
            warps, stages, _ = blocks[(128, 128)]
            best = _cheapest_forward(problem, {**blocks, (128, 128): (warps, stages, NARROW_128_BLOCK_SPEED)})
    return best


def _narrow_128_keep_max_steps(problem: Problem) -> float:
    """Walks of at most this many 128 x 128 tiles keep that block's speed (NARROW_128_KEEP_MAX_STEPS)."""
    return max(NARROW_128_KEEP_MAX_STEPS, PACK_MAX_STEPS) if narrow_16bit(problem) else NARROW_128_KEEP_MAX_STEPS


def _cheapest_forward(problem: Problem, blocks: Dict) -> Tuple[Tuple[int, ...], Tuple[int, ...], int, int]:
    """(query box, key box, warps, stages) of the cheapest of ``blocks`` by forward_cost."""
    best = None
    for (bm, bn), (warps, stages, speed) in blocks.items():
        cost, q, kv = _cheapest_boxes(problem, bm, bn, speed)
        if best is None or cost < best[0]:
            best = (cost, q, kv, warps, stages)
    return best[1:]


def _cheapest_boxes(problem: Problem, queries: int, keys: int, speed: float = 1.0):
    """(forward_cost, query box, key box) of the cheapest boxes of these token counts."""
    best = None
    key_boxes = _shapes(problem, keys)
    for q in _shapes(problem, queries):
        for kv in key_boxes:
            cost = forward_cost(problem, q, kv, speed)
            if best is None or cost < best[0]:
                best = (cost, q, kv)
    return best


def _shared_bytes(kernel: str, q: int, kv: int, stages: int, d: int, dv: int, item: int) -> int:
    """Rough (conservative) shared memory of one program: the streamed operand tiles times the
    pipeline depth plus the resident ones."""
    if kernel == "fwd":
        return item * (q * d + stages * kv * (d + dv))
    if kernel == "dq":
        return item * (q * (d + dv) + stages * kv * (d + dv))
    if kernel == "jvp":
        # K, V and their tangents streamed; the resident side (Q, its tangent, the stored O and
        # the compiler's staging of P dS) bounded by twice the query rows' widths: at or above
        # every sm_90 build measured (2026-11-28, bf16: 160-384 KiB estimated for 100-332 KiB built
        # at head dims 128-256, 32-128 queries, 32-64 keys).
        return item * (stages * kv * 2 * (d + dv) + 2 * q * (d + dv))
    return item * (kv * (d + dv) + stages * q * (d + dv))


def _operand_sizes(problem: Problem, kernel: str) -> Tuple[int, int, int]:
    """Bytes per element of ``kernel``'s operand tiles, and their head and value widths as it
    takes them (forward, dQ and dK/dV: block plus tail, head_blocks; the JVP and the
    additional-token kernels: padded): the problem-side arguments of ``_shared_bytes``."""
    item = 4 if problem.dtype.itemsize == 4 else 2
    block_d, tail_d, block_dv, tail_dv = head_blocks(problem, SPLIT_HEADS and kernel in ("fwd", "dq", "dkdv"))
    return item, block_d + tail_d, block_dv + tail_dv


def _fit_shared(problem: Problem, kernel: str, cfg: Dict, budget: int = None) -> Dict:
    """Lower stages, then halve the larger block, until the program fits in the shared memory of
    the problem's device (device_limits: 200 KiB of tiles on Hopper, 72 KiB on a 99 KiB GPU), or
    in ``budget`` bytes of operand tiles where given."""
    budget = tile_shared_budget(problem.device) if budget is None else budget
    item, d, dv = _operand_sizes(problem, kernel)
    ext = group_extents(problem)
    cfg = dict(cfg)
    while _shared_bytes(kernel, math.prod(cfg["q"]), math.prod(cfg["kv"]), cfg["stages"], d, dv, item) > budget:
        if cfg["stages"] > 2:
            cfg["stages"] -= 1
            continue
        part = "q" if math.prod(cfg["q"]) >= math.prod(cfg["kv"]) else "kv"
        tokens = math.prod(cfg[part])
        if tokens <= MIN_TILE:
            break
        cfg[part] = fit(cfg[part], ext, tokens // 2)
    return cfg


# Exact float32 (no tf32): with CUDA-core products ("ieee") tl.dot keeps a product tile's
# operands and accumulators in registers, and the backward's 64-token tiles spilled (sm_90: the
# dK/dV kernel at 32 registers with 11-54 KB of spill stores at head dims 32-128; 8 KB of local
# memory a thread, which a launch reserves for every resident thread). 16-token resident and
# 32-token streamed tiles compile without spills up to head dim 256 and ran the backward
# 4.9-13.5x faster on the H100 (RESULTS.md, "Exact float32"). Three TF32 products ("tf32x3", the
# default since 2026-11-29) spill on the 16-bit tiles too and keep these (1.2-2.0x faster than on
# the 16-bit tiles, RESULTS.md "Off-list shapes"). The additional-token kernel keeps these.
EXACT_FLOAT32_RESIDENT, EXACT_FLOAT32_STREAM = 16, 32
# Per kernel and head width (up to this many channels): (resident tokens, streamed tokens, warps),
# around the shapes of the exact forward's own tiles (below). On an H200 (2026-12-01,
# bench_float32_backward_tiles.py, fourteen problems at head dims 8-256, every gradient checked)
# these were the fastest timed, or within 2 % (18 % at 8 channels, where 16 / 16 won), against
# the rule of before (16 / 32 around the 16-bit forward's shapes, on 4 warps; 8 above 128):
# one warp at 8-16 channels (dQ 2.0-3.4x, dK/dV 2.8-4.1x, the backward 2.5-3.9x faster), a 2-warp
# dQ and 32 resident keys on 4 warps at 33-64 (1.12-1.23x), the forward's shapes at 65-128
# (1.00-1.11x) and 16 streamed queries in the dK/dV kernel above 128 (1.00-1.16x). RESULTS.md,
# "Float32 tiles at every width".
EXACT_FLOAT32_BACKWARD = (
    (16, {"dq": (16, 32, 1), "dkdv": (16, 32, 1)}),
    (32, {"dq": (16, 32, 2), "dkdv": (16, 32, 4)}),
    (64, {"dq": (16, 32, 2), "dkdv": (32, 32, 4)}),
    (128, {"dq": (16, 32, 4), "dkdv": (16, 32, 4)}),
    (math.inf, {"dq": (16, 32, 4), "dkdv": (16, 16, 4)}),
)
# ...and its forward takes 16-query / 32-key tiles of its own, read by pointer, with warps by head
# width. The 16-bit cost model's tiles, whose operands three-part products hold twice, spilled
# 2-2.7 KB a thread on sm_90 at head dims 160-256 once fitted to shared memory (forwards at 3-7
# TFLOP/s in the 2026-12-01 shape sweep); 16 x 32 on 4 warps spills 60-250 bytes and ran those
# forwards 2.2-4.9x faster on an H200 (1.4-3.0x on 8 warps, 1.2-2.2x on 2). At 96-128 channels 2
# warps were fastest (1.43-1.98x the 16-bit tiles on four problems; one warp ran at 0.41-0.46x of
# two); at 8-64 one warp (mma.sync, no warpgroup to synchronise on a 16-row tile: 1.24-2.52x the
# 16-bit tiles on six problems, 1.08-1.56x two warps). RESULTS.md, "Float32 tiles at every width".
EXACT_FLOAT32_FORWARD_TILES = (16, 32)  # (queries, keys)
EXACT_FLOAT32_WIDE_HEAD_DIM = 128  # above it the forward's warps and extra_kernel_warps go up
# (up to this many channels, warps), in order
EXACT_FLOAT32_FORWARD_WARPS = ((64, 1), (EXACT_FLOAT32_WIDE_HEAD_DIM, 2), (math.inf, 4))


def exact_float32_forward_warps(problem: Problem) -> int:
    """Warps of the exact-float32 forward's own tiles (EXACT_FLOAT32_FORWARD_TILES)."""
    width = max(problem.head_dim, problem.value_dim)
    return next(warps for channels, warps in EXACT_FLOAT32_FORWARD_WARPS if width <= channels)


@lru_cache(maxsize=1024)
def default_config(problem: Problem, exact_float32: bool = False) -> Dict:
    """The heuristic default (see the module docstring). Cached per problem (it is on every
    launch's host path): callers copy before changing it, never change it in place.
    ``exact_float32``: float32 products without tf32 (see EXACT_FLOAT32_BACKWARD)."""
    if exact_float32:
        return _exact_float32_config(problem)
    config = _config_on_forward_boxes(problem)
    # After the backward's rules, which place their tiles around the cost model's forward boxes.
    if WIDE_16BIT_FORWARD_RULE and problem.dtype.itemsize == 2 and wide_backward(problem):
        config["fwd"] = _two_forward_programs_a_multiprocessor(problem, config["fwd"])
        config["fwd"] = _wide_1d_forward(problem, config["fwd"])
    if KEY_MAJOR_BOXES and key_major_boxes_apply(problem, config["dkdv"]):
        boxes = _ranked_key_major_boxes(problem, config["dkdv"])[0]
        config["dkdv"] = _fit_shared(problem, "dkdv", dict(config["dkdv"], **boxes))
    if host_descriptors_expected(problem):
        config = _on_host_descriptors(problem, config)
    return dict(config, fwd=dict(config["fwd"], gluon=gluon_forward_chosen(problem, config["fwd"])),
                dq=dict(config["dq"], gluon=gluon_dq_chosen(problem)),
                dkdv=dict(config["dkdv"], gluon=gluon_dkdv_chosen(problem, config["dkdv"])))


def host_descriptors_expected(problem: Problem) -> bool:
    """Whether the launcher will read this problem's tiles through host-built descriptors
    (host_descriptors.py), as far as the problem tells: 16-bit, undilated, a copy engine (at rank
    3 the tensors' head layout decides too; where it does not allow them, per-program
    descriptors take their place)."""
    return (host_descriptors.HOST_DESCRIPTORS and problem.dtype.itemsize == 2
            and all(a.dilation == 1 for a in problem.axes)
            and tiles_for_copy_engine(problem.device))


def _on_host_descriptors(problem: Problem, config: Dict) -> Dict:
    """``config`` with descriptor loads where host-built descriptors beat pointers (see
    HOST_DESCRIPTOR_FORWARD_MIN_HEAD_DIM): the tiles stay those chosen."""
    narrowest = min(problem.head_dim, problem.value_dim)
    widest = max(problem.head_dim, problem.value_dim)
    config = dict(config)
    fwd = config["fwd"]
    if not fwd["tma"] and fwd["pack"] == 1 and narrowest >= HOST_DESCRIPTOR_FORWARD_MIN_HEAD_DIM:
        config["fwd"] = dict(fwd, tma=True)
    dq, dkdv = config["dq"], config["dkdv"]
    # Heads narrower than the per-program rule's; and its own heads where it chose pointers for a
    # short walk on wgmma-sized tiles (64+ resident tokens, as measured; the small-window tiles,
    # which multiply on mma.sync, keep their pointers).
    narrow = widest < BACKWARD_DESCRIPTOR_HEAD_DIMS[0]
    wgmma_tiles = widest <= BACKWARD_DESCRIPTOR_HEAD_DIMS[1] and math.prod(dq["q"]) >= 64
    if not dq["tma"] and HOST_DESCRIPTOR_BACKWARD_MIN_HEAD_DIM <= narrowest and (narrow or wgmma_tiles):
        config["dq"] = dict(dq, tma=True)
        config["dkdv"] = dict(dkdv, tma=True, wait_dk=waits_for_dk(problem, True))
    return config


def _config_on_forward_boxes(problem: Problem) -> Dict:
    """The heuristic default but the wide forward's tiles (WIDE_16BIT_FORWARD_RULE,
    WIDE_1D_FORWARD_TILES) and the dK/dV kernel's own boxes (KEY_MAJOR_BOXES): every kernel on
    boxes the forward's cost chose. Not cached (default_config is): the benches
    switch the rules in here off and on."""
    ext = group_extents(problem)
    descriptors = descriptor_loads(problem)
    q, kv, warps, stages = _best_forward(problem, descriptors)
    backward_q, backward_kv = q, kv  # the backward's tiles follow these (not the short-walk tiles below)
    if narrow_16bit(problem) and math.prod(q) >= 64 and steps_per_tile(problem, q, kv) <= PACK_MAX_STEPS:
        (queries, keys), (warps, stages) = NARROW_SHORT_WALK_BLOCK
        q, kv = _cheapest_boxes(problem, queries, keys)[1:]
    if descriptors and max(problem.head_dim, problem.value_dim) <= SHORT_WALK_MAX_HEAD_DIM:
        descriptors = steps_per_tile(problem, q, kv) > SHORT_WALK_STEPS
    axis_masks = per_axis_masks(problem)
    pack = packed_pairs(problem, q, kv, descriptors)
    fwd = {"q": list(q), "kv": list(kv), "warps": warps, "stages": stages, "tma": descriptors,
           "lazy_rescale": LAZY_RESCALE, "anchor": ANCHOR_TILES, "axis_masks": axis_masks,
           "pack": pack, "split_heads": SPLIT_HEADS, "gluon": False, "exp2_split": exp2_split_every(problem)}
    # The backward streams 64-token tiles past a resident tile of the forward's query-tile shape.
    # 64 resident tokens with 4 warps were fastest or within 2 % on all ten benchmark problems
    # (H100 sweep of 2026-11-23: 1.04-1.64x faster than 128 with 8 warps, fewer wasted pairs on
    # small windows). Larger head dims keep 128 tokens and 8 warps: with 4 warps the float32
    # accumulators (two 64 x D in dK/dV) would not fit in registers.
    small = not wide_backward(problem)
    resident = fit(backward_q, ext, 64 if small else 128)
    stream = fit(backward_kv, ext, WIDE_SPLIT_STREAM if wide_backward(problem) and splits_heads(problem) else 64)
    backward_warps = 4 if small else 8
    # Small tiles where the forward's cost chose them for their fewer pairs.
    narrow = narrow_key_major(problem) and math.prod(backward_q) < 64
    if narrow:
        tokens, streamed, backward_warps = NARROW_BACKWARD_TILES
        resident, stream = (list(box) for box in _cheapest_boxes(problem, tokens, streamed)[1:])
    backward_descriptors = (backward_descriptor_loads(problem)
                            and steps_per_tile(problem, resident, stream) > BACKWARD_SHORT_WALK_STEPS)
    knobs = {"warps": backward_warps, "stages": 2, "tma": backward_descriptors,
             "anchor": ANCHOR_TILES, "axis_masks": False, "split_heads": SPLIT_HEADS}
    dq = {"q": resident, "kv": stream, **knobs, "wait_dq": waits_for_dq(problem), "gluon": False}
    dkdv = {"q": stream, "kv": resident, **knobs, "wait_dk": waits_for_dk(problem, knobs["tma"]), "gluon": False}
    if narrow_key_major(problem) and not narrow:
        dkdv["warps"] = NARROW_DKDV_WARPS
    config = {name: _fit_shared(problem, name, cfg) for name, cfg in (("fwd", fwd), ("dq", dq), ("dkdv", dkdv))}
    width = max(problem.head_dim, problem.value_dim)
    wide_rules = WIDE_16BIT_BACKWARD_RULES and problem.dtype.itemsize == 2
    if wide_rules and wide_backward(problem) and width <= 160:
        config.update(_backward_around_forward(problem, config, *WIDE_160_BACKWARD_TILES, wait_dk=False))
    if not narrow and small_window_backward(problem, config["dq"]["q"], config["dq"]["kv"]):
        config.update(_small_window_backward(problem, config))
    elif wide_rules and 192 < width <= 256:
        wide = _backward_around_forward(problem, config, *WIDE_256_BACKWARD_TILES)
        saved = (forward_cost(problem, config["dq"]["q"], config["dq"]["kv"], 1.0)
                 / forward_cost(problem, wide["dq"]["q"], wide["dq"]["kv"], 1.0))
        if saved >= WIDE_256_BACKWARD_RATIO:
            config.update(wide)
    return config


def _two_forward_programs_a_multiprocessor(problem: Problem, fwd: Dict) -> Dict:
    """``fwd`` (64 queries a program) on two stages with its key tile halved, down to
    WIDE_FORWARD_MIN_KEYS, until two programs fit the device's shared memory
    (WIDE_16BIT_FORWARD_RULE); ``fwd`` unchanged where it has other query tiles, no such key
    tile fits, or the GPU has less shared memory than Hopper."""
    # Measured on Hopper only: GPUs with less shared memory keep the cost model's tiles.
    if math.prod(fwd["q"]) != 64 or tile_shared_budget(problem.device) < HOPPER_TILE_BUDGET:
        return fwd
    budget = tile_shared_budget(problem.device) // 2
    item, d, dv = _operand_sizes(problem, "fwd")
    ext = group_extents(problem)
    kv = list(fwd["kv"])
    while _shared_bytes("fwd", 64, math.prod(kv), 2, d, dv, item) > budget:
        if math.prod(kv) // 2 < WIDE_FORWARD_MIN_KEYS:
            return fwd
        kv = fit(kv, ext, math.prod(kv) // 2)
    return dict(fwd, kv=kv, stages=2)


def _wide_1d_forward(problem: Problem, fwd: Dict) -> Dict:
    """WIDE_1D_FORWARD_TILES instead of ``fwd`` for a 1-D problem of at least WIDE_1D_MIN_WIDTH
    channels (the backend takes up to 256) on a Hopper-size GPU, where they cost at most
    WIDE_1D_MAX_COST_RATIO times ``fwd``'s tiles; ``fwd`` elsewhere."""
    if (problem.rank != 1 or max(problem.head_dim, problem.value_dim) < WIDE_1D_MIN_WIDTH
            or tile_shared_budget(problem.device) < HOPPER_TILE_BUDGET):
        return fwd
    queries, keys, warps, stages = WIDE_1D_FORWARD_TILES
    ext = group_extents(problem)
    wide = dict(fwd, q=fit(fwd["q"], ext, queries), kv=fit(fwd["kv"], ext, keys), warps=warps, stages=stages)
    if forward_cost(problem, wide["q"], wide["kv"], 1.0) > WIDE_1D_MAX_COST_RATIO * forward_cost(
            problem, fwd["q"], fwd["kv"], 1.0):
        return fwd
    return _fit_shared(problem, "fwd", wide)


def key_major_boxes_apply(problem: Problem, dkdv: Dict) -> bool:
    """Whether the dK/dV kernel may take boxes of its own (KEY_MAJOR_BOXES): 16-bit heads of at
    most 128 channels on the default's 64-token tiles with 4 warps, where it was measured."""
    return (problem.dtype.itemsize == 2 and not wide_backward(problem) and dkdv["warps"] == 4
            and math.prod(dkdv["kv"]) == 64 and math.prod(dkdv["q"]) == 64)


def _ranked_key_major_boxes(problem: Problem, dkdv: Dict) -> List[Dict]:
    """``{"kv": resident box, "q": streamed box}`` choices for the dK/dV kernel, cheapest first
    by key_major_cost: 64-token resident boxes past 64-token streamed ones (and 32-token ones up
    to KEY_MAJOR_STREAM_32_MAX_HEAD_DIM channels). ``dkdv``'s own boxes come first wherever the
    cheapest saves less than KEY_MAJOR_MIN_SAVING against them."""
    streams = [(64, 1.0)]
    if max(problem.head_dim, problem.value_dim) <= KEY_MAJOR_STREAM_32_MAX_HEAD_DIM:
        streams.append((32, KEY_MAJOR_STREAM_32_SPEED))
    ranked = sorted((key_major_cost(problem, kv, q, speed), kv, q) for kv in _shapes(problem, 64)
                    for tokens, speed in streams for q in _shapes(problem, tokens))
    own = (list(dkdv["kv"]), list(dkdv["q"]))
    boxes = [own] + [(list(kv), list(q)) for _, kv, q in ranked if (list(kv), list(q)) != own]
    if key_major_cost(problem, *own) >= KEY_MAJOR_MIN_SAVING * ranked[0][0]:
        boxes.insert(0, boxes.pop(1))
    return [{"kv": kv, "q": q} for kv, q in boxes]


def _backward_around_forward(problem: Problem, config: Dict, resident: int, streamed: int, warps: int,
                             **dkdv_knobs) -> Dict:
    """``config``'s dq and dkdv on boxes of ``resident`` and ``streamed`` tokens around the
    forward's tile shapes, on ``warps`` warps, every other knob kept but ``dkdv_knobs``, fitted to
    shared memory."""
    ext = group_extents(problem)
    r, s = fit(config["fwd"]["q"], ext, resident), fit(config["fwd"]["kv"], ext, streamed)
    return {"dq": _fit_shared(problem, "dq", dict(config["dq"], q=r, kv=s, warps=warps)),
            "dkdv": _fit_shared(problem, "dkdv", dict(config["dkdv"], q=s, kv=r, warps=warps, **dkdv_knobs))}


def _small_window_backward(problem: Problem, config: Dict) -> Dict:
    """``config``'s dq and dkdv on SMALL_WINDOW_BACKWARD_TILES."""
    return _backward_on_small_boxes(problem, config, *SMALL_WINDOW_BACKWARD_TILES)


def _backward_on_small_boxes(problem: Problem, config: Dict, tokens: int, streamed: int, warps: int) -> Dict:
    """``config``'s dq and dkdv on the cheapest boxes of ``tokens`` resident and ``streamed``
    streamed tokens with ``warps`` warps, by pointer, dK/dV not waiting within its steps (small
    tiles multiply on mma.sync, with no wgmma to wait for), fitted to shared memory."""
    resident, stream = (list(box) for box in _cheapest_boxes(problem, tokens, streamed)[1:])
    knobs = {"warps": warps, "tma": False}
    dq = dict(config["dq"], q=resident, kv=stream, **knobs)
    dkdv = dict(config["dkdv"], q=stream, kv=resident, **knobs, wait_dk=False)
    return {"dq": _fit_shared(problem, "dq", dq), "dkdv": _fit_shared(problem, "dkdv", dkdv)}


def small_window_backward(problem: Problem, resident: Sequence[int], stream: Sequence[int]) -> bool:
    """Whether a 16-bit backward wider than NARROW_HEAD_DIM takes SMALL_WINDOW_BACKWARD_TILES
    instead of its default's (fitted) ``resident`` / ``stream`` tiles: where those cost at least
    SMALL_WINDOW_BACKWARD_RATIO times the cheapest small boxes (forward_cost)."""
    if problem.dtype.itemsize != 2 or max(problem.head_dim, problem.value_dim) <= NARROW_HEAD_DIM:
        return False
    tokens, streamed, _ = SMALL_WINDOW_BACKWARD_TILES
    small = _cheapest_boxes(problem, tokens, streamed)[0]
    return forward_cost(problem, resident, stream, 1.0) >= SMALL_WINDOW_BACKWARD_RATIO * small


def per_axis_masks(problem: Problem) -> bool:
    """Whether the forward masks a partial tile per axis it crosses (AXIS_MASKS_MAX_HEAD_DIM)."""
    return max(problem.head_dim, problem.value_dim) <= AXIS_MASKS_MAX_HEAD_DIM


def _exact_float32_config(problem: Problem) -> Dict:
    """default_config for exact float32: the forward on its own tiles (EXACT_FLOAT32_FORWARD_TILES,
    by pointer, one (batch, head) pair a program: packing was measured and GPU-tested on 16-bit
    inputs only) and the backward kernels of EXACT_FLOAT32_BACKWARD, fitted around the forward's
    query and key tile shapes."""
    ext = group_extents(problem)
    width = max(problem.head_dim, problem.value_dim)
    q, kv = _cheapest_boxes(problem, *EXACT_FLOAT32_FORWARD_TILES)[1:]
    fwd = {"q": list(q), "kv": list(kv), "warps": exact_float32_forward_warps(problem), "stages": 2, "tma": False,
           "lazy_rescale": LAZY_RESCALE, "anchor": ANCHOR_TILES, "axis_masks": per_axis_masks(problem), "pack": 1,
           "split_heads": SPLIT_HEADS, "gluon": False, "exp2_split": 0}
    per_kernel = next(kernels for channels, kernels in EXACT_FLOAT32_BACKWARD if width <= channels)
    knobs = {"stages": 2, "tma": False, "anchor": ANCHOR_TILES, "axis_masks": False, "split_heads": SPLIT_HEADS}
    resident, streamed, warps = per_kernel["dq"]
    dq = {"q": fit(fwd["q"], ext, resident), "kv": fit(fwd["kv"], ext, streamed), **knobs, "warps": warps,
          "wait_dq": waits_for_dq(problem), "gluon": False}
    resident, streamed, warps = per_kernel["dkdv"]
    dkdv = {"q": fit(fwd["kv"], ext, streamed), "kv": fit(fwd["q"], ext, resident), **knobs, "warps": warps,
            "wait_dk": waits_for_dk(problem, False), "gluon": False}
    return {name: _fit_shared(problem, name, cfg) for name, cfg in (("fwd", fwd), ("dq", dq), ("dkdv", dkdv))}


def jvp_tiles(problem: Problem, dq: Dict) -> Dict:
    """The JVP kernel's launch settings: the dQ kernel's (the same walk), fitted to the JVP's own
    shared memory. It streams four tiles a step (K, V and their tangents) where dQ streams two: at
    head dims 192 and 256 (16-bit) the dQ tiles (64 queries, 64 keys) compiled to 332 KiB on sm_90,
    which Triton refused at the first launch after compiling it, and the generic refit then
    reached 16 x 32 tiles. Fitted here (the same halving, by this kernel's estimate) they come out
    at 32 x 32 before any compile: on the H100, 0.96-0.98x the refit's time, 1.5x faster than
    64 x 32 (RESULTS.md, "the JVP's own tile fit at wide heads"). Float32 keeps the dQ tiles: they are smaller
    already and compiled to 84 KiB at 128 channels, far under this estimate."""
    if problem.dtype.itemsize != 2:
        return dq
    if wide_backward(problem):
        # At most 32 queries (what the fit below gave the padded wide heads' 64 x 64 dQ tiles): the
        # dQ kernel's 128 resident tokens on split wide heads (WIDE_SPLIT_STREAM) fitted to 64 x 32
        # here, which ptxas built on 8 warps with serialised wgmmas.
        dq = dict(dq, q=fit(dq["q"], group_extents(problem), min(32, math.prod(dq["q"]))))
    return _fit_shared(problem, "jvp", dq)


def narrow_key_major(problem: Problem) -> bool:
    """Whether the backward takes the narrow-head rules (NARROW_DKDV_WARPS on 64-token dK/dV
    tiles, NARROW_BACKWARD_TILES where the forward took small ones): 16-bit products on heads of
    at most NARROW_HEAD_DIM channels (exact float32 has EXACT_FLOAT32_BACKWARD)."""
    return narrow_16bit(problem)


def candidate_configs(problem: Problem) -> List[Dict]:
    """The tuning space: the default plus other block sizes, warps and stages per kernel, and the
    default forward with the other rescaling rule and the other way of masking."""
    base = default_config(problem)
    ext = group_extents(problem)
    q_shape, kv_shape = base["fwd"]["q"], base["fwd"]["kv"]
    out = [base]
    # 32 x 32 with one warp: the key box of a small window shrinks with the query tile (7x7: 10x14
    # keys for 4x8 queries against 14x14 for 8x8). With it the 7x7, D=32 forward ran 1.11x faster
    # on the H100 and every larger window slower (RESULTS.md, "Small tiles"): a candidate only.
    # 64 x 32 on two stages: at 192-256 channels in 16 bits the default since
    # WIDE_16BIT_FORWARD_RULE, elsewhere a candidate. (No forward on one stage: see
    # MIN_FORWARD_STAGES.)
    for bm, bn, warps, stages in ((128, 128, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (64, 128, 4, 2), (128, 64, 4, 3),
                                  (32, 32, 1, 2), (64, 32, 4, 2)):
        for tma in (False, True):
            fwd = {"q": fit(q_shape, ext, bm), "kv": fit(kv_shape, ext, bn), "warps": warps, "stages": stages,
                   "tma": tma, "lazy_rescale": base["fwd"]["lazy_rescale"]}
            if fwd != base["fwd"]:
                out.append(dict(base, fwd=_fit_shared(problem, "fwd", fwd)))
    # Pairs per program: the default's tiles by pointer loads, one to PACK_MAX pairs a program.
    if not problem.extra_tokens:
        pack = 1
        while pack <= min(PACK_MAX, problem.batch * problem.heads):
            fwd = dict(base["fwd"], pack=pack, tma=False if pack > 1 else base["fwd"]["tma"])
            if fwd != base["fwd"]:
                out.append(dict(base, fwd=_fit_shared(problem, "fwd", fwd)))
            pack *= 2
    out.extend(_small_tile_candidates(problem, base))
    # The cost model's forward, where the wide forward's rule moved the default off it.
    cost_model_forward = _config_on_forward_boxes(problem)["fwd"]
    if cost_model_forward != base["fwd"]:
        out.append(dict(base, fwd=cost_model_forward))
    out.append(dict(base, fwd=dict(base["fwd"], lazy_rescale=not base["fwd"]["lazy_rescale"])))
    out.append(dict(base, fwd=dict(base["fwd"], axis_masks=not base["fwd"]["axis_masks"])))
    if problem.dtype.itemsize == 2:
        out.extend(dict(base, fwd=dict(base["fwd"], exp2_split=every)) for every in EXP2_SPLIT_CHOICES
                   if every != base["fwd"]["exp2_split"])
    # Backward: resident tiles of 32 tokens (one warp: 1.22x the default backward on 7x7, D=32;
    # four: the wide heads' WIDE_256_BACKWARD_TILES), 64 (4 warps; with 32 streamed tokens the
    # WIDE_160_BACKWARD_TILES) and 128 (8 warps), streamed tiles of 64 or 32 tokens, 2 or 3
    # stages, pointer or descriptor loads.
    stream64, stream32 = fit(kv_shape, ext, 64), fit(kv_shape, ext, 32)
    for resident, stream, warps, stages, tma in ((64, stream64, 4, 3, False), (128, stream64, 8, 2, False),
                                                 (128, stream64, 8, 3, False), (128, stream32, 8, 2, False),
                                                 (128, stream64, 8, 2, True), (64, stream64, 4, 2, True),
                                                 (64, stream64, 4, 2, False), (32, stream32, 1, 2, False),
                                                 (64, stream32, 4, 2, False), (32, stream64, 4, 2, False)):
        tile = fit(q_shape, ext, resident)
        knobs = dict(warps=warps, stages=stages, tma=tma)
        dq = dict(q=tile, kv=stream, **knobs)
        dkdv = dict(q=stream, kv=tile, **knobs, wait_dk=waits_for_dk(problem, tma))
        if dq != base["dq"]:
            out.append(dict(base, dq=_fit_shared(problem, "dq", dq), dkdv=_fit_shared(problem, "dkdv", dkdv)))
    # The dK/dV kernel's boxes: the forward's (the default's before KEY_MAJOR_BOXES) and the
    # next cheapest by key_major_cost, whose ranking the measurements followed but not exactly.
    forward_boxes = _config_on_forward_boxes(problem)["dkdv"]
    if key_major_boxes_apply(problem, forward_boxes):
        for boxes in _ranked_key_major_boxes(problem, forward_boxes)[:KEY_MAJOR_CANDIDATES]:
            dkdv = _fit_shared(problem, "dkdv", dict(base["dkdv"], **boxes))
            if dkdv != base["dkdv"]:
                out.append(dict(base, dkdv=dkdv))
    # The dK/dV kernel with one more stage on its own boxes: at 64 channels 1.02-1.08x on four
    # problems and 0.86x on a fifth with the same tiles and head dim (RESULTS.md, 2026-12-02
    # 03:32 UTC), so nothing a default could key on: a candidate only.
    deeper = _fit_shared(problem, "dkdv", dict(base["dkdv"], stages=base["dkdv"]["stages"] + 1))
    if deeper != base["dkdv"]:
        out.append(dict(base, dkdv=deeper))
    out.append(dict(base, dkdv=dict(base["dkdv"], wait_dk=not base["dkdv"]["wait_dk"])))
    out.append(dict(base, dq=dict(base["dq"], wait_dq=not base["dq"]["wait_dq"])))
    if splits_heads(problem):
        # The padded head (the split was measured on Hopper only), on the default's tiles.
        out.append({part: dict(cfg, split_heads=False) for part, cfg in base.items()})
    # Narrow heads: the dK/dV kernel on the default tiles with the other of 2 and 4 warps.
    other_warps = {2: 4, 4: 2}.get(base["dkdv"]["warps"])
    if max(problem.head_dim, problem.value_dim) <= NARROW_HEAD_DIM and other_warps:
        out.append(dict(base, dkdv=dict(base["dkdv"], warps=other_warps)))
    if problem.dtype == torch.float32:
        # The exact-float32 default (what an untuned call without tf32 gets), so that tuning
        # never settles on a slower one.
        out.append(default_config(problem, exact_float32=True))
    if atomic_dq_allowed():
        # The atomic-dQ backward with the default's tiles, and with 128-key resident tiles (half
        # the dQ additions per pair: 1.17x the deterministic backward on 2-D 63x63 on the H100).
        wide = dict(base["dkdv"], kv=fit(base["dkdv"]["kv"], ext, 128), warps=8)
        for dkdv in (base["dkdv"], wide):
            out.append(dict(base, dkdv=_fit_shared(problem, "dkdv", dict(dkdv, atomic_dq=True))))
    if base["fwd"]["gluon"]:
        # The forwards built above are Triton's (their tiles, warps and stages are its knobs):
        # without the flag they would inherit the default's Gluon forward. The default's own
        # Triton forward, which the Gluon one displaced, is a candidate too.
        out = [c if c["fwd"] is base["fwd"] else dict(c, fwd=dict(c["fwd"], gluon=False)) for c in out]
        out.append(dict(base, fwd=dict(base["fwd"], gluon=False)))
    elif gluon_forward_problem(problem) and gluon_forward_boxes(problem) is not None:
        # The Gluon forward where the default leaves it out (short walks; 64 channels where
        # GLUON_FORWARD_HEAD_DIMS has them), with each exp2 split where it honours them.
        splits = EXP2_SPLIT_CHOICES if GLUON_EXP2_SPLIT and problem.dtype.itemsize == 2 else (0, )
        out.extend(dict(base, fwd=dict(base["fwd"], gluon=True, exp2_split=every)) for every in splits)
    if base["dkdv"]["gluon"]:
        # Likewise the Triton dK/dV kernels above, and the default's own on its tiles.
        out = [c if c["dkdv"] is base["dkdv"] else dict(c, dkdv=dict(c["dkdv"], gluon=False)) for c in out]
        out.append(dict(base, dkdv=dict(base["dkdv"], gluon=False)))
    if base["dq"]["gluon"]:
        # Likewise the Triton dQ kernels above, and the default's own on its tiles.
        out = [c if c["dq"] is base["dq"] else dict(c, dq=dict(c["dq"], gluon=False)) for c in out]
        out.append(dict(base, dq=dict(base["dq"], gluon=False)))
    elif gluon_dq_problem(problem):
        # The Gluon dQ pass where the default leaves it out (64 channels, short walks).
        out.append(dict(base, dq=dict(base["dq"], gluon=True)))
    return _distinct_as_run(out, problem)


def _distinct_as_run(configs: List[Dict], problem: Problem) -> List[Dict]:
    """Each candidate as the kernels will run it (normalise fills in the keys a builder above
    left out and fits the tiles), once, in order. Unnormalised, two builders' candidates had
    landed on the default (an H200 tuning run timed it three times, 2026-12-02), and a config
    timed twice only adds noise to the ranking."""
    out, seen = [], set()
    for config in configs:
        config = normalise(config, problem)
        key = repr(sorted((kernel, sorted(cfg.items())) for kernel, cfg in config.items()))
        if key not in seen:
            seen.add(key)
            out.append(config)
    return out


def _small_tile_candidates(problem: Problem, base: Dict) -> List[Dict]:
    """``base`` with each of SMALL_TILE_FORWARD_CANDIDATES' forwards and
    SMALL_TILE_BACKWARD_CANDIDATES' backwards on the cheapest boxes of their sizes, by pointer,
    where SMALL_TILE_CANDIDATE_RATIO says the window is small enough for them; none otherwise."""
    if max(problem.head_dim, problem.value_dim) <= NARROW_HEAD_DIM:
        return []  # narrow heads: NARROW_FORWARD_BLOCKS and the candidates above
    if forward_cost(problem, base["fwd"]["q"], base["fwd"]["kv"], 1.0) < (
            SMALL_TILE_CANDIDATE_RATIO * _cheapest_boxes(problem, 16, 32)[0]):
        return []
    out = []
    for queries, keys, warps, stages in SMALL_TILE_FORWARD_CANDIDATES:
        q, kv = _cheapest_boxes(problem, queries, keys)[1:]
        fwd = dict(base["fwd"], q=list(q), kv=list(kv), warps=warps, stages=stages, tma=False,
                   pack=packed_pairs(problem, q, kv, False))
        if fwd != base["fwd"]:
            out.append(dict(base, fwd=_fit_shared(problem, "fwd", fwd)))
    for spec in SMALL_TILE_BACKWARD_CANDIDATES:
        kernels = _backward_on_small_boxes(problem, base, *spec)
        if kernels["dq"] != base["dq"]:
            out.append(dict(base, **kernels))
    return out


def extra_kernel_blocks(problem: Problem, exact_float32: bool = False) -> Tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_E, stages)`` of the additional-token dK/dV kernel: 64 streamed queries
    past 64 resident additional tokens (32 past 16 for exact float32, see EXACT_FLOAT32_RESIDENT),
    two stages, lowered (stages first, then the larger block) until they fit the shared memory.
    At float32 with head dim 256 the fixed 64 x 64 x 2 needed 279040 bytes, more than Hopper's
    232448."""
    budget = tile_shared_budget(problem.device)
    item, d, dv = _operand_sizes(problem, "extra")
    queries, tokens = (EXACT_FLOAT32_STREAM, EXACT_FLOAT32_RESIDENT) if exact_float32 else (64, 64)
    stages = 2
    while _shared_bytes("dkdv", queries, tokens, stages, d, dv, item) > budget:
        if stages > 1:
            stages -= 1
        elif max(queries, tokens) > MIN_TILE:
            if queries >= tokens:
                queries //= 2
            else:
                tokens //= 2
        else:
            break
    return queries, tokens, stages


def extra_kernel_warps(problem: Problem, exact_float32: bool = False) -> int:
    """Warps of the additional-token dK/dV kernel: 4, or 8 for exact float32 above head dim 128,
    whose CUDA-core products otherwise spill (18 KB of spill stores at 256 on sm_90)."""
    return 8 if exact_float32 and max(problem.head_dim, problem.value_dim) > EXACT_FLOAT32_WIDE_HEAD_DIM else 4


def shrink_to_fit(problem: Problem, config: Dict, kernel: str, overshoot: int) -> Dict:
    """``config`` with ``kernel``'s tiles refitted after the compiled kernel needed ``overshoot``
    bytes more shared memory than the device has: the estimate of ``_shared_bytes`` leaves out
    what the compiler adds (layout conversions, float32 operands staged for tf32 products), which
    is most of a kernel's footprint at large float32 head dims. The operand-tile budget shrinks by
    the overshoot; raises ValueError where the tiles cannot shrink further."""
    item, d, dv = _operand_sizes(problem, kernel)
    cfg = config[kernel]
    estimate = _shared_bytes(kernel, math.prod(cfg["q"]), math.prod(cfg["kv"]), cfg["stages"], d, dv, item)
    smaller = _fit_shared(problem, kernel, cfg, budget=estimate - overshoot)
    if smaller == cfg:
        raise ValueError(
            f"the {kernel} kernel's smallest tiles ({cfg['q']} queries, {cfg['kv']} keys, {cfg['stages']} stages) "
            f"still need {overshoot} bytes more shared memory than this GPU has, at head_dim {problem.head_dim}, "
            f"value_dim {problem.value_dim}, dtype {problem.dtype}")
    return dict(config, **{kernel: smaller})


def _fitted_pack(pack, problem: Problem) -> int:
    """A stored pair count fitted to the problem: a power of two no larger than its pairs, 1 with
    additional tokens (the packed loop has none)."""
    if problem.extra_tokens:
        return 1
    return min(pow2_ceil(max(1, int(pack))), pow2_ceil(problem.batch * problem.heads))


def normalise(config, problem: Problem) -> Dict:
    """Fill in and fit a (possibly partial or stale) config for this problem."""
    base = default_config(problem)
    if not config:
        return base
    ext = group_extents(problem)
    out = {}
    for kernel, default in base.items():
        stored = config.get(kernel)
        given = dict(default, **(stored if isinstance(stored, dict) else {}))
        for part in ("q", "kv"):
            shape = given[part]
            # a stale or hand-edited cache entry: anything but rank positive ints takes the default
            # (a 0 made fit() loop forever, a str failed deep inside the launch)
            if not (isinstance(shape, (list, tuple)) and len(shape) == problem.rank
                    and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape)):
                shape = default[part]
            given[part] = fit(shape, ext, pow2_ceil(math.prod(shape)))
        if kernel == "fwd":
            if given["exp2_split"] not in EXP2_SPLIT_CHOICES:
                raise ValueError(f"config['fwd']['exp2_split'] = {given['exp2_split']!r}: one exp2 in how many on "
                                 f"the FMA pipe, one of {EXP2_SPLIT_CHOICES} (0: none)")
            given["pack"] = _fitted_pack(given.get("pack", 1), problem)
            given["stages"] = max(int(given["stages"]), MIN_FORWARD_STAGES)
        out[kernel] = _fit_shared(problem, kernel, given)
    return out
