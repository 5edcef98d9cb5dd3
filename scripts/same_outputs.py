"""The same commands with the code of a base commit and of this tree: the same labels, centres and SSE?

Issue 42's "behaviour unchanged" on data sets like the acceptance ones (blobs made by ``gen-data``,
scaled and unscaled, both initialisations, one and three ranks).  Labels must be identical; centres
and SSE may differ in the last bits only (this tree sums exactly, in fixed point, and rounds once),
so they are compared to a relative 1e-12.  Prints one line per case; exits 1 on any difference.

    python scripts/same_outputs.py            # base 0ae4460
    python scripts/same_outputs.py --base <commit> --keep /tmp/same
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [  # (name, gen-data args, run args, ranks)
    ("blobs", ["-n", "20000", "-m", "8", "-k", "6"], ["-k", "6", "--seed", "3"], 1),
    ("blobs-np3", ["-n", "20000", "-m", "8", "-k", "6"], ["-k", "6", "--seed", "3"], 3),
    ("zscore", ["-n", "20000", "-m", "8", "-k", "6"], ["-k", "6", "--seed", "3", "--normalize", "zscore"], 1),
    ("sample-k10", ["-n", "5000", "-m", "20", "-k", "10"], ["-k", "10", "--seed", "5", "--init", "sample"], 1),
]


def tool(code: str, args: list, ranks: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=code, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [sys.executable, "-m", "mpikmeans", *args]
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def outputs(out: str) -> tuple:
    labels = np.loadtxt(os.path.join(out, "labels.txt"), dtype=np.int64)
    centres = np.loadtxt(os.path.join(out, "centers.csv"), delimiter=",", skiprows=1, ndmin=2)
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        s = json.load(f)
    return labels, centres, float(s["inertia"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="0ae4460")
    p.add_argument("--keep", help="work here and keep it (default: a temporary folder)")
    a = p.parse_args()
    work = a.keep or tempfile.mkdtemp(prefix="same-outputs-")
    base = os.path.join(work, "base")
    if not os.path.isdir(base):
        subprocess.run(["git", "-C", HERE, "worktree", "add", "--detach", base, a.base], check=True,
                       capture_output=True)
    bad = 0
    try:
        for name, gen, run, ranks in CASES:
            data = os.path.join(work, f"{name}.arff")
            if not os.path.exists(data):
                done = tool(HERE, ["gen-data", data, *gen, "--seed", "1", "-q"], 1)
                if done.returncode:
                    print(f"{name}: gen-data failed: {done.stderr.strip()[-300:]}")
                    return 1
            got = {}
            for which, code in (("base", base), ("here", HERE)):
                out = os.path.join(work, f"{name}-{which}")
                done = tool(code, ["run", data, *run, "-o", out, "--overwrite", "-q"], ranks)
                if done.returncode:
                    print(f"{name}: {which} exited {done.returncode}: {done.stderr.strip()[-300:]}")
                    bad += 1
                    break
                got[which] = outputs(out)
            if len(got) < 2:
                continue
            (lb, cb, sb), (lh, ch, sh) = got["base"], got["here"]
            same_labels = np.array_equal(lb, lh)
            crel = float(np.max(np.abs(cb - ch) / np.maximum(np.abs(cb), 1e-300))) if cb.shape == ch.shape else np.inf
            srel = abs(sb - sh) / abs(sb) if sb else abs(sh)
            ok = same_labels and crel <= 1e-12 and srel <= 1e-12
            bad += not ok
            print(f"{name} (-np {ranks}): labels {'identical' if same_labels else 'DIFFER'}, centres max rel diff "
                  f"{crel:.1e}, SSE rel diff {srel:.1e}: {'same' if ok else 'NOT THE SAME'}")
    finally:
        if not a.keep:
            subprocess.run(["git", "-C", HERE, "worktree", "remove", "--force", base], capture_output=True)
            shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
