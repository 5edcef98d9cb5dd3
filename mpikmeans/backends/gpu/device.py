"""CUDA devices: is numba-cuda usable, which GPUs are visible, which one a rank takes.

Importing this module never creates a CUDA context; numba-cuda itself is an
optional dependency (``pip install mpikmeans[cuda]``), and without it every
function here answers "no GPU".  ``SIM`` is true under numba-cuda's simulator
(``NUMBA_ENABLE_CUDASIM=1``, set before numba is imported), which the CI runs
the kernels on.
"""

from __future__ import annotations

import warnings

from ..base import BackendUnavailable, device_for_rank

try:  # numba-cuda is an optional dependency
    from numba import cuda

    HAVE_NUMBA_CUDA = True
    # small launches (the warm-up, tiny ranks) are deliberate; numba-cuda's
    # warning about them carries terminal colour codes into batch job logs
    warnings.filterwarnings("ignore", message=".*Grid size .* will likely result in GPU under-utilization")
except ImportError:  # pragma: no cover - exercised only where numba-cuda is absent
    cuda = None
    HAVE_NUMBA_CUDA = False


def _simulating() -> bool:
    if not HAVE_NUMBA_CUDA:
        return False
    try:
        from numba.cuda import config as _cfg
    except ImportError:  # pragma: no cover
        from numba import config as _cfg
    return bool(getattr(_cfg, "ENABLE_CUDASIM", False))


#: numba-cuda's simulator is on: kernels run as Python threads, one fake device.
SIM = _simulating()


def gpu_available() -> bool:
    """Whether the GPU backend can run here.

    Returns
    -------
    bool
        True when numba-cuda imports and at least one usable CUDA device is
        visible, or when the CUDA simulator is enabled.
    """
    if not HAVE_NUMBA_CUDA:
        return False
    if SIM:
        return True
    try:
        return bool(cuda.is_available()) and len(cuda.gpus) > 0
    except Exception:  # driver missing or broken: not usable
        return False


def gpu_count() -> int:
    """Number of visible CUDA devices (1 under the simulator, 0 without numba-cuda)."""
    if not gpu_available():
        return 0
    if SIM:
        return 1
    try:
        return len(cuda.gpus)
    except Exception:
        return 0


def _device_total_memory(index: int) -> int:
    """Total memory of device ``index`` in bytes, without creating a context."""
    try:
        from numba.cuda.cudadrv.driver import driver

        dev = driver.get_device(index)
        handle = getattr(dev, "id", index)
        res = driver.cuDeviceTotalMem(handle)
        return int(res[-1] if isinstance(res, tuple) else res)
    except Exception:
        pass
    try:
        from cuda.bindings import driver as cudrv

        err, dev = cudrv.cuDeviceGet(index)
        err, mem = cudrv.cuDeviceTotalMem(dev)
        return int(mem)
    except Exception:
        return 0


def device_descriptions() -> list[dict]:
    """Describe every visible CUDA device.

    Returns
    -------
    list of dict
        One dict per device with ``index`` (int), ``name`` (str),
        ``total_memory`` (bytes, int; 0 when unknown) and ``compute_capability``
        (``"major.minor"``).  Empty when no GPU is usable.
    """
    if not gpu_available():
        return []
    if SIM:
        return [{"index": 0, "name": "CUDA simulator", "total_memory": 0, "compute_capability": "sim"}]
    out = []
    for dev in cuda.list_devices():
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        cc = dev.compute_capability
        out.append(
            {
                "index": int(dev.id),
                "name": name,
                "total_memory": _device_total_memory(int(dev.id)),
                "compute_capability": f"{cc[0]}.{cc[1]}",
            }
        )
    return out


def select_device_for(node_rank: int, node_size: int, share: bool) -> int:
    """Pick this rank's device from its node-local rank.

    Parameters
    ----------
    node_rank : int
        Rank among the MPI processes on this node (``Split_type(COMM_TYPE_SHARED)``).
    node_size : int
        Number of MPI processes on this node.
    share : bool
        Allow several ranks on one GPU (``--share-gpus``).

    Returns
    -------
    int
        Device index (:func:`mpikmeans.backends.base.device_for_rank` of the visible devices).

    Raises
    ------
    BackendUnavailable
        No GPU is usable, or more ranks than GPUs on this node without ``share``.
    """
    return device_for_rank(node_rank, node_size, gpu_count(), share)


class DeviceLimits:
    """What the plans and launches need to know of the current device.

    Attributes
    ----------
    sm_count : int
        Multiprocessors.
    smem_optin : int
        Dynamic shared memory one block may opt in to, bytes.
    smem_sm : int
        Shared memory per multiprocessor, bytes.
    regs_sm : int
        32-bit registers per multiprocessor.
    cc : tuple of int
        Compute capability ((0, 0) under the simulator).
    """

    def __init__(self):
        dev = cuda.get_current_device()
        self.sm_count = int(getattr(dev, "MULTIPROCESSOR_COUNT", 1) or 1)
        self.smem_optin = int(getattr(dev, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", 48 * 1024) or 48 * 1024)
        self.smem_sm = int(getattr(dev, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", self.smem_optin) or self.smem_optin)
        self.regs_sm = int(getattr(dev, "MAX_REGISTERS_PER_MULTIPROCESSOR", 65536) or 65536)
        self.cc = tuple(getattr(dev, "compute_capability", (0, 0)) or (0, 0))
        if SIM:
            self.smem_optin = self.smem_sm = 48 * 1024
            self.cc = (0, 0)

    def free_memory(self) -> int:
        """Free device memory now, bytes (a large figure under the simulator)."""
        if SIM:
            return 1 << 40
        free, _total = cuda.current_context().get_memory_info()
        return int(free)
