"""`jaxlaunch init NAME [--template minimal|data-parallel|sharded]`: a new job, ready to run.

Writes NAME.yaml (the spec) and NAME.py (the entrypoint; '-' and '.' in NAME become '_' so the
file name is a plain module name) into a folder, never over an existing file. Each template
runs as written with `jaxlaunch run NAME.yaml` on a laptop (1 node, 2 processes, CPU devices)
and is a starting point for the real job: the specs' comments say what to change for Slurm.

Entry point: `write_job(name, template, folder)`.
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

from .errors import UsageError
from .spec import JOB_NAME

# --- minimal ---------------------------------------------------------------------------------

MINIMAL_SPEC = """\
# ${name}: the smallest jaxlaunch job: 2 processes, each prints its rank, one allreduce.
#   jaxlaunch run ${spec_file}               # here, under mpirun; prints the result (also in RUN_DIR/result.json)
#   jaxlaunch run ${spec_file} --dry-run     # the exact mpirun command, without running it
#   jaxlaunch submit ${spec_file}            # on Slurm, from a login node (set slurm: below first)
# Every key is described in jaxlaunch's docs: docs/reference/spec.md.
name: ${name_value}
# the entrypoint is file.py:function, relative to this file
entrypoint: ${job_file}:main
nodes: 1                          # jaxlaunch run emulates several nodes on this machine
processes_per_node: 2
devices_per_process: 1
platform: cpu                     # cpu | gpu
timeout: 5m                       # stopped after this, with a report of where each rank was
# slurm: {partition: debug, time: 10m}
"""

MINIMAL_JOB = '''\
"""${name}: every process prints its rank, the processes sum one number each with
launcher.allreduce, and rank 0's return value becomes RUN_DIR/result.json.

    jaxlaunch run ${spec_file}
"""

import jax.numpy as jnp

import launcher


def main(ctx: launcher.JobContext):
    # Printed lines show up prefixed [rank N], and in RUN_DIR/logs/rank-N.log.
    print(f"rank {ctx.rank} of {ctx.size} (node {ctx.node_index}, local rank {ctx.local_rank}) "
          f"drives {ctx.local_devices}", flush=True)
    # One contribution per process (rank + 1), summed over all of them: 1 + 2 + ... + size.
    total = float(launcher.allreduce(jnp.float32(ctx.rank + 1)))
    expected = ctx.size * (ctx.size + 1) / 2
    if total != expected:
        raise RuntimeError(f"allreduce gave {total}, expected {expected}")
    return {"processes": ctx.size, "sum": total, "devices_per_process": ctx.num_local_devices}
'''

# --- data-parallel ---------------------------------------------------------------------------

DATA_PARALLEL_SPEC = """\
# ${name}: data-parallel training of an MLP on synthetic data; gradients averaged over every device
# of every process. The same global batch, so the same step, on any layout.
#   jaxlaunch run ${spec_file}                                   # here: 2 processes x 2 CPU devices
#   jaxlaunch run ${spec_file} --set params.steps=200 --set params.learning_rate=0.05
#   jaxlaunch submit ${spec_file}                                # on Slurm (set slurm: below first)
# Preemption-safe: it checkpoints every checkpoint_every steps and on a notice (Slurm's time-limit
# warning, a preemption, or `kill -USR2` to jaxlaunch run, which then exits 75); continue with
#   jaxlaunch run --resume RUN_DIR                               # (on Slurm the job requeues itself)
name: ${name_value}
entrypoint: ${job_file}:main
nodes: 1
processes_per_node: 2
devices_per_process: 2
platform: cpu                     # gpu: devices_per_process GPUs per process, bound by local rank
timeout: 10m
params:
  steps: 40
  learning_rate: 0.1
  global_batch: 64                # split over every device of every process
  features: 8
  hidden: 32
  checkpoint_every: 20
  seed: 0
