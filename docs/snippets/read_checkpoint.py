import json
import math

import numpy as np


def read_with_numpy_alone(folder):
    """Every leaf of a checkpoint folder (RUN_DIR/checkpoints/step-NNNNNNNN), by its path in the tree.
    bfloat16 and other ml_dtypes need `import ml_dtypes` first."""
    manifest = json.load(open(f"{folder}/manifest.json"))
    leaves = {}
    for leaf in manifest["leaves"]:
        array = np.empty(leaf["shape"], leaf["dtype"])
        for piece in leaf["pieces"]:  # a region of the global array, at an offset in one process's data file
            shape = [stop - start for start, stop in piece["index"]]
            array[tuple(slice(*bounds) for bounds in piece["index"])] = np.fromfile(
                f"{folder}/{piece['file']}", leaf["dtype"], count=math.prod(shape), offset=piece["offset"]).reshape(shape)
        leaves[leaf["path"]] = array
    return leaves
