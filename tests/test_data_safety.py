"""No command writes over a file it did not create, a results directory never mixes two runs,
and a checkpoint resumes only the run that made it (issue 40, items 1-4, 8 and 13's directories).

Each test launches the real tool, alone or under ``mpirun -np 3``, and checks the exit code,
the message and, above all, the files left: what was there before is still there, byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli

REPO = Path(__file__).resolve().parents[1]
COMMON_SH = REPO / "mpikmeans" / "jobs" / "common.sh"
RESULTS = ("centers.csv", "labels.txt", "model.json", "summary.json")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Overlapping blobs (many iterations) with a nominal attribute-free header: 6,000 x 4."""
    path = tmp_path_factory.mktemp("safety") / "blobs.arff"
    r = run_cli(["gen-data", path, "-n", 6000, "-m", 4, "-k", 12, "--seed", 4, "--spread", 5])
    assert r.code == 0, r.err
    return path


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


def _snapshot(directory: Path) -> dict:
    """Every file under ``directory`` (hidden ones too) and its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _checkpoint(data: Path, path: Path, *args) -> None:
    """A finished run that wrote periodic checkpoints: ``path`` holds iteration 2's state."""
    r = run_cli(["run", data, "-k", 8, "--init", "range", "--max-iter", 3, "--checkpoint", path,
                 "--checkpoint-every", 1, "-o", path.parent / f"{path.stem}.out", "-q", *args])
    assert r.code == 0, r.err
    assert path.exists()


@pytest.fixture(scope="module")
def made_checkpoint(data, tmp_path_factory):
    """``_checkpoint(data, ...)`` once for the module: a checkpoint holds no path of its own, so the tests that
    resume, refuse or damage it each take a copy (:func:`_copy`) instead of a run of their own."""
    path = tmp_path_factory.mktemp("checkpoint") / "s.npz"
    _checkpoint(data, path)
    return path


# ------------------------------------------------------------------ item 1: --checkpoint never overwrites

@pytest.mark.parametrize("np_", [None, 3])
def test_item01_checkpoint_never_overwrites_input(data, tmp_path, np_):
    victim = _copy(data, tmp_path / "victim.arff")
    before = victim.read_bytes()
    for extra in ([], ["--overwrite"]):  # not even when told to replace results
        r = run_cli(["run", victim, "-k", 3, "--checkpoint", victim, "--checkpoint-every", 1, "-o", tmp_path / "o",
                     *extra], np=np_)
        assert r.code == 2, (r.out, r.err)
        assert "--checkpoint" in r.err and "input" in r.err and r.err.count("mpikmeans: error") == 1
        assert victim.read_bytes() == before
    assert not (tmp_path / "o").exists()


