"""score_mod and mask_mod compiled into the fused kernels: trace, translate, check.

A mod is traced once (``make_fx`` on one-element tensors) into a graph of ATen operators; each
operator becomes one Triton expression, and the graph a ``@triton.jit`` device function that the
kernels call on whole tiles of pairs (the generated code is elementwise, so it broadcasts over
``[rows, 1]`` query and ``[1, cols]`` key indices). score_mod also gets its derivative with
respect to the score (the graph of ``torch.func.grad``), which the backward multiplies into dS.

Tensors a mod captures (a bias table, per-head slopes) are read by the kernels through pointers,
at most MAX_CAPTURED of them; their strides are baked into the code, their contents are read at
every call (as FlexAttention reads them). Operators outside the table below, data-dependent
Python control flow, tables on another device and too many tables make ``ModsNotFusable``, whose
message the triton backend gives as its reason (the flex and reference backends then run the mod).

Before a translation is used it is checked against the mod itself on pairs the problem attends
(mod_check: Triton's CPU interpreter against PyTorch, random scores): a disagreement is a reason
too, never a wrong answer.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.util
import math
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

MAX_CAPTURED = 4
# Sample points of the check (interpreted on the CPU: a few milliseconds).
CHECK_POINTS = 64


class ModsNotFusable(Exception):
    """A mod the code generator cannot translate, and why (the message names the mod)."""


@dataclass(frozen=True)
class FusedMods:
    """Device functions for the kernels' SCORE_MOD / SCORE_MOD_GRAD / MASK_MOD constexprs and the
    tensors they read (passed as the kernels' MOD_T0..MOD_T3; unused places get any tensor)."""

    score: object
    score_grad: object
    mask: object
    has_score: bool
    has_mask: bool
    tensors: Tuple[torch.Tensor, ...]
    source: str
    # The index arguments ("b", "h") mask_mod's result depends on: live_steps keeps one list of a
    # tile's live steps for all batch entries (heads) where it reads no b (h).
    mask_reads: frozenset = frozenset()

    def tensor_args(self, filler: torch.Tensor) -> list:
        return list(self.tensors) + [filler] * (MAX_CAPTURED - len(self.tensors))


# ---------------------------------------------------------------------------------------------
# Tracing


def _traced(fn: Callable, args) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    # Functionalized: the graphs of derivatives use in-place operators (logical_and_), which
    # become their functional forms, so every node is one value.
    return make_fx(torch.func.functionalize(fn, remove="mutations_and_views"), tracing_mode="real")(*args)


def _trace_inputs(device) -> tuple:
    # Index 0 everywhere: any table the mod indexes has that element.
    score = torch.full((1,), 0.5, dtype=torch.float32, device=device)
    index = torch.zeros((1,), dtype=torch.int64, device=device)
    return score, index, index.clone(), index.clone(), index.clone()


def _score_gradient(score_mod):
    def gradient(s, b, h, q, kv):
        return torch.func.grad(lambda x: score_mod(x, b, h, q, kv).to(torch.float32).sum())(s)
    return gradient


def _trace(name: str, fn: Callable, args) -> torch.fx.GraphModule:
    try:
        return _traced(fn, args)
    except Exception as err:  # any failure of a user's function under tracing
        raise ModsNotFusable(
            f"{name} could not be traced into operators ({type(err).__name__}: {str(err).splitlines()[0][:160]}); "
            "data-dependent Python control flow (if on a tensor, .item()) cannot be compiled into a kernel"
        ) from None


# ---------------------------------------------------------------------------------------------
# Translation: one Triton expression per ATen operator


_DTYPES = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
    torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

# name -> template over the operands' expressions
_UNARY = {
    "neg": "(-{0})", "abs": "tl.abs({0})", "exp": "tl.exp(ops.as_float({0}))",
    "exp2": "tl.exp2(ops.as_float({0}))", "log": "tl.log(ops.as_float({0}))",
    "log2": "tl.log2(ops.as_float({0}))", "log1p": "tl.log(1.0 + ops.as_float({0}))",
    "expm1": "(tl.exp(ops.as_float({0})) - 1.0)", "sqrt": "tl.sqrt(ops.as_float({0}))",
    "rsqrt": "tl.rsqrt(ops.as_float({0}))", "sin": "tl.sin(ops.as_float({0}))", "cos": "tl.cos(ops.as_float({0}))",
    "tanh": "ops.tanh({0})", "sigmoid": "ops.sigmoid({0})", "sign": "ops.sign({0})",
    "sgn": "ops.sign({0})", "floor": "tl.floor({0})", "ceil": "tl.ceil({0})", "reciprocal": "(1.0 / ops.as_float({0}))",
    "logical_not": "({0} == 0)", "bitwise_not": "(~{0})", "relu": "tl.maximum({0}, 0)",
}
_BINARY = {
    "mul": "({0} * {1})", "div": "ops.true_divide({0}, {1})", "floor_divide": "ops.floor_divide({0}, {1})",
    "remainder": "ops.remainder({0}, {1})", "fmod": "ops.fmod({0}, {1})",
    "minimum": "tl.minimum({0}, {1})", "maximum": "tl.maximum({0}, {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "logical_and": "(({0} != 0) & ({1} != 0))", "logical_or": "(({0} != 0) | ({1} != 0))",
    "logical_xor": "(({0} != 0) ^ ({1} != 0))",
    "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
    "tanh_backward": "({0} * (1.0 - {1} * {1}))", "sigmoid_backward": "({0} * {1} * (1.0 - {1}))",
}
# Shape-only operators: every value here is one element per pair.
_IDENTITY = {"expand", "view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "clone", "alias", "detach",
             "contiguous", "sum", "lift_fresh_copy", "permute", "t"}
# Of those, the ones that keep a captured tensor's elements where they are.
_KEEPS_LAYOUT = {"clone", "alias", "detach", "contiguous", "lift_fresh_copy"}
_LIKE = {"ones_like": 1, "zeros_like": 0}


@dataclass
class _Captured:
    """A captured tensor (or a view of one by integer selects): its slot among the kernel's
    pointer arguments, the element offset so far, and the remaining dims' sizes and strides."""

    slot: int
    offset: str
    sizes: Tuple[int, ...]
    strides: Tuple[int, ...]
    numel: int


def _literal(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        if math.isnan(value):
            return 'float("nan")'
        return repr(value)
    if isinstance(value, int):
        return repr(value)
    raise ModsNotFusable(f"a constant of type {type(value).__name__}")


class _Translator:
    def __init__(self, name: str, graph_module: torch.fx.GraphModule, params: List[str], device,
                 tensors: List[torch.Tensor]):
        self.name, self.gm, self.params, self.device = name, graph_module, params, device
        self.tensors = tensors  # shared between a call's mods: slots are global
        self.lines: List[str] = []
        self.values: Dict[str, object] = {}

    def fail(self, what: str):
        raise ModsNotFusable(f"{self.name}: {what} cannot be compiled into the fused kernels")

    def operand(self, arg) -> str:
        if isinstance(arg, torch.fx.Node):
            value = self.values[arg.name]
            if isinstance(value, _Captured):
                return self.element(value)
            return value
        return _literal(arg)

    def typed_operand(self, arg) -> str:
        """An operand for a mod_ops function, which reads its operands' dtypes: a Python number
        becomes a scalar tensor (float32 floats; int32 integers where they fit, which promote to
        the index's own width, int64 on problems whose flat indices need it)."""
        if isinstance(arg, torch.fx.Node):
            return self.operand(arg)
        if isinstance(arg, bool):
            return f"tl.full((), {_literal(arg)}, tl.int1)"
        if isinstance(arg, int):
            return f"tl.full((), {_literal(arg)}, {'tl.int32' if -2**31 <= arg < 2**31 else 'tl.int64'})"
        return f"tl.full((), {_literal(float(arg))}, tl.float32)"

    def element(self, captured: _Captured) -> str:
        """A captured tensor used as a value: it must be down to one element."""
        if captured.sizes and math.prod(captured.sizes) != 1:
            self.fail(f"a captured tensor of shape {list(captured.sizes)} used without indexing it per pair")
        return f"tl.load(T{captured.slot} + {captured.offset})"

    def capture(self, tensor: torch.Tensor):
        if tensor.numel() == 1 and tensor.device.type == "cpu" and self.device.type != "cpu":
            # A constant made in the mod's body (torch.tensor(2.0)): its value is the code.
            return _literal(tensor.item())
        if tensor.device != self.device and not (tensor.device.type == self.device.type == "cuda"
                                                 and tensor.device.index in (None, self.device.index)):
            self.fail(f"a captured tensor on {tensor.device} (the inputs are on {self.device})")
        if tensor.dtype not in _DTYPES or tensor.dtype == torch.bool:
            self.fail(f"a captured tensor of dtype {tensor.dtype}")
        for slot, known in enumerate(self.tensors):
            if known is tensor:
                break
        else:
            if len(self.tensors) == MAX_CAPTURED:
                self.fail(f"more than {MAX_CAPTURED} captured tensors")
            self.tensors.append(tensor)
            slot = len(self.tensors) - 1
        return _Captured(slot, "0", tuple(tensor.shape), tuple(tensor.stride()), tensor.numel())

    def index(self, captured, indices) -> str:
        if not isinstance(captured, _Captured):
            self.fail("indexing a computed value")
        if len(indices) != len(captured.sizes) or any(i is None for i in indices):
            self.fail(f"indexing a captured tensor of {len(captured.sizes)} dims with {len(indices)} indices "
                      "(index every dim, one index tensor each)")
        terms = [captured.offset]
        for i, (size, stride) in enumerate(zip(captured.sizes, captured.strides)):
            # Negative indices count from the end, as PyTorch's indexing does.
            raw = self.assign(f"({self.operand(indices[i])}).to(tl.int64)")
            terms.append(f"tl.where({raw} < 0, {raw} + {size}, {raw}) * {stride}")
        offset = self.assign(" + ".join(terms))
        return f"ops.gather(T{captured.slot}, {offset}, {captured.numel})"

    def select(self, captured, dim: int, i: int) -> _Captured:
        if not isinstance(captured, _Captured):
            self.fail("select on a computed value")
        dim = dim % len(captured.sizes)
        size, stride = captured.sizes[dim], captured.strides[dim]
        i = i + size if i < 0 else i
        return _Captured(captured.slot, f"({captured.offset} + {i * stride})",
                         captured.sizes[:dim] + captured.sizes[dim + 1:],
                         captured.strides[:dim] + captured.strides[dim + 1:], captured.numel)

    def relaid(self, captured: _Captured, packet: str, node: torch.fx.Node) -> _Captured:
        """A view of a captured tensor that moves its dims (permute, t) or adds or drops dims of
        length 1 (unsqueeze, squeeze, view / reshape to such a shape); other views are reasons."""
        sizes, strides = list(captured.sizes), list(captured.strides)
        if packet in ("permute", "t"):
            order = list(node.args[1]) if packet == "permute" else list(reversed(range(len(sizes))))
            order = [d % len(sizes) for d in order]
            return _Captured(captured.slot, captured.offset, tuple(sizes[d] for d in order),
                             tuple(strides[d] for d in order), captured.numel)
        shape = tuple(node.meta["val"].shape) if "val" in node.meta else None
        if packet != "expand" and shape is not None and [n for n in shape if n != 1] == [n for n in sizes if n != 1]:
            kept = iter([(n, st) for n, st in zip(sizes, strides) if n != 1])
            new = [(1, 0) if n == 1 else next(kept) for n in shape]
            return _Captured(captured.slot, captured.offset, tuple(n for n, _ in new), tuple(st for _, st in new),
                             captured.numel)
        self.fail(f"{packet} of a captured tensor of shape {list(sizes)}")

    def assign(self, expression: str) -> str:
        name = f"v{len(self.lines)}"
        self.lines.append(f"    {name} = {expression}")
        return name

    def translate_node(self, node: torch.fx.Node):
        target = node.target
        packet = getattr(target, "_opname", None) or getattr(getattr(target, "overloadpacket", None), "__name__", None)
        overload = getattr(target, "_overloadname", "")
        args, kwargs = node.args, node.kwargs
        if packet is None:
            self.fail(f"the Python call {target}")
        if packet.endswith("_copy") and packet[:-5] in _IDENTITY | {"select"}:
            packet = packet[:-5]  # functionalization's copying forms of views: values are per pair
        if packet in ("add", "sub", "rsub"):
            # add / sub: x +- alpha * y; rsub(x, y): y - alpha * x
            alpha = kwargs.get("alpha", 1)
            x, y = self.operand(args[0]), self.operand(args[1])
            if packet == "rsub":
                x, y = y, x
            if alpha != 1:
                y = f"({y} * {_literal(alpha)})"
            return f"({x} {'+' if packet == 'add' else '-'} {y})"
        if packet == "div" and overload == "Tensor_mode" or (packet == "div" and "rounding_mode" in kwargs):
            mode = kwargs.get("rounding_mode")
            a, b = self.typed_operand(args[0]), self.typed_operand(args[1])
            if mode == "floor":
                return f"ops.floor_divide({a}, {b})"
            if mode == "trunc":
                return f"ops.truncate_divide({a}, {b})"
            return f"ops.true_divide({a}, {b})"
        if packet in _BINARY:
            template = _BINARY[packet]
            operand = self.typed_operand if template.startswith("ops.") else self.operand
            return template.format(operand(args[0]), operand(args[1]))
        if packet in _UNARY:
            return _UNARY[packet].format(self.operand(args[0]))
        if packet == "where":
            return f"tl.where({self.operand(args[0])}, {self.operand(args[1])}, {self.operand(args[2])})"
        if packet == "masked_fill":
            return f"tl.where({self.operand(args[1])}, {self.operand(args[2])}, {self.operand(args[0])})"
        if packet in ("clamp", "clamp_min", "clamp_max"):
            x = self.operand(args[0])
            lo = args[1] if packet != "clamp_max" else None
            hi = args[2] if packet == "clamp" and len(args) > 2 else (args[1] if packet == "clamp_max" else None)
            lo, hi = kwargs.get("min", lo), kwargs.get("max", hi)
            if lo is not None:
                x = f"tl.maximum({x}, {self.operand(lo)})"
            if hi is not None:
                x = f"tl.minimum({x}, {self.operand(hi)})"
            return x
        if packet == "pow":
            base, exponent = args
            if isinstance(base, torch.fx.Node) and isinstance(exponent, (int, float)):
                x = self.operand(base)
                if exponent == 0.5:
                    return f"tl.sqrt(ops.as_float({x}))"
                if float(exponent).is_integer() and 0 < abs(exponent) <= 4:
                    product = " * ".join([f"ops.as_float({x})"] * int(abs(exponent)))
                    return f"({product})" if exponent > 0 else f"(1.0 / ({product}))"
            self.fail(f"pow with exponent {exponent!r} (only 0.5 and integers -4..4 are compiled)")
        if packet == "_to_copy":
            dtype = kwargs.get("dtype")
            if dtype is None:
                return self.operand(args[0])
            if dtype not in _DTYPES:
                self.fail(f"a cast to {dtype}")
            if dtype in (torch.float16, torch.bfloat16):
                # PyTorch would round every later operator's result to 16 bits too; the kernels
                # compute the mods in float32 (and Triton's interpreter, which checks a
                # translation, does not round to nearest-even).
                self.fail(f"arithmetic in {dtype} (a cast to it)")
            return f"({self.operand(args[0])}).to({_DTYPES[dtype]})"
        if packet in ("scalar_tensor", "full"):
            value = args[0] if packet == "scalar_tensor" else args[1]
            dtype = kwargs.get("dtype") or node.meta.get("val", torch.empty(0)).dtype
            return _literal(float(value) if dtype.is_floating_point else value)
        if packet in _LIKE or packet == "full_like":
            value = _LIKE.get(packet, args[1] if packet == "full_like" else 0)
            dtype = kwargs.get("dtype") or node.meta.get("val", torch.empty(0)).dtype
            literal = _literal(float(value) if dtype.is_floating_point else int(value))
            return literal
        if packet == "index":
            return self.index(self.values[args[0].name] if isinstance(args[0], torch.fx.Node) else None, args[1])
        if packet == "select":
            return self.select(self.values[args[0].name], args[1], args[2])
        if packet in _IDENTITY:
            if not isinstance(args[0], torch.fx.Node):
                return _literal(args[0])
            value = self.values[args[0].name]
            if isinstance(value, _Captured) and packet not in _KEEPS_LAYOUT:
                return self.relaid(value, packet, node)
            return value
        self.fail(f"the operator aten.{packet}.{overload or 'default'}")

    def body(self) -> str:
        placeholders = iter(self.params)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.values[node.name] = next(placeholders)
            elif node.op == "get_attr":
                self.values[node.name] = self.capture(getattr(self.gm, node.target))
            elif node.op == "call_function":
                value = self.translate_node(node)
                if isinstance(value, _Captured):
                    self.values[node.name] = value
                else:
                    self.values[node.name] = self.assign(value)
            elif node.op == "output":
                result = node.args[0]
                if isinstance(result, (tuple, list)):
                    result = result[0]
                return self.operand(result)
            else:
                self.fail(f"a graph node of kind {node.op}")
        self.fail("a graph without output")


# ---------------------------------------------------------------------------------------------
# Code: one module per pair of mods, written to a directory of this process (Triton reads a jit
# function's source from its file).

_MODULE_HEADER = '''"""Generated by haloattn's mod_codegen from {what}; do not edit."""
import triton
import triton.language as tl
from haloattn.backends.triton import mod_ops as ops

'''

_DIRECTORY: Optional[str] = None
_LOCK = threading.Lock()


def _module_directory() -> str:
    global _DIRECTORY
    if _DIRECTORY is None:
        _DIRECTORY = tempfile.mkdtemp(prefix="haloattn_mods_")
        # Removed at exit: Triton reads a function's source when it is defined, and keys its own
        # cache of compiled kernels on that source, not on the file.
        atexit.register(shutil.rmtree, _DIRECTORY, True)
    return _DIRECTORY


def _load_module(source: str):
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = os.path.join(_module_directory(), f"mods_{digest}.py")
    if not os.path.exists(path):
        with open(path + ".tmp", "w") as f:
            f.write(source)
        os.replace(path + ".tmp", path)
    spec = importlib.util.spec_from_file_location(f"haloattn_generated_mods_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SCORE_PARAMS = ["s", "b", "h", "q", "kv"]
_MASK_PARAMS = ["b", "h", "q", "kv"]
_CAPTURED_PARAMS = ", ".join(f"T{i}" for i in range(MAX_CAPTURED))


def _function(name: str, params: List[str], body: List[str], result: str, kind: str) -> str:
    lines = ["@triton.jit", f"def {name}({', '.join(params)}, {_CAPTURED_PARAMS}):", *body]
    if kind == "score":
        # Every pair gets a float32 score, also where the mod's result does not depend on them all.
        value = f"({result}).to(tl.float32)" if result.isidentifier() else result
        lines.append(f"    return tl.zeros_like(s) + {value}")
    else:
        lines.append(f"    return (tl.zeros_like(q) + tl.zeros_like(kv) + ({result})) != 0")
    return "\n".join(lines) + "\n\n"


def _arguments_read(gm: torch.fx.GraphModule, params: List[str]) -> frozenset:
    """The parameters (named as ``params``, in order) whose placeholders feed the graph."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    return frozenset(name for name, node in zip(params, placeholders) if node.users)


def _generate(score_mod, mask_mod, device) -> Tuple[str, List[torch.Tensor], frozenset]:
    tensors: List[torch.Tensor] = []
    mask_reads = frozenset()
    parts = []
    s, b, h, q, kv = _trace_inputs(device)
    if score_mod is not None:
        for fn_name, fn in (("score_mod", score_mod), ("score_grad", _score_gradient(score_mod))):
            gm = _trace("score_mod" if fn_name == "score_mod" else "score_mod's derivative", fn, (s, b, h, q, kv))
            translator = _Translator("score_mod", gm, _SCORE_PARAMS, device, tensors)
            result = translator.body()
            parts.append(_function(fn_name, _SCORE_PARAMS, translator.lines, result, "score"))
    else:
        parts.append(_function("score_mod", _SCORE_PARAMS, [], "s", "score"))
        parts.append(_function("score_grad", _SCORE_PARAMS, [], "1.0", "score"))
    if mask_mod is not None:
        gm = _trace("mask_mod", mask_mod, (b, h, q, kv))
        mask_reads = _arguments_read(gm, _MASK_PARAMS)
        translator = _Translator("mask_mod", gm, _MASK_PARAMS, device, tensors)
        result = translator.body()
        parts.append(_function("mask_mod", _MASK_PARAMS, translator.lines, result, "mask"))
    else:
        parts.append(_function("mask_mod", _MASK_PARAMS, [], "1", "mask"))
    what = " and ".join(getattr(fn, "__qualname__", type(fn).__name__) for fn in (score_mod, mask_mod) if fn is not None)
    return _MODULE_HEADER.format(what=what) + "".join(parts), tensors, mask_reads


def fused_mods(score_mod, mask_mod, device) -> FusedMods:
    """The kernels' mod functions for this pair of mods on ``device`` (cached per pair and
    device); raises ModsNotFusable with the reason where they cannot be compiled."""
    return _fused_mods(score_mod, mask_mod, torch.device(device))


@functools.lru_cache(maxsize=128)
def _fused_mods(score_mod, mask_mod, device: torch.device) -> FusedMods:
    with _LOCK:
        source, tensors, mask_reads = _generate(score_mod, mask_mod, device)
        module = _load_module(source)
    return FusedMods(module.score_mod, module.score_grad, module.mask_mod, score_mod is not None,
                     mask_mod is not None, tuple(tensors), source, mask_reads)


def not_fusable_reasons(problem) -> List[str]:
    """Why this problem's mods cannot run in the fused kernels (empty: they can, or it has none)."""
    if problem.score_mod is None and problem.mask_mod is None:
        return []
    from .mod_check import checked_mods

    try:
        checked_mods(problem)
    except ModsNotFusable as err:
        return [f"{err} (the flex backend runs it on CUDA, the reference backend elsewhere)"]
    return []
