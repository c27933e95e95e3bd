"""Device mesh, logical-axis rules, batch placement and the multi-host start.

The model names logical axes on its parameters (`embed`, `mlp`, `heads`, `vocab`, ...); the
config maps them to the three mesh axes with `logical_axis_rules`, as flax `examples/lm1b`
and MaxText do. The code here never mentions a model axis by name.

    mesh axes   data     pure data parallelism (parameters replicated)
                fsdp     data parallelism with parameters sharded (ZeRO-3 / FSDP)
                context  context parallelism: the sequence axis split over devices
                tensor   tensor (model) parallelism inside a layer

A batch `[B, L]` is split over (data, fsdp) along B, over context along L, and replicated
over tensor. With context = N > 1 every per-token array of a batch is put in the zig-zag
order of `posenc_jax.model.load_balance` (device i of the axis holds chunks i and 2N - 1 - i
of each row, positions included) and each device is handed only its own chunk
(`global_batch`); the model's attention then runs the ring of
`posenc_jax.model.context_parallel` (see docs/context_parallel.md).

Launching on several hosts
--------------------------
Every process runs the same command; `initialize_distributed` calls
`jax.distributed.initialize` when flags or the environment say there are several processes.
Each process loads only its own rows of each global batch (`local_rows`) and the global
array is assembled with `jax.make_array_from_process_local_data`, so the run is the same as
one process holding all devices.

The workdir is a POSIX path that every host sees (NFS, Filestore, a GCS FUSE mount):
orbax writes each checkpoint cooperatively from all hosts; process 0 writes metrics.jsonl.

TPU pod slice (e.g. v5e-32, 8 hosts): `--distributed` lets JAX find the hosts itself::

    gcloud compute tpus tpu-vm ssh $TPU --zone=$ZONE --worker=all --command \\
      "cd posenc-jax && python -m train --config=configs/default.py \\
         --workdir=/mnt/shared/run1 --distributed --config.mesh.fsdp=-1"

SLURM GPU cluster (2 nodes x 8 GPUs, one process per GPU)::

    #SBATCH --nodes=2 --ntasks-per-node=8 --gpus-per-node=8
    srun python -m train --config=configs/default.py --workdir=/shared/run1 \\
      --config.mesh.data=2 --config.mesh.fsdp=-1

  `jax.distributed.initialize()` reads the SLURM_* variables (coordinator = the first node,
  process id = SLURM_PROCID) and gives task SLURM_LOCALID the GPU of that index, so every
  task must see all the node's GPUs (`--gpus-per-node`, not `--gpus-per-task`). The workdir
  must be on a filesystem every node sees. The batch is split over data x fsdp = 16 devices.

Two processes on one machine (CPU, 4 devices each; a quick check of the multi-host path)::

    for i in 0 1; do
      JAX_NUM_CPU_DEVICES=4 python -m train --config=configs/tiny.py --workdir=/tmp/mh \\
        --coordinator_address=localhost:12355 --num_processes=2 --process_id=$i &
    done; wait

Anywhere else, set JAX_COORDINATOR_ADDRESS / --num_processes / --process_id by hand.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from posenc_jax.model import load_balance

MESH_AXES = ("data", "fsdp", "context", "tensor")
BATCH_AXES = ("data", "fsdp")
CONTEXT_AXIS = "context"


def make_mesh(axis_sizes: Mapping[str, int], *, devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh with axes (data, fsdp, context, tensor) and Auto axis types.

    `axis_sizes` maps each axis to its size; one axis may be -1 ("all remaining devices").
    The product must equal the number of devices (all of `jax.devices()` by default).
    """
    devices = list(jax.devices() if devices is None else devices)
    unknown = sorted(set(axis_sizes) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"mesh has unknown axes {unknown}; allowed axes are {list(MESH_AXES)}")
    sizes = [int(axis_sizes.get(name, 1)) for name in MESH_AXES]
    if sum(s == -1 for s in sizes) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh axis sizes must be positive or -1, got "
                         f"{dict(zip(MESH_AXES, sizes))}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"cannot fill mesh {dict(zip(MESH_AXES, sizes))}: {len(devices)} "
                             f"devices are not divisible by {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices "
                         f"but {len(devices)} are available; use -1 for one axis")
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * len(sizes),
                         devices=devices)