# keep_checkpoints: 2
# async_checkpoints: true        # saves return once the state is in host memory; false: block until on disk
# slurm: {partition: gpu, time: 1h, gpus_per_node: 4, max_requeues: 3, checkpoint_notice: 90}
"""

DATA_PARALLEL_JOB = '''\
"""${name}: data-parallel training of a small MLP on synthetic data.

Every process builds the same global batch from the seed, and each local device takes the slice
its global device index names, so any layout (nodes x processes x devices) computes the same
step. Local devices run the step with pmap; launcher.allreduce(op="mean") averages the gradients
over every device of every process.

Preemption-safe: a checkpoint every `checkpoint_every` steps and whenever ctx.should_stop() says
a notice came; a restarted, requeued or resumed run (jaxlaunch run --resume RUN_DIR) continues
from the latest one. The losses are part of the checkpoint, so the result covers every attempt.

    jaxlaunch run ${spec_file}
"""

import jax
import jax.numpy as jnp
import numpy as np

import launcher


def init_params(seed: int, sizes: list[int]) -> dict:
    rng = np.random.default_rng([seed, 7])
    params = {}
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"w{layer}"] = (rng.normal(size=(fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        params[f"b{layer}"] = np.zeros(fan_out, np.float32)
    return params


def dataset(seed: int, examples: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    """The whole training set, the same on every process: y = sin(x . v)."""
    rng = np.random.default_rng([seed, 1])
    x = rng.normal(size=(examples, features)).astype(np.float32)
    v = (rng.normal(size=features) / np.sqrt(features)).astype(np.float32)
    return x, np.sin(x @ v)[:, None].astype(np.float32)


def forward(params, x):
    layers = len(params) // 2
    for layer in range(layers):
        x = x @ params[f"w{layer}"] + params[f"b{layer}"]
        if layer < layers - 1:
            x = jnp.tanh(x)
    return x


def loss_fn(params, x, y):
    return jnp.mean((forward(params, x) - y) ** 2)


def main(ctx: launcher.JobContext):
    steps = int(ctx.params.get("steps", 40))
    lr = float(ctx.params.get("learning_rate", 0.1))
    global_batch = int(ctx.params.get("global_batch", 64))
    features = int(ctx.params.get("features", 8))
    hidden = int(ctx.params.get("hidden", 32))
    checkpoint_every = int(ctx.params.get("checkpoint_every", 20))
    seed = int(ctx.params.get("seed", 0))

    n = ctx.num_local_devices
    devices = ctx.size * n
    if global_batch % devices:
        raise ValueError(f"params.global_batch={global_batch} does not split evenly over {devices} devices; "
                         f"choose a multiple of {devices}")
    per_device = global_batch // devices
    x, y = dataset(seed, global_batch, features)
    first = ctx.global_device_offset * per_device     # this process's devices: offset .. offset + n - 1
    to_devices = jax.pmap(lambda a: a)                 # row i of the leading axis onto local device i
    xs = to_devices(x[first:first + n * per_device].reshape(n, per_device, features))
    ys = to_devices(y[first:first + n * per_device].reshape(n, per_device, 1))

    grad_step = jax.pmap(jax.value_and_grad(loss_fn))
    update = jax.pmap(lambda p, g: jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g))

    # The state: the parameters, replicated on every local device (one row each), and the losses.
    params = init_params(seed, [features, hidden, hidden, 1])
    state = {"params": to_devices(jax.tree_util.tree_map(lambda a: np.stack([a] * n), params)),
             "losses": np.zeros(0)}
    start = 0
    restored = ctx.checkpoints.restore(like=state)     # None on a first run
    if restored is not None:
        start, state = restored
        ctx.logger.info("resumed from the checkpoint of step %d (attempt %d)", start, ctx.attempt)
    params, losses = state["params"], list(state["losses"])

    for step in range(start, steps):
        # Checked before each step on every rank; all ranks get the same answer at the same step.
        if ctx.should_stop():
            ctx.checkpoints.save(step, {"params": params, "losses": np.array(losses)})
            ctx.logger.info("checkpointed at step %d after a preemption notice; stopping", step)
            return None
        loss, grads = grad_step(params, xs, ys)
        # Outside pmap: the mean over every device of every process (one row per local device).
        grads = launcher.allreduce(grads, op="mean")
        losses.append(float(launcher.allreduce(loss, op="mean")[0]))
        params = update(params, grads)
        if step % 10 == 0 or step == steps - 1:
            ctx.logger.info("step %d loss %.6f", step, losses[-1])
        if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            ctx.checkpoints.save(step + 1, {"params": params, "losses": np.array(losses)})

    return {"first_loss": losses[0], "final_loss": losses[-1], "losses": losses, "devices": devices,
            "attempt": ctx.attempt}
'''

# --- sharded ---------------------------------------------------------------------------------

SHARDED_SPEC = """\
# ${name}: model parallel inside each process (the MLP's weights split over its devices, ctx.mesh),
# data parallel across processes (gradients averaged with launcher.allreduce).
#   jaxlaunch run ${spec_file}                         # here: 2 processes x 2 CPU devices
#   jaxlaunch run ${spec_file} --set params.hidden=64
#   jaxlaunch submit ${spec_file}                      # on Slurm (set slurm: below first)
name: ${name_value}
entrypoint: ${job_file}:main
nodes: 1
processes_per_node: 2
devices_per_process: 2            # the model is split over these; params.hidden must divide by it
platform: cpu
timeout: 10m
params:
  steps: 20
  learning_rate: 0.2
  features: 16
  hidden: 32
  outputs: 4
  examples: 64                    # per process
