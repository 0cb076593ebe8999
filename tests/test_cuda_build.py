"""Backend ``cuda`` without a GPU: the build's outcome and the reasons the backend reports.

* ``available()`` names the precise cause when the compiled module is missing, was not built
  (and why), fails to import, or finds no device; ``not_supported_reasons`` names each feature,
  dtype, head_dim and capability it cannot serve.
* CMake rejects a bad ``HALOATTN_CUDA`` and records why it skipped the module (needs cmake).
* The kernels' index rules (csrc/window_geometry.cuh), compiled for the host with nvcc, equal
  core/haloattn/geometry.py's key_range / query_range on every coordinate, the kernels' work
  decomposition (tiles, key boxes, inverse query boxes) covers every attended pair, and the
  ldmatrix addressing yields the MMA fragment layouts (needs nvcc).
* The Hopper kernels compile for sm_90a with their wgmma asynchronous: ptxas does not serialise
  them (needs nvcc and the nvidia-cutlass headers, a test extra).
"""

import dataclasses
import random
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from sass_loop_stats import REGISTER_A, fragment_overwrites, listings  # noqa: E402

from haloattn.backends.cuda import module as cuda_module
from haloattn.backends.cuda import plugin as cuda_plugin
from haloattn.geometry import Axis, key_range, query_range, window_query_range
from haloattn.problem import build_problem

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_modules(monkeypatch):
    """Install fake ``haloattn_cuda`` / ``haloattn_cuda._C`` modules for one test."""

    def install(package=None, compiled=None):
        cuda_module.load.cache_clear()
        for name, mod in (("haloattn_cuda", package), ("haloattn_cuda._C", compiled)):
            monkeypatch.setitem(sys.modules, name, mod)  # None makes the import fail

    yield install
    cuda_module.load.cache_clear()


def _package(reason="", archs="90a"):
    return types.SimpleNamespace(NOT_BUILT_REASON=reason, ARCHS=archs)


def _compiled(count, error=""):
    return types.SimpleNamespace(device_count=lambda: (count, error))


def test_reason_when_package_is_missing(fake_modules):
    fake_modules(package=None)
    (reason,) = cuda_plugin.CudaBackend().available()
    assert "haloattn_cuda._C is not installed" in reason and "HALOATTN_CUDA=on" in reason


def test_reason_when_module_was_not_built(fake_modules):
    fake_modules(package=_package("no CUDA compiler (nvcc) was found when the package was built"))
    (reason,) = cuda_plugin.CudaBackend().available()
    assert "was not built: no CUDA compiler (nvcc) was found" in reason


def test_reason_when_module_fails_to_import(fake_modules):
    fake_modules(package=_package(), compiled=None)
    (reason,) = cuda_plugin.CudaBackend().available()
    assert "haloattn_cuda._C failed to import" in reason


@pytest.mark.parametrize("count,error,expected", [(-1, "no CUDA-capable device is detected", "no CUDA device: the CUDA runtime says"), (0, "", "no CUDA device")])
def test_reason_when_no_device(fake_modules, count, error, expected):
    fake_modules(package=_package(), compiled=_compiled(count, error))
    (reason,) = cuda_plugin.CudaBackend().available()
    assert reason.startswith(expected) and error in reason


def test_available_with_a_device(fake_modules):
    fake_modules(package=_package(), compiled=_compiled(1))
    assert cuda_plugin.CudaBackend().available() == []