def normalize_rules(rules: Any) -> tuple[tuple[str, Any], ...]:
    """Logical rules as a tuple of (logical name, mesh axis | tuple of axes | None).

    Accepts a sequence of pairs or a mapping (ml_collections turns lists of pairs into tuples
    of tuples, and a ConfigDict into a mapping). Mesh axes are checked against MESH_AXES.
    """
    items = rules.items() if isinstance(rules, Mapping) else rules
    out = []
    for item in items:
        if len(item) != 2:
            raise ValueError(f"a logical axis rule must be a (logical, mesh) pair, got {item!r}")
        logical, target = item
        targets = target if isinstance(target, (tuple, list)) else (target,)
        for t in targets:
            if t is not None and t not in MESH_AXES:
                raise ValueError(f"logical axis rule {logical!r} -> {target!r} names an unknown "
                                 f"mesh axis; allowed are {list(MESH_AXES)} or None")
        out.append((str(logical), tuple(target) if isinstance(target, list) else target))
    return tuple(out)


def logical_to_mesh_spec(logical: Sequence[str | None] | None,
                         rules: Sequence[tuple[str, Any]], *, what: str = "array") -> P:
    """Maps a tuple of logical axis names to a PartitionSpec over mesh axes.

    Rules are in priority order, as in `flax.linen.logical_to_mesh_axes`: a dimension takes
    the first rule for its name whose mesh axes no other dimension of the array has taken
    (a name may have several rules: alternatives). Unlike flax, a name with no rule at all is
    an error (map it to None to replicate), so a typo cannot silently cost memory.
    """
    if not logical:
        return P()
    known = {name for name, _ in rules}
    for name in logical:
        if name is not None and name not in known:
            raise ValueError(f"{what}: logical axis {name!r} has no entry in logical_axis_rules "
                             f"(known: {sorted(known)}); map it to a mesh axis or to None")
    result: list[Any] = [None] * len(logical)
    assigned = [name is None for name in logical]
    used: set[str] = set()
    for name, target in rules:
        if name not in logical:
            continue
        pos = list(logical).index(name)
        axes = set(target if isinstance(target, tuple) else (target,)) - {None}
        if assigned[pos] or axes & used:
            continue
        result[pos], assigned[pos] = target, True
        used |= axes
    return P(*result)


def check_divisible(shape: Sequence[int], spec: P, mesh: Mesh, *, what: str) -> None:
    """Raises ValueError when a dimension is not divisible by the mesh axes it is split over."""
    for dim, axes in zip(shape, spec):
        if axes is None:
            continue
        names = axes if isinstance(axes, tuple) else (axes,)
        size = math.prod(mesh.shape[n] for n in names)
        if dim % size:
            raise ValueError(f"{what}: dimension {dim} of shape {tuple(shape)} is sharded over "
                             f"mesh axes {names} of total size {size}, which does not divide it")