# slurm: {partition: gpu, time: 1h, gpus_per_node: 4}
"""

SHARDED_JOB = '''\
"""${name}: model parallel inside each process, data parallel across processes.

A two-layer MLP whose weights are split over the process's devices (ctx.mesh, axis "devices"):
W1 by columns and W2 by rows, so each device holds a slice of the hidden layer and XLA adds the
reduction between them. Each process trains on its own batch; launcher.allreduce averages the
sharded gradients over the processes and they keep their sharding.

    jaxlaunch run ${spec_file}
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import launcher
from launcher.rank.context import DEVICE_AXIS


def init(features: int, hidden: int, outputs: int) -> dict:
    rng = np.random.default_rng(0)  # the same initial weights on every process
    return {"w1": (rng.standard_normal((features, hidden)) / np.sqrt(features)).astype(np.float32),
            "w2": (rng.standard_normal((hidden, outputs)) / np.sqrt(hidden)).astype(np.float32)}


def batch(rank: int, examples: int, features: int, outputs: int):
    rng = np.random.default_rng(100 + rank)  # each process its own data
    x = rng.standard_normal((examples, features)).astype(np.float32)
    return x, np.sin(x[:, :outputs]).astype(np.float32)


def loss_fn(params, x, y):
    return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)


def main(ctx: launcher.JobContext):
    features, hidden, outputs, examples = (int(ctx.params.get(key, default)) for key, default in
                                           (("features", 16), ("hidden", 32), ("outputs", 4), ("examples", 64)))
    steps, lr = int(ctx.params.get("steps", 20)), float(ctx.params.get("learning_rate", 0.2))
    if hidden % ctx.num_local_devices:
        raise ValueError(f"params.hidden={hidden} does not split over {ctx.num_local_devices} devices; "
                         f"choose a multiple of {ctx.num_local_devices}")

    shardings = {"w1": NamedSharding(ctx.mesh, PartitionSpec(None, DEVICE_AXIS)),   # columns split
                 "w2": NamedSharding(ctx.mesh, PartitionSpec(DEVICE_AXIS, None))}   # rows split
    params = {k: jax.device_put(v, shardings[k]) for k, v in init(features, hidden, outputs).items()}
    replicated = NamedSharding(ctx.mesh, PartitionSpec())
    x, y = (jax.device_put(a, replicated) for a in batch(ctx.rank, examples, features, outputs))

    grad_step = jax.jit(jax.value_and_grad(loss_fn))
    update = jax.jit(lambda p, g: jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g), out_shardings=shardings)
    losses = []
    for step in range(steps):
        loss, grads = grad_step(params, x, y)
        grads = launcher.allreduce(grads, op="mean")   # sharded over local devices, averaged over processes
        losses.append(float(launcher.allreduce(np.float32(loss), op="mean")))
        params = update(params, grads)
        if step % 10 == 0 or step == steps - 1:
            ctx.logger.info("step %d loss %.6f", step, losses[-1])
    return {"first_loss": losses[0], "final_loss": losses[-1], "losses": losses,
            "w1_sharding": str(params["w1"].sharding.spec), "w1": np.asarray(params["w1"]),
            "w2": np.asarray(params["w2"])}