def test_item01_checkpoint_never_overwrites_init_or_config_file(data, tmp_path):
    init = tmp_path / "init.csv"
    init.write_text("1,1,1,1\n2,2,2,2\n3,3,3,3\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("k: 3\n")
    for target, args in ((init, ["-k", 3, "--init", init]), (cfg, ["--config", cfg])):
        before = target.read_bytes()
        r = run_cli(["run", data, *args, "--checkpoint", target, "--checkpoint-every", 1, "-o", tmp_path / "o"])
        assert r.code == 2 and "input" in r.err, (r.out, r.err)
        assert target.read_bytes() == before


def test_item01_checkpoint_never_overwrites_another_file(data, tmp_path):
    precious = tmp_path / "notes.npz"
    precious.write_bytes(b"not a checkpoint, and not mpikmeans's")
    for extra in ([], ["--overwrite"]):
        r = run_cli(["run", data, "-k", 3, "--checkpoint", precious, "-o", tmp_path / "o", *extra])
        assert r.code == 2 and "not an mpikmeans checkpoint" in r.err, (r.out, r.err)
        assert precious.read_bytes() == b"not a checkpoint, and not mpikmeans's"


def test_item01_an_earlier_checkpoint_needs_resume_or_overwrite(data, made_checkpoint, tmp_path):
    ckpt = tmp_path / "state.npz"
    _copy(made_checkpoint, ckpt)
    before = ckpt.read_bytes()
    r = run_cli(["run", data, "-k", 8, "--init", "range", "--checkpoint", ckpt, "-o", tmp_path / "a"])
    assert r.code == 2 and f"--resume {ckpt}" in r.err and "--overwrite" in r.err, (r.out, r.err)
    assert ckpt.read_bytes() == before
    # going on from it, or told to replace it: both fine
    r = run_cli(["run", data, "-k", 8, "--init", "range", "--checkpoint", ckpt, "--resume", ckpt, "-o", tmp_path / "b",
                 "-q"])
    assert r.code == 0, r.err
    r = run_cli(["run", data, "-k", 8, "--init", "range", "--checkpoint", ckpt, "--checkpoint-every", 1, "--overwrite",
                 "-o", tmp_path / "c", "-q"])
    assert r.code == 0, r.err
    assert ckpt.read_bytes() != before


# ------------------------------------------------------------------ item 2: gen-data, convert

def test_item02_gen_data_never_overwrites(tmp_path):
    keep = tmp_path / "keep.arff"
    keep.write_text("precious\n")
    r = run_cli(["gen-data", keep, "-n", 10, "-m", 2, "-k", 2])
    assert r.code == 2 and "keep.arff" in r.err and "--overwrite" in r.err, (r.out, r.err)
    assert keep.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.arff"]  # no temporary file either
    r = run_cli(["gen-data", keep, "-n", 10, "-m", 2, "-k", 2, "--overwrite", "-q"])
    assert r.code == 0, r.err
    assert keep.read_text().startswith("@relation")


def test_item02_gen_data_checks_every_output_first_under_mpirun(tmp_path):
    out, report = tmp_path / "new.arff", tmp_path / "figures.json"
    report.write_text("{}\n")
    r = run_cli(["gen-data", out, "-n", 300, "-m", 2, "-k", 2, "--report", report], np=3)
    assert r.code == 2 and "figures.json" in r.err and r.err.count("mpikmeans: error") == 1, (r.out, r.err)
    assert not out.exists() and report.read_text() == "{}\n"


@pytest.mark.parametrize("existing", ["t.npy", "t.npy.json"])
@pytest.mark.parametrize("np_", [None, 3])
def test_item02_convert_never_replaces_npy_or_json(data, tmp_path, existing, np_):
    (tmp_path / existing).write_text("old\n")
    r = run_cli(["convert", data, tmp_path / "t.npy"], np=np_)
    assert r.code == 2 and existing in r.err and "--overwrite" in r.err, (r.out, r.err)
    assert r.err.count("mpikmeans: error") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]
    assert (tmp_path / existing).read_text() == "old\n"
    r = run_cli(["convert", data, tmp_path / "t.npy", "--overwrite", "-q"], np=np_)
    assert r.code == 0, r.err
    assert np.load(tmp_path / "t.npy").shape == (6000, 4)


def test_item02_convert_never_writes_over_its_input(data, tmp_path):
    # an ARFF file whose name is the target's names file: read, never replaced, --overwrite or not
    source = _copy(data, tmp_path / "t.npy.json")
    before = source.read_bytes()
    for extra in ([], ["--overwrite"]):
        r = run_cli(["convert", source, tmp_path / "t.npy", *extra])
        assert r.code == 2 and "input" in r.err, (r.out, r.err)
        assert source.read_bytes() == before
    assert not (tmp_path / "t.npy").exists()


# ------------------------------------------------------------------ item 3: a checkpoint binds its settings

@pytest.mark.parametrize("args, needle", [
    (["--normalize", "zscore"], "--normalize none"),
    (["--seed", 7], "--seed 0"),
    (["--init", "sample"], "--init range"),
    (["--tol", 0.5], "--tol 0.0"),
    (["--ignore", "first"], "the attributes"),
    (["--empty-cluster", "keep"], "--empty-cluster farthest"),
    (["--missing", "drop"], "--missing error"),
])
def test_item03_resume_refuses_other_settings(data, made_checkpoint, tmp_path, args, needle):
    ckpt = tmp_path / "s.npz"
    _copy(made_checkpoint, ckpt)
    out = tmp_path / "resumed"
    r = run_cli(["run", data, "-k", 8, "--init", "range", "--resume", ckpt, "-o", out, *args], np=3)
    assert r.code == 2, (r.out, r.err)
    assert needle in r.err and r.err.count("mpikmeans: error") == 1, r.err
    assert not out.exists()


def test_item03_resume_refuses_other_normalize(data, made_checkpoint, tmp_path):
    ckpt = tmp_path / "s.npz"
    _copy(made_checkpoint, ckpt)
    r = run_cli(["run", data, "-k", 8, "--init", "range", "--normalize", "zscore", "--resume", ckpt,
                 "-o", tmp_path / "z"])
    assert r.code == 2 and "--normalize none" in r.err and "--normalize zscore" in r.err, (r.out, r.err)


