"""torch's private API (raydra.private_apis says why such a module exists)."""

import os
from typing import Any, Callable

# torch's flight recorder keeps its last entries per process group when this is above 0, read as the
# process group is created (distributed_c10d; TORCH_NCCL_TRACE_BUFFER_SIZE is its older name).
FLIGHT_RECORDER_ENV = "TORCH_FR_BUFFER_SIZE"


# Entries kept: every collective of the last several steps of any model (a few hundred bytes each).
FLIGHT_RECORDER_ENTRIES = 2000

# The recorders' dump functions: NCCL's (absent from CPU builds), then the generic one (gloo, CPU).
FLIGHT_RECORDER_DUMPS = ("_dump_nccl_trace_json", "_dump_fr_trace_json")


def flight_record() -> Any:
    """torch's flight record of this process's collectives (what each process group enqueued,
    started and completed, with sequence numbers: the rank whose last started collective is behind
    the others' is the one that stopped), as JSON text; None without a process group or a recorder.

    torch documents the recorder (docs: "Flight Recorder") and its environment variable, but dumps
    it in-process only through torch._C._distributed_c10d: the public route is its automatic dump
    when a NCCL collective times out, which is the 30 minutes the hang watchdog exists to cut short.
    torch keeps two recorders: NCCL's collectives go to ProcessGroupNCCL's own
    (`_dump_nccl_trace_json`, in CUDA builds only), gloo's to the generic one (`_dump_fr_trace_json`).
    Read alone, the generic one failed the NCCL case of the flight-record test on an H200 (its
    reason cut from the log; torch's sources put NCCL's entries in the other), so both are read
    and their entries joined in the order they were created."""
    import json

    import torch.distributed

    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    if int(os.environ.get(FLIGHT_RECORDER_ENV, os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0"))) <= 0:
        return None
    from torch._C import _distributed_c10d as c10d

    dumps = [json.loads(getattr(c10d, name)(True, False)) for name in FLIGHT_RECORDER_DUMPS if hasattr(c10d, name)]
    if not dumps:
        return None
    record = {**dumps[0], "entries": sorted((e for d in dumps for e in d.get("entries", [])), key=lambda e: e.get("time_created_ns", 0))}
    for key in ("pg_config", "pg_status"):  # per process group: the groups of both backends
        record[key] = {group: value for d in dumps for group, value in d.get(key, {}).items()}
    return json.dumps(record)


def apply_activation_checkpointing(module: Any, check_fn: Callable[[Any], bool]) -> None:
    """Wrap every submodule of `module` for which `check_fn` holds so that its activations are
    recomputed in backward instead of kept. torch's FSDP2 examples use this wrapper; it lives in
    torch.distributed.algorithms._checkpoint (torch.utils.checkpoint has no module-wrapping API)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing as apply

    apply(module, check_fn=check_fn)