'''

TEMPLATES = {
    "minimal": (MINIMAL_SPEC, MINIMAL_JOB),
    "data-parallel": (DATA_PARALLEL_SPEC, DATA_PARALLEL_JOB),
    "sharded": (SHARDED_SPEC, SHARDED_JOB),
}

# Plain YAML scalars the core schema would read as something other than a string.
_NOT_STRINGS = {"null", "Null", "NULL", "true", "True", "TRUE", "false", "False", "FALSE"}


def job_file_name(name: str) -> str:
    """NAME.py with '-' and '.' as '_': `my-job` -> `my_job.py`."""
    return re.sub(r"[-.]", "_", name) + ".py"


def _yaml_name(name: str) -> str:
    """The name as a YAML value that reads back as this string (`123`, `true` need quotes)."""
    return name if name[0].isalpha() and name not in _NOT_STRINGS else f'"{name}"'


def render_job(name: str, template: str = "minimal") -> dict[str, str]:
    """Pure: {file name: text} for the spec and the entrypoint."""
    if template not in TEMPLATES:
        raise UsageError(f"--template {template}: no such template.\n  fix: choose one of {', '.join(TEMPLATES)}")
    if not JOB_NAME.fullmatch(name):  # fullmatch: the pattern's `$` would let a trailing newline through
        raise UsageError(f"{name!r} is not a valid job name.\n  fix: use letters, digits, '.', '_' or '-', starting "
                         f"with a letter or digit, at most 64 characters (e.g. my-job)")
    values = {"name": name, "name_value": _yaml_name(name), "spec_file": f"{name}.yaml",
              "job_file": job_file_name(name)}
    spec, job = TEMPLATES[template]
    return {f"{name}.yaml": Template(spec).substitute(values), job_file_name(name): Template(job).substitute(values)}


def write_job(name: str, template: str = "minimal", folder: Path | str | None = None) -> list[Path]:
    """Write NAME.yaml and NAME.py (see job_file_name) into `folder` (default: the working
    directory); returns their paths, spec first. Raises UsageError for a bad name or template,
    a missing folder, or a file that exists already (nothing is overwritten, nothing half-written)."""
    files = render_job(name, template)
    folder = Path.cwd() if folder is None else Path(folder)
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder.\n  fix: create it first, or run jaxlaunch init in another folder")
    paths = [folder / file for file in files]
    existing = [str(p) for p in paths if p.exists() or p.is_symlink()]
    if existing:
        raise UsageError(f"{' and '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; "
                         f"jaxlaunch init never overwrites a file.\n  fix: choose another NAME, or move "
                         f"{'it' if len(existing) == 1 else 'them'} away first")
    written = []
    try:
        for path, text in zip(paths, files.values()):
            with open(path, "x", encoding="utf-8") as out:  # "x": fails instead of replacing a file made meanwhile
                out.write(text)
            written.append(path)
    except FileExistsError as error:
        for path in written:
            path.unlink()
        raise UsageError(f"{error.filename} appeared while writing; jaxlaunch init never overwrites a file.\n"
                         f"  fix: choose another NAME, or move it away first") from None
    return paths
