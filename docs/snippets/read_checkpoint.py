import json
import math

import numpy as np


def read_with_numpy_alone(folder):
    """Every leaf of a checkpoint folder (RUN_DIR/checkpoints/step-NNNNNNNN), by its
    path in the tree. bfloat16 and other ml_dtypes need `import ml_dtypes` first."""
    manifest = json.load(open(f"{folder}/manifest.json"))
    leaves = {}
    for leaf in manifest["leaves"]:
        array = np.empty(leaf["shape"], leaf["dtype"])
        # Each piece: a region of the global array, at an offset in one process's file.
        for piece in leaf["pieces"]:
            region = tuple(slice(start, stop) for start, stop in piece["index"])
            shape = [stop - start for start, stop in piece["index"]]
            data = np.fromfile(f"{folder}/{piece['file']}", leaf["dtype"],
                               count=math.prod(shape), offset=piece["offset"])
            array[region] = data.reshape(shape)
        leaves[leaf["path"]] = array
    return leaves
