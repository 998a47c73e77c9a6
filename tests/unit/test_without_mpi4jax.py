"""When mpi4jax cannot be imported (a JAX release it does not support yet: its maintainers' warning,
mpi4jax#294), `transport: xla` still gives every launcher collective outside jit, and a call that
needs mpi4jax says so and what to do. One process, in a subprocess of its own with mpi4jax blocked."""

import json
import os
import subprocess
import sys

WITHOUT_MPI4JAX = r"""
import json, sys
sys.modules["mpi4jax"] = None  # `import mpi4jax` raises ImportError, as an unsupported JAX would make it
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize("127.0.0.1:" + sys.argv[1], num_processes=1, process_id=0)
import launcher
from launcher.rank.collectives import choice, transport
out = {"fast_path": transport.FAST_PATH}
tree = {"w": jnp.arange(4.0), "b": jnp.ones(3, jnp.bfloat16), "n": 2, "rows": jax.pmap(lambda v: v)(np.arange(2.0))}
with choice.using("xla"):
    total = launcher.allreduce(tree, op="mean")
    out["xla"] = [np.asarray(total["w"]).tolist(), str(total["b"].dtype), total["n"], np.asarray(total["rows"]).tolist()]
    out["broadcast"] = np.asarray(launcher.broadcast(jnp.arange(3))).tolist()
    out["allgather"] = np.asarray(launcher.allgather(jnp.arange(2))).tolist()
try:
    jax.jit(lambda x: launcher.allreduce(x))(jnp.ones(2))
except RuntimeError as exc:
    out["inside_jit"] = str(exc)
print(json.dumps(out))
"""


def test_transport_xla_works_without_mpi4jax_and_the_rest_says_what_to_do(tmp_path):
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    done = subprocess.run([sys.executable, "-c", WITHOUT_MPI4JAX, port], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["fast_path"] is False
    # one process: the mean is the value itself; per-device rows are averaged over the 2 local devices
    assert out["xla"] == [[0.0, 1.0, 2.0, 3.0], "bfloat16", 2.0, [0.5, 0.5]]
    assert out["broadcast"] == [0, 1, 2] and out["allgather"] == [0, 1]
    assert "mpi4jax cannot be imported" in out["inside_jit"] and "transport: xla" in out["inside_jit"]
