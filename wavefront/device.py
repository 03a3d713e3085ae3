"""What GPU (if any) this process sees, and the versions of the tools around it."""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata


def usable_cpus() -> int:
    """The CPUs this process may run on: a container's share, where `os.cpu_count()` answers
    the whole host's (128 on a GPU host lent 16)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    sms: int
    l2_bytes: int
    compute_capability: str
    memory_bytes: int
    driver_version: str
    cuda_runtime: str
    sm_clock_khz: int
    memory_clock_khz: int

    def as_dict(self) -> dict:
        return asdict(self)


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _gpu_hardware_present() -> bool:
    """Whether this machine has an NVIDIA GPU at all, asked without CUDA: the device nodes the
    driver creates, or nvidia-smi listing a GPU."""
    if any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0")):
        return True
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


class BrokenGpuStack(RuntimeError):
    """A GPU is present but CUDA cannot use it (driver/runtime mismatch, a missing library)."""


@functools.lru_cache(maxsize=None)
def gpu_status() -> tuple[DeviceInfo | None, str | None]:
    """-> (device, None) with a usable GPU; (None, why) without one; raises BrokenGpuStack where
    a GPU is present but the CUDA stack fails, so GPU tests fail loudly instead of skipping."""
    try:
        import cupy
        from cupy.cuda import runtime
    except ImportError as exc:
        if _gpu_hardware_present():
            raise BrokenGpuStack(f"a GPU is present but CuPy does not import: {exc}") from None
        return None, "CuPy is not installed (the gpu extra)"
    try:
        count = runtime.getDeviceCount()
        if count < 1:
            raise RuntimeError("no CUDA device")
        dev = cupy.cuda.Device()
        props = runtime.getDeviceProperties(dev.id)
    except Exception as exc:
        if _gpu_hardware_present():
            raise BrokenGpuStack(f"a GPU is present but CUDA fails: {type(exc).__name__}: "
                                 f"{exc}") from None
        return None, "no CUDA GPU is visible"
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else name
    return DeviceInfo(
        name=name,
        sms=int(props["multiProcessorCount"]),
        l2_bytes=int(props["l2CacheSize"]),
        compute_capability=f"{props['major']}.{props['minor']}",
        memory_bytes=int(props["totalGlobalMem"]),
        driver_version=_driver_version(),
        cuda_runtime=_cuda_version(runtime.runtimeGetVersion()),
        sm_clock_khz=int(props.get("clockRate", 0)),
        memory_clock_khz=int(props.get("memoryClockRate", 0)),
    ), None


def current_device() -> DeviceInfo | None:
    """The current CUDA device, or None on a machine without a GPU (BrokenGpuStack where a GPU
    is present but unusable)."""
    return gpu_status()[0]


def has_gpu() -> bool:
    return current_device() is not None


_gpu_stack_found: list = []  # [True] once found: a library installed stays installed


def require_gpu_stack(what: str) -> None:
    """A clear error where the GPU libraries (the `gpu` extra) are missing. Looked up once
    found (each call of the cache call asks; a lookup costs microseconds)."""
    if _gpu_stack_found:
        return
    missing = [name for name, module in (("cuda-tile", "cuda.tile"), ("cupy-cuda13x", "cupy"))
               if importlib.util.find_spec(module.split(".")[0]) is None
               or (module == "cuda.tile" and _find_cuda_tile() is None)]
    if missing:
        raise RuntimeError(f"{what} needs the GPU libraries {missing}: install them with "
                           "pip install 'wavefront[gpu]'")
    _gpu_stack_found.append(True)


def _find_cuda_tile():
    try:
        return importlib.util.find_spec("cuda.tile")
    except ModuleNotFoundError:
        return None


def _driver_version() -> str:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        from cupy.cuda import runtime
        return "cuda " + _cuda_version(runtime.driverGetVersion())
    except Exception:
        return "unknown"


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def find_tileiras() -> str | None:
    """tileiras as cuda-tile will find it: on PATH, else from the nvidia pip packages."""
    found = shutil.which("tileiras")
    if found:
        return found
    try:
        import nvidia
        for base in nvidia.__path__:
            cand = os.path.join(base, "cu13", "bin", "tileiras")
            if os.path.exists(cand):
                return cand
    except ImportError:
        pass
    return None


def tileiras_version() -> str | None:
    path = find_tileiras()
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (out.stdout + out.stderr).splitlines():
        if "release" in line.lower() or "version" in line.lower():
            return line.strip()
    return (out.stdout or out.stderr).strip().splitlines()[-1] if (out.stdout or out.stderr) else None


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for cand in ("/usr/local/cuda/bin/ncu",):
        if os.path.exists(cand):
            return cand
    return None


def ncu_version() -> str | None:
    path = find_ncu()
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return lines[-1] if lines else None


def software_versions() -> dict:
    return {
        "cuda_tile": package_version("cuda-tile"),
        "cupy": package_version("cupy-cuda13x"),
        "torch": package_version("torch"),
        "tileiras": tileiras_version(),
        "ncu": ncu_version(),
    }