def test_item03_resume_refuses_other_data_and_init_file(data, made_checkpoint, tmp_path):
    other = tmp_path / "other.arff"
    lines = data.read_text().splitlines(keepends=True)
    lines[-1] = lines[-1].replace("1", "2", 1)  # the same size, one value changed
    other.write_text("".join(lines))
    assert other.stat().st_size == data.stat().st_size
    ckpt = tmp_path / "s.npz"
    _copy(made_checkpoint, ckpt)
    r = run_cli(["run", other, "-k", 8, "--init", "range", "--resume", ckpt, "-o", tmp_path / "x"])
    assert r.code == 2 and "another data file" in r.err, (r.out, r.err)

    init = tmp_path / "c.csv"
    init.write_text("\n".join(",".join(str(i + j) for j in range(4)) for i in range(8)) + "\n")
    ckpt2 = tmp_path / "f.npz"
    _checkpoint(data, ckpt2, "--init", init)
    init.write_text("\n".join(",".join(str(i - j) for j in range(4)) for i in range(8)) + "\n")
    r = run_cli(["run", data, "-k", 8, "--init", init, "--resume", ckpt2, "-o", tmp_path / "y"])
    assert r.code == 2 and "--init" in r.err and "SHA-256" in r.err, (r.out, r.err)


def test_item03_resumed_summary_reports_the_centres_own_seed_and_init(data, tmp_path):
    ckpt = tmp_path / "s.npz"
    r = run_cli(["run", data, "-k", 8, "--init", "sample", "--seed", 5, "--max-iter", 3, "--checkpoint", ckpt,
                 "--checkpoint-every", 1, "-o", tmp_path / "a", "-q"])
    assert r.code == 0, r.err
    ref = tmp_path / "ref"
    assert run_cli(["run", data, "-k", 8, "--init", "sample", "--seed", 5, "-o", ref, "-q"]).code == 0
    out = tmp_path / "b"
    r = run_cli(["run", data, "-k", 8, "--init", "sample", "--seed", 5, "--resume", ckpt, "-o", out, "-q"], np=3)
    assert r.code == 0, r.err
    s = json.loads((out / "summary.json").read_text())
    assert s["seed"] == 5 and s["init"] == "sample" and s["resumed_at_iteration"] == 2
    assert (out / "centers.csv").read_bytes() == (ref / "centers.csv").read_bytes()
    assert s["inertia"] == json.loads((ref / "summary.json").read_text())["inertia"]