def test_haloattn_info_lists_the_reason(fake_modules, capsys):
    from haloattn.cli import main

    fake_modules(package=_package("the package was built with HALOATTN_CUDA=off"))
    assert main(["info"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("cuda "))
    assert "unavailable: the compiled module was not built: the package was built with HALOATTN_CUDA=off" in line


def _problem(device="cpu", dtype=torch.bfloat16, head_dim=64, value_dim=None, **options):
    q = torch.empty(1, 16, 16, 4, head_dim, dtype=dtype, device=device)
    k = torch.empty(1, 16, 16, 2, head_dim, dtype=dtype, device=device)
    v = torch.empty(1, 16, 16, 2, value_dim or head_dim, dtype=dtype, device=device)
    return build_problem(q, k, v, 5, **options)


def test_not_supported_reasons_are_precise():
    backend = cuda_plugin.CudaBackend()
    reasons = backend.not_supported_reasons(_problem(dtype=torch.float32, head_dim=96, value_dim=32, softcap=5.0))
    text = " | ".join(reasons)
    assert "device cpu: the cuda backend runs on CUDA devices" in text
    assert "dtype float32 is not float16 or bfloat16" in text
    assert "head_dim 96 not in (64, 128)" in text
    assert "value head_dim (D_v) 32 differs from head_dim 96" in text
    assert "softcap is not implemented in the cuda backend yet" in text
    assert "rpb" not in text


def test_supported_problem_has_only_the_device_reason():
    reasons = cuda_plugin.CudaBackend().not_supported_reasons(_problem(pattern="window", shift=2, causal=True))
    assert reasons == ["device cpu: the cuda backend runs on CUDA devices"]


def test_capability_must_match_the_build(monkeypatch):
    monkeypatch.setattr(cuda_plugin, "cuda_capability", lambda device: (8, 0))
    monkeypatch.setattr(cuda_plugin, "built_archs", lambda: ["90a"])
    problem = dataclasses.replace(_problem(), device=torch.device("cuda", 0))
    (reason,) = cuda_plugin.CudaBackend().not_supported_reasons(problem)
    assert reason == (
        "device cuda:0 has compute capability 8.0; haloattn_cuda._C was built for sm_90a "
        "(set HALOATTN_CUDA_ARCHS at install time)"
    )
    monkeypatch.setattr(cuda_plugin, "cuda_capability", lambda device: (9, 0))
    assert cuda_plugin.CudaBackend().not_supported_reasons(problem) == []


def test_capability_of_arch_names():
    assert cuda_module.capability_of("90a") == (9, 0)
    assert cuda_module.capability_of("100a") == (10, 0)
    assert cuda_module.capability_of("89") == (8, 9)


def _cmake(tmp_path, *defines):
    return subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"), *defines],
        capture_output=True, text=True, timeout=300,
    )


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_cmake_rejects_an_unknown_mode(tmp_path):
    result = _cmake(tmp_path, "-DHALOATTN_CUDA=maybe")
    assert result.returncode != 0
    assert "HALOATTN_CUDA='maybe'; allowed: auto, on, off" in result.stderr.replace("\n  ", " ")


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_cmake_off_records_the_reason(tmp_path):
    result = _cmake(tmp_path, "-DHALOATTN_CUDA=off")
    assert result.returncode == 0, result.stderr
    record = (tmp_path / "build" / "haloattn_cuda" / "__init__.py").read_text()
    assert 'NOT_BUILT_REASON = "the package was built with HALOATTN_CUDA=off"' in record


def _random_axes(rng, count):
    for _ in range(count):
        pattern = rng.choice(("neighborhood", "window"))
        L = rng.randint(1, 40)
        Dl = rng.randint(1, max(1, min(4, L)))
        K = rng.randint(1, max(1, L // Dl))
        if K * Dl > L:
            K, Dl = 1, 1
        S = rng.randint(1, K) if pattern == "neighborhood" else 1
        s = rng.randint(0, K - 1) if pattern == "window" else 0
        yield pattern, Axis(L, K, S, Dl, rng.random() < 0.4, s)


def _host_program(tmp_path, name):
    """Compile tests/cuda_host/NAME.cu (host code only, csrc/ headers) and return its path."""
    exe = tmp_path / name
    subprocess.run(
        ["nvcc", "-std=c++17", "-x", "cu", "-I", str(ROOT / "csrc"), str(ROOT / "tests" / "cuda_host" / f"{name}.cu"),
         "-o", str(exe)],
        check=True, timeout=600,
    )
    return exe


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@needs_nvcc
def test_kernel_index_rules_match_geometry(tmp_path):
    exe = _host_program(tmp_path, "geometry_dump")
    axes = list(_random_axes(random.Random(0), 400))
    stdin = "".join(
        f"{int(p == 'window')} {a.length} {a.window} {a.stride} {a.dilation} {int(a.causal)} {a.shift}\n" for p, a in axes
    )
    lines = iter(subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True).stdout.split("\n"))
    for pattern, axis in axes:
        previous = {}
        for i in range(axis.length):
            got = tuple(int(x) for x in next(lines).split())
            group, lo, hi = key_range(axis, pattern, i)
            y, group_len = i // axis.dilation, axis.group_length(group)
            inverse = query_range if pattern == "neighborhood" else window_query_range
            q_lo, q_hi = inverse(axis, y, group_len)
            assert got == (i, lo, hi, q_lo, min(q_hi, group_len)), (pattern, axis, i)
            # The kernels bound a tile's keys (queries) by its first and last query (key): both
            # ends must be non-decreasing along a dilation group.
            if i >= axis.dilation:
                assert all(a <= b for a, b in zip(previous[group], got[1:])), (pattern, axis, i)
            previous[group] = got[1:]


@needs_nvcc
def test_fast_divisor_matches_integer_division(tmp_path):
    """csrc/fast_divisor.h's multiply-shift division, which the kernels' index rules use for
    strides, windows and dilations, against C++'s `/` (divisors 1..4096 exhaustively on small
    numerators, large divisors and numerators up to 2^31 - 1)."""
    exe = _host_program(tmp_path, "divisor_check")
    verdict = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=600).stdout
    assert verdict.strip() == "ok", verdict


