"""`torch.flagos`: the device module, named and shaped like `torch.cuda`.

Each concern lives in its own module (device management, properties, random, memory, streams, graphs,
amp); this package re-exports them so `torch.flagos.<name>` reads like `torch.cuda.<name>`.
"""

from torch_fl.runtime.device.amp import get_amp_supported_dtype, is_bf16_supported
from torch_fl.runtime.device.graphs import (
    CUDAGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from torch_fl.runtime.device.management import (
    _is_in_bad_fork as _is_in_bad_fork,  # asked for by PyTorch's device-module protocol
)
from torch_fl.runtime.device.management import (
    _lazy_init as _lazy_init,
)
from torch_fl.runtime.device.management import (
    current_device,
    device,
    device_count,
    device_of,
    get_device_name,
    init,
    is_available,
    is_initialized,
    set_device,
    synchronize,
)
from torch_fl.runtime.device.memory import (
    OutOfMemoryError,
    empty_cache,
    ipc_collect,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from torch_fl.runtime.device.properties import (
    can_device_access_peer,
    get_arch_list,
    get_device_capability,
    get_device_properties,
    is_tf32_supported,
)
from torch_fl.runtime.device.random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from torch_fl.runtime.device.streams import (
    Event,
    Stream,
    current_stream,
    default_stream,
    set_stream,
    stream,
)

__all__ = [
    "CUDAGraph",
    "Event",
    "OutOfMemoryError",
    "Stream",
    "can_device_access_peer",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_arch_list",
    "get_device_capability",
    "get_device_properties",
    "get_device_name",
    "get_rng_state",
    "get_rng_state_all",
    "graph",
    "graph_pool_handle",
    "init",
    "initial_seed",
    "ipc_collect",
    "is_available",
    "is_bf16_supported",
    "is_current_stream_capturing",
    "is_initialized",
    "is_tf32_supported",
    "make_graphed_callables",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]