def _job_checkpoint_name(tmp_path: Path, **settings) -> str:
    """CKPT as the job templates' settings function works it out (bash, no scheduler)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **settings}
    script = f'set -euo pipefail; source "{COMMON_SH}"; mk_settings cpu >/dev/null; printf "%s" "$CKPT"'
    p = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_item03_job_checkpoint_name_depends_on_args(tmp_path):
    (tmp_path / "a.yaml").write_text("seed: 1\n")
    (tmp_path / "b.yaml").write_text("seed: 2\n")
    names = {
        "plain": _job_checkpoint_name(tmp_path, DATA="d.arff", K="5"),
        "seed": _job_checkpoint_name(tmp_path, DATA="d.arff", K="5", ARGS="--seed 3"),
        "zscore": _job_checkpoint_name(tmp_path, DATA="d.arff", K="5", ARGS="--normalize zscore"),
        "config a": _job_checkpoint_name(tmp_path, DATA="d.arff", K="5", CONFIG="a.yaml"),
        "config b": _job_checkpoint_name(tmp_path, DATA="d.arff", K="5", CONFIG="b.yaml"),
        "K": _job_checkpoint_name(tmp_path, DATA="d.arff", K="6"),
    }
    assert len(set(names.values())) == len(names), names
    assert all(n.startswith("d.k") and n.endswith(".checkpoint.npz") for n in names.values()), names
    # the same settings: the same name, so a resubmitted job finds its state
    assert _job_checkpoint_name(tmp_path, DATA="d.arff", K="5", ARGS="--seed 3") == names["seed"]


# ------------------------------------------------------------------ item 4: results replaced as a whole

def test_item04_overwrite_replaces_the_directory_as_a_whole(data, tmp_path):
    out = tmp_path / "res"
    r = run_cli(["run", data, "-k", 3, "--write-arff", "-o", out, "-q"], np=3)
    assert r.code == 0, r.err
    assert (out / "clustered.arff").exists()
    r = run_cli(["run", data, "-k", 5, "-o", out, "--overwrite", "-q"], np=3)
    assert r.code == 0, r.err
    assert sorted(p.name for p in out.iterdir()) == sorted(RESULTS)  # no stale clustered.arff (k = 3)
    assert json.loads((out / "summary.json").read_text())["k"] == 5
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left beside it


def test_item04_full_disk_keeps_old_results(data, tmp_path):
    out = tmp_path / "res"
    assert run_cli(["run", data, "-k", 3, "-o", out, "-q"]).code == 0
    before = _snapshot(out)
    # a file-size limit, as a full disk: centers.csv fits, labels.txt (6,000 lines) does not
    r = run_cli(["run", data, "-k", 5, "-o", out, "--overwrite"], prefix=["prlimit", "--fsize=4096"])
    assert r.code == 1, (r.out, r.err)
    assert "cannot write" in r.err and "Traceback" not in r.err
    assert _snapshot(out) == before  # the old results, whole; nothing of the new run beside them
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]


def test_item04_overwrite_keeps_a_directory_with_other_files(data, tmp_path):
    out = tmp_path / "res"
    assert run_cli(["run", data, "-k", 3, "-o", out, "-q"]).code == 0
    (out / "my-notes.txt").write_text("mine\n")
    before = _snapshot(out)
    r = run_cli(["run", data, "-k", 5, "-o", out, "--overwrite"])
    assert r.code == 2 and "my-notes.txt" in r.err, (r.out, r.err)
    assert _snapshot(out) == before


@pytest.mark.parametrize("np_", [None, 3])
def test_item04_failed_run_leaves_no_empty_output_dir(tmp_path, np_):
    bad = tmp_path / "bad.arff"
    bad.write_text("@relation b\n@attribute a numeric\n@data\n1\nx\n2\n")
    r = run_cli(["run", bad, "-k", 2], np=np_)
    assert r.code == 3, (r.out, r.err)
    r = run_cli(["run", bad, "-k", 2, "-o", tmp_path / "deep" / "er" / "out"], np=np_)
    assert r.code == 3, (r.out, r.err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.arff"]


def test_item04_npy_and_arff_default_dirs_differ(data, tmp_path):
    arff = _copy(data, tmp_path / "d.arff")
    assert run_cli(["convert", arff, tmp_path / "d.npy", "-q"]).code == 0
    r = run_cli(["run", arff, "-k", 3, "-q"])
    assert r.code == 0, r.err
    r = run_cli(["run", tmp_path / "d.npy", "-k", 3, "-q"])
    assert r.code == 0, r.err
    a = json.loads((tmp_path / "d.mpikmeans" / "summary.json").read_text())
    b = json.loads((tmp_path / "d.npy.mpikmeans" / "summary.json").read_text())
    assert a["data"].endswith("d.arff") and b["data"].endswith("d.npy")


def test_item04_results_of_another_file_are_named(data, tmp_path):
    a = _copy(data, tmp_path / "x.arff")
    b = _copy(data, tmp_path / "x.csv.arff")
    out = tmp_path / "shared"
    assert run_cli(["run", a, "-k", 3, "-o", out, "-q"]).code == 0
    r = run_cli(["run", b, "-k", 3, "-o", out])
    assert r.code == 2 and "another data file" in r.err and "x.arff" in r.err, r.err


# ------------------------------------------------------------------ item 8: a bad --resume file

def _bad_checkpoints(good: Path, tmp_path: Path) -> dict:
    raw = good.read_bytes()
    files = {
        "truncated": raw[: len(raw) // 2],
        "random": np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        "empty": b"",
        "text": b"centres,labels\n1,2\n",
    }
    paths = {}
    for name, content in files.items():
        paths[name] = tmp_path / f"{name}.npz"
        paths[name].write_bytes(content)
    np.save(tmp_path / "array.npy", np.zeros((3, 4)))
    paths["a .npy array"] = tmp_path / "array.npy"
    with zipfile.ZipFile(tmp_path / "zip.npz", "w") as z:
        z.writestr("centres.npy", b"x")
    paths["a zip without meta"] = tmp_path / "zip.npz"
    return paths


@pytest.mark.parametrize("np_", [None, 3])
def test_item08_truncated_or_random_resume_is_a_usage_error(data, made_checkpoint, tmp_path, np_):
    good = tmp_path / "good.npz"
    _copy(made_checkpoint, good)
    for what, path in _bad_checkpoints(good, tmp_path).items():
        r = run_cli(["run", data, "-k", 8, "--init", "range", "--resume", path, "-o", tmp_path / "o"], np=np_)
        assert r.code == 2, (what, r.out, r.err)
        assert "not an mpikmeans checkpoint" in r.err, (what, r.err)
        for needle in ("internal error", "BadZipFile", "pickle", "Traceback", "EOFError"):
            assert needle not in r.err, (what, r.err)
        assert r.err.count("mpikmeans: error") == 1, (what, r.err)
        assert not (tmp_path / "o").exists()
