"""One rank per socket / NUMA node: each local rank's cores, pinning, and the process group from
torchrun's environment."""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Sequence

import torch


# ---------------------------------------------------------------------------------------------
# Cores per rank
# ---------------------------------------------------------------------------------------------
def parse_cpulist(text: str) -> List[int]:
    """``"0-3,8,10-11"`` -> [0, 1, 2, 3, 8, 10, 11]."""
    out: List[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def numa_nodes(root: str = "/sys/devices/system/node") -> List[List[int]]:
    """CPU lists of the NUMA nodes that have CPUs ([] when the layout cannot be read)."""
    nodes = []
    try:
        names = sorted((n for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit()),
                       key=lambda n: int(n[4:]))
        for n in names:
            with open(os.path.join(root, n, "cpulist")) as f:
                cpus = parse_cpulist(f.read())
            if cpus:
                nodes.append(cpus)
    except OSError:
        return []
    return nodes


def rank_cores(local_rank: int, local_world: int, spec: Optional[str] = None,
               nodes: Optional[List[List[int]]] = None, allowed: Optional[Sequence[int]] = None) -> List[int]:
    """The cores of ``local_rank`` out of ``local_world`` ranks on this machine.

    ``spec``: explicit core lists, one per local rank, separated by ``;`` or ``/`` (``"0-27;28-55"``).
    Default: if the NUMA nodes (restricted to the affinity mask) divide evenly over the ranks, rank r
    gets nodes ``[r*k, (r+1)*k)``; otherwise the affinity mask is split into ``local_world`` even
    contiguous chunks."""
    if allowed is None:
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    allowed = sorted(allowed)
    if spec:
        lists = [parse_cpulist(s) for s in spec.replace("/", ";").split(";") if s.strip()]
        if len(lists) != local_world:
            raise ValueError(f"cores: expected {local_world} core lists (one per local rank), got {len(lists)}: {spec!r}")
        if not lists[local_rank]:
            raise ValueError(f"cores: empty core list for local rank {local_rank}: {spec!r}")
        return lists[local_rank]
    if nodes is None:
        nodes = numa_nodes()
    nodes = [c for c in ([x for x in n if x in set(allowed)] for n in nodes) if c]
    if len(nodes) >= local_world and len(nodes) % local_world == 0 and len(nodes) > 1:
        k = len(nodes) // local_world
        return sorted(c for n in nodes[local_rank * k:(local_rank + 1) * k] for c in n)
    if len(allowed) < local_world:
        raise ValueError(f"cores: {local_world} local ranks but only {len(allowed)} allowed cores {allowed}")
    per, extra = divmod(len(allowed), local_world)
    start = local_rank * per + min(local_rank, extra)
    return allowed[start:start + per + (1 if local_rank < extra else 0)]


def pin_rank(cores: Sequence[int], threads: Optional[int] = None) -> int:
    """Restrict this process (and the OpenMP threads it creates afterwards) to ``cores`` and use one
    torch thread per core (or ``threads``). Returns the thread count."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))
    n = threads or len(cores)
    torch.set_num_threads(n)
    return n


def env_rank() -> Dict[str, int]:
    """rank / world_size / local_rank / local_world_size from torchrun's environment variables."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return {"rank": int(os.environ.get("RANK", "0")), "world_size": world,
            "local_rank": int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))),
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))}


def init_from_env(tp_size: int, cores: Optional[str] = None, threads: Optional[int] = None,
                  backend: str = "gloo") -> Dict[str, object]:
    """Set up this process as one rank of a ``tp_size``-way run launched by torchrun: check
    ``WORLD_SIZE``, pin it to its cores (:func:`rank_cores`, ``cores`` as there), set the torch
    threads (one per core unless ``threads``) and initialize the default process group (``gloo``;
    a 1-rank group without torchrun when ``tp_size`` is 1). Returns rank, world_size, cores, threads."""
    import torch.distributed as dist

    env = env_rank()
    if env["world_size"] != tp_size:
        raise ValueError(f"--tp {tp_size}: expected WORLD_SIZE={tp_size} (launch with "
                         f"torchrun --nproc-per-node {tp_size} -m awq_inductor --tp {tp_size}), got {env['world_size']}")
    my = rank_cores(env["local_rank"], env["local_world_size"], cores)
    n = pin_rank(my, threads)
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend)
        else:  # a single process without torchrun
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return {"rank": env["rank"], "world_size": env["world_size"], "cores": my, "threads": n}



def shutdown() -> None:
    """End this rank's part of the run: a barrier, then ``destroy_process_group``. Without the
    barrier a rank that finished first could tear its gloo pairs down while the other still had a
    collective in flight; the CI's 2-rank demo once ended "terminate called without an active
    exception" (SIGABRT in rank 1) where tests/tp_worker.py, which has the barrier, never did."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_rank(code: int = 0) -> None:
    """:func:`shutdown`, then, in a rank torchrun launched, flush stdout / stderr and end the process
    at once (``os._exit``) instead of finalizing the interpreter; elsewhere (a 1-rank group in this
    process) it returns. Why: the 2-rank demo aborted at exit in 4 of 37 runs on the AMX Xeon
    ("terminate called without an active exception"; 0 of 50 after): the ``std::terminate``
    backtrace is ``ProcessGroupGloo::runLoop`` releasing a finished work's tensor, whose Python
    object needs the GIL, while the main thread finalizes the interpreter. The group outlives
    ``destroy_process_group`` (the model's layers hold it), so its worker threads still run then."""
    shutdown()
    if "TORCHELASTIC_RUN_ID" not in os.environ and "LOCAL_WORLD_SIZE" not in os.environ:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