def context_size(mesh: Mesh) -> int:
    """The size of the mesh's context axis (1 when it has none)."""
    return int(dict(mesh.shape).get(CONTEXT_AXIS, 1))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Batch arrays `[B, L, ...]`: B split over (data, fsdp), L over context (when the mesh
    has that axis), the rest replicated."""
    length = [CONTEXT_AXIS if CONTEXT_AXIS in mesh.axis_names else None][:ndim - 1]
    return NamedSharding(mesh, P(BATCH_AXES, *length, *([None] * (ndim - 1 - len(length)))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def local_rows(mesh: Mesh, global_batch: int) -> tuple[int, int]:
    """The (shard index, shard count) of the contiguous block of batch rows this process holds.

    With data x fsdp shards along B, a process addresses some shards; they must form one
    contiguous block (true for meshes from `make_mesh`, whose device order follows processes).
    A data loader then reads rows `[index * B / count, (index + 1) * B / count)`.
    """
    shards = math.prod(mesh.shape[a] for a in BATCH_AXES)
    if global_batch % shards:
        raise ValueError(f"batch_size={global_batch} must be divisible by the mesh's data x fsdp "
                         f"= {shards} batch shards")
    index_map = batch_sharding(mesh, 1).addressable_devices_indices_map((global_batch,))
    blocks = sorted({(idx[0].start or 0, global_batch if idx[0].stop is None else idx[0].stop)
                     for idx in index_map.values()})
    lo, hi = blocks[0][0], blocks[-1][1]
    contiguous = all(a[1] == b[0] for a, b in itertools.pairwise(blocks))
    size = hi - lo
    if not contiguous or global_batch % size or lo % size:
        raise ValueError(f"this process's batch rows {blocks} of {global_batch} are not one "
                         f"aligned contiguous block; order the mesh so each process holds whole "
                         f"data shards")
    return lo // size, global_batch // size


def global_batch(mesh: Mesh, local: Mapping[str, np.ndarray], *,
                 global_batch_size: int) -> dict[str, jax.Array]:
    """Assembles global `[B, ...]` arrays from this process's rows `[B_local, ...]`.

    With a context axis of size N > 1, arrays `[B_local, L, ...]` are laid out in zig-zag
    order along L: the device at context index i receives only the columns
    `load_balance.chunk_indices(L, N, i)` of its rows (one early, one late chunk), gathered
    from the process's rows for that device alone; no device receives a full row.
    """
    shards = context_size(mesh)
    row0 = 0
    if shards > 1 and local:
        index, count = local_rows(mesh, global_batch_size)
        row0 = index * (global_batch_size // count)
    out = {}
    for key, value in local.items():
        value = np.asarray(value)
        sharding = batch_sharding(mesh, value.ndim)
        shape = (global_batch_size, *value.shape[1:])
        if shards == 1 or value.ndim < 2:
            out[key] = jax.make_array_from_process_local_data(sharding, value, shape)
            continue
        out[key] = jax.make_array_from_callback(
            shape, sharding, lambda idx, value=value: _device_chunk(value, idx, row0, shards))
    return out


def _device_chunk(value: np.ndarray, index: tuple, row0: int, shards: int) -> np.ndarray:
    """The block of `value` (this process's rows, token order) that the device at global
    `index` (row slice, column slice in zig-zag layout, ...) holds."""
    rows, cols = index[0], index[1]
    length = value.shape[1]
    chunk = length // shards
    start = cols.start or 0
    if (cols.stop or length) - start != chunk or start % chunk:
        raise ValueError(f"a device's columns {cols} of length {length} are not one of the "
                         f"{shards} context chunks")
    columns = load_balance.chunk_indices(length, shards, start // chunk)
    r = slice((rows.start or 0) - row0, None if rows.stop is None else rows.stop - row0)
    return value[r][:, columns][(slice(None), slice(None), *index[2:])]


def _env_int(name: str, default: int = 1) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def cluster_detected() -> bool:
    """True when the environment describes a multi-process job JAX can auto-configure."""
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return True
    if os.environ.get("SLURM_JOB_ID") and _env_int("SLURM_NTASKS") > 1:
        return True
    if _env_int("OMPI_COMM_WORLD_SIZE") > 1:
        return True
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return "," in hosts or bool(os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"))


def initialize_distributed(*, coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None,
                           force: bool = False) -> bool:
    """Calls `jax.distributed.initialize` when this is a multi-process job.

    Explicit arguments win; otherwise JAX autodetects (TPU pods, SLURM, Open MPI, or the
    JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID environment). Returns True
    when the distributed runtime was started. Must run before any other JAX call.
    """
    explicit = any(v is not None for v in (coordinator_address, num_processes, process_id))
    if not (explicit or force or cluster_detected()):
        return False
    if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
        num_processes = _env_int("JAX_NUM_PROCESSES")
    if process_id is None and os.environ.get("JAX_PROCESS_ID"):
        process_id = _env_int("JAX_PROCESS_ID", 0)
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    return True