@needs_nvcc
def test_kernel_tiles_cover_every_attended_pair(tmp_path):
    exe = _host_program(tmp_path, "tiling_check")
    rng = random.Random(1)
    problems = []
    for _ in range(150):
        rank = rng.choice((1, 2, 3))
        pattern = rng.choice(("neighborhood", "window"))
        limit = {1: 200, 2: 24, 3: 9}[rank]
        axes = [a for _, a in _random_axes(rng, 3 * rank)][:rank]
        axes = [a if a.length <= limit else Axis(limit, 1) for a in axes]
        if pattern == "window":
            axes = [Axis(a.length, a.window, 1, a.dilation, a.causal, rng.randint(0, a.window - 1)) for a in axes]
        else:
            axes = [Axis(a.length, a.window, rng.randint(1, a.window), a.dilation, a.causal) for a in axes]
        padded = [Axis(1, 1)] * (3 - rank) + axes
        problems.append((pattern, padded))
    # Windows much wider than a tile along the fast axis: the Hopper kernel leaves many 64-key
    # chunks of these unmasked, which the check compares against the brute force.
    for axes in ([Axis(1, 1), Axis(1, 1), Axis(700, 301)], [Axis(1, 1), Axis(700, 513, 1, 1, True)],
                 [Axis(1, 1), Axis(6, 3), Axis(300, 201)], [Axis(3, 2), Axis(4, 3, 1, 1, True), Axis(200, 151)]):
        problems.append(("neighborhood", ([Axis(1, 1)] * 3 + axes)[-3:]))
    stdin = "".join(
        f"{int(p == 'window')} " + " ".join(
            f"{a.length} {a.window} {a.stride} {a.dilation} {int(a.causal)} {a.shift}" for a in axes
        ) + "\n"
        for p, axes in problems
    )
    verdicts = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True, timeout=600).stdout
    for (pattern, axes), verdict in zip(problems, verdicts.splitlines()):
        assert verdict == "ok", (verdict, pattern, axes)
    assert len(verdicts.splitlines()) == len(problems)


def test_launch_passes_padded_axes_strides_and_views(monkeypatch):
    """What backends/cuda/launch.py hands the module: rank padded to 3, element strides of the
    tensors as given (strided views stay views when their rows are 16-byte aligned)."""
    from haloattn.backend import AttentionInputs
    from haloattn.backends.cuda import launch

    calls = {}
    fake = types.SimpleNamespace(forward=lambda **kwargs: calls.update(kwargs))
    monkeypatch.setattr(launch, "load", lambda: (fake, ()))
    monkeypatch.setattr(launch.torch.cuda, "current_stream", lambda device: types.SimpleNamespace(cuda_stream=1234))
    qkv = torch.randn(2, 10, 12, 3, 4, 64).to(torch.bfloat16)
    q, k, v = qkv.unbind(3)
    problem = build_problem(q, k, v, (3, 5), dilation=(2, 1), causal=(True, False))
    problem = dataclasses.replace(problem, device=torch.device("cuda", 0))
    out, lse = launch.forward(problem, AttentionInputs(q, k, v))
    assert calls["axes"] == [(1, 1, 1, 1, 0, 0), (10, 3, 1, 2, 1, 0), (12, 5, 1, 1, 0, 0)]
    assert calls["query"] == (q.data_ptr(), q.stride(0), (0, q.stride(1), q.stride(2)), q.stride(3))
    assert calls["key"][0] == k.data_ptr()  # a view, not a copy
    assert calls["out"] == (out.data_ptr(), out.stride(0), (0, out.stride(1), out.stride(2)), out.stride(3))
    assert calls["lse"] == lse.data_ptr() and lse.dtype == torch.float32 and lse.shape == (2, 10, 12, 4)
    assert (calls["dtype"], calls["pattern"], calls["device"], calls["stream"]) == (1, 0, 0, 1234)
    assert (calls["heads"], calls["kv_heads"], calls["head_dim"], calls["value_dim"]) == (4, 4, 64, 64)


@pytest.mark.parametrize("setting,code", [(None, 0), ("auto", 0), ("portable", 1), ("hopper", 2)])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_launch_passes_the_kernel_choice(monkeypatch, direction, setting, code):
    from haloattn.backend import AttentionInputs
    from haloattn.backends.cuda import launch

    calls = {}
    module = types.SimpleNamespace(forward=lambda **kw: calls.update(kw), backward=lambda **kw: calls.update(kw))
    monkeypatch.setattr(launch, "load", lambda: (module, ()))
    monkeypatch.setattr(launch.torch.cuda, "current_stream", lambda device: types.SimpleNamespace(cuda_stream=0))
    variable = f"HALOATTN_CUDA_{direction.upper()}"
    if setting is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, setting)
    q = torch.randn(1, 6, 2, 64).to(torch.float16)
    problem = dataclasses.replace(build_problem(q, q, q, 3), device=torch.device("cuda", 0))
    inputs = AttentionInputs(q, q, q)
    if direction == "forward":
        launch.forward(problem, inputs)
    else:
        launch.backward(problem, inputs, q, torch.zeros(1, 6, 2), q, None, (True, True, True))
    assert calls[f"{direction}_kernel"] == code


