"""The MosaicML Streaming side of bench/run_loader.py (run in its own venv).

    python run_loader_streaming.py MDS_DIR SECONDS

MDS_DIR/samples.npy holds the packed samples (int32, [n, seq_len + 1]).  They are
written once with Streaming's MDSWriter (MDS_DIR/shards), then read back with its
StreamingDataset, shuffling on, each sample turned into a torch tensor as a training
loop would; after one warm-up pass (page cache), samples are counted for SECONDS.
Prints one JSON line: {"samples_per_s": ...}.

`import streaming` imports torchvision for Streaming's image datasets, and the
torchvision wheel on PyPI only loads beside the CUDA build of torch, not the CPU
build this project uses; this path (MDSWriter, StreamingDataset of ndarrays) never
touches torchvision, so the two names it imports get stand-ins.
"""
import importlib.machinery
import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch


def _torchvision_stand_in():
    names = ["torchvision", "torchvision.datasets", "torchvision.transforms",
             "torchvision.transforms.functional"]
    mods = {n: types.ModuleType(n) for n in names}
    for n, m in mods.items():
        m.__spec__ = importlib.machinery.ModuleSpec(n, None)
    mods["torchvision.datasets"].VisionDataset = torch.utils.data.Dataset
    mods["torchvision.transforms.functional"].to_tensor = torch.as_tensor
    sys.modules.update(mods)


_torchvision_stand_in()
from streaming import MDSWriter, StreamingDataset  # noqa: E402
from streaming.base.util import clean_stale_shared_memory  # noqa: E402


def main():
    mds, seconds = Path(sys.argv[1]), float(sys.argv[2])
    shards = mds / "shards"
    if not (shards / "index.json").exists():
        samples = np.load(mds / "samples.npy")
        width = samples.shape[1]
        with MDSWriter(out=str(shards), columns={"tokens": f"ndarray:int32:{width}"},
                       size_limit=1 << 26) as w:
            for s in samples:
                w.write({"tokens": s})
    clean_stale_shared_memory()
    ds = StreamingDataset(local=str(shards), shuffle=True, shuffle_seed=0, batch_size=1)
    for s in ds:
        torch.from_numpy(s["tokens"])
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for s in ds:
            torch.from_numpy(s["tokens"])
            n += 1
            if n % 64 == 0 and time.perf_counter() - t0 >= seconds:
                break
    rate = n / (time.perf_counter() - t0)
    print(json.dumps({"samples_per_s": rate, "samples": len(ds)}))


if __name__ == "__main__":
    main()
