"""The recipes for container images that run jaxlaunch jobs: build_charliecloud_image.sh (a
charliecloud image directory of Debian bookworm with a jaxlaunch checkout installed, for `container:
{runtime: charliecloud}`; `make image`) and Dockerfile (an image for apptainer and pyxis, built from
the repository root). They live in the package, where `jaxlaunch doctor` finds and names them, but both
build from a checkout of jaxlaunch (the folder two above this one): from a pip install, clone the
repository and run them there. Data files, not modules; BUILDER and DOCKERFILE are their paths."""

from pathlib import Path

FOLDER = Path(__file__).resolve().parent
BUILDER = FOLDER / "build_charliecloud_image.sh"
DOCKERFILE = FOLDER / "Dockerfile"