@pytest.mark.parametrize("direction", ["FORWARD", "BACKWARD"])
def test_unknown_kernel_choice_is_named(monkeypatch, direction):
    from haloattn.backends.cuda import launch

    monkeypatch.setenv(f"HALOATTN_CUDA_{direction}", "fast")
    with pytest.raises(ValueError, match=f"HALOATTN_CUDA_{direction}='fast'; allowed: auto, portable, hopper"):
        launch.forward_kernel_code() if direction == "FORWARD" else launch.backward_kernel_code()


def test_launch_copies_rows_that_are_not_16_byte_aligned():
    from haloattn.backends.cuda.launch import _kernel_ready

    t = torch.randn(1, 8, 2, 72).to(torch.float16)[..., 4:68]  # 8-byte offset rows
    ready = _kernel_ready(t)
    assert ready.is_contiguous() and torch.equal(ready, t)
    aligned = torch.randn(1, 8, 2, 64).to(torch.float16)
    assert _kernel_ready(aligned) is aligned


@needs_nvcc
def test_ldmatrix_addressing_gives_the_mma_fragments(tmp_path):
    exe = _host_program(tmp_path, "fragment_check")
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.strip() == "ok"


def _cutlass_include():
    """The nvidia-cutlass wheel's headers (a test extra, as CMake finds them), or None."""
    import importlib.util

    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    include = Path(spec.submodule_search_locations[0]) / "source" / "include"
    return include if (include / "cute" / "arch" / "mma_sm90.hpp").exists() else None


@needs_nvcc
@pytest.mark.parametrize("source", ["neighborhood_forward_sm90.cu", "neighborhood_backward_sm90.cu"])
def test_hopper_kernels_keep_their_wgmma_asynchronous(tmp_path, source):
    """Where ptxas cannot prove that no register of a wgmma in flight is touched (a wgmma issued
    under a branch while others are in flight, one in flight across a loop's back edge, an
    accumulator redefined by other instructions before the wait), it waits for every wgmma right
    after its issue, in the whole kernel, and only says so in an info line (C7510-C7520). The
    kernel stays correct and runs 1.2-1.4x slower (a forward built so measured 0.74x on an H100,
    2026-11-27). Compiles each Hopper source for sm_90a as the module does and fails on it.

    Then, from the disassembly, that no A fragment held in registers across a tile loop (Q in the
    forward, the own tiles in the backward) is overwritten while a later product reads it: ptxas
    13.0 did so without a word in the backward's 1-D kernels (wrong gradients)."""
    include = _cutlass_include()
    if include is None:
        pytest.skip("needs the nvidia-cutlass wheel's headers (pip install nvidia-cutlass)")
    cubin = tmp_path / "kernel.cubin"
    result = subprocess.run(
        ["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-DHALOATTN_SM90A",
         "--expt-relaxed-constexpr", "-I", str(include), "-I", str(ROOT / "csrc"), "-cubin",
         str(ROOT / "csrc" / source), "-o", str(cubin)],
        capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    serialised = [line for line in (result.stdout + result.stderr).splitlines() if "instructions are serialized" in line]
    assert not serialised, "\n".join(serialised[:3])
    nvdisasm = _nvdisasm()
    assert nvdisasm, "no nvdisasm on PATH or in the triton wheel (backends/nvidia/bin) to check the fragments"
    sass = tmp_path / "kernel.sass"
    with open(sass, "w") as out:
        subprocess.run([nvdisasm, "-c", str(cubin)], stdout=out, stderr=subprocess.DEVNULL, check=True, timeout=600)
    kernels = listings(str(sass))
    held = [name for name, lines in kernels.items() if any(REGISTER_A.search(line) for line in lines)]
    assert held, "no kernel holds A fragments in registers: the check below would test nothing"
    overwritten = {name[-90:]: bad[:2] for name, lines in kernels.items() if (bad := fragment_overwrites(lines))}
    assert not overwritten, overwritten


def _nvdisasm():
    """nvdisasm from PATH, or the copy the triton wheel ships (CI has triton, not always a CUDA toolkit's)."""
    import importlib.util

    found = shutil.which("nvdisasm")
    spec = importlib.util.find_spec("triton")
    if found is None and spec is not None and spec.submodule_search_locations:
        bundled = Path(spec.submodule_search_locations[0]) / "backends" / "nvidia" / "bin" / "nvdisasm"
        found = str(bundled) if bundled.exists() else None
    return found
