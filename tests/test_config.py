"""Tests for :mod:`mpikmeans.config`: packaged defaults < YAML file < CLI flags,
validation of every setting, and configs/default.yaml."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from mpikmeans.config import RunConfig, build_config, load_yaml, option_keys
from mpikmeans.errors import UsageError

REPO = Path(__file__).resolve().parent.parent
DEFAULT_YAML = REPO / "configs" / "default.yaml"

DEFAULTS = {
    "k": None, "init": "k-means++", "seed": 0, "max_iter": 300, "tol": 0.0, "backend": "auto",
    "dtype": "float64", "empty_cluster": "farthest", "output_dir": None, "threads": None,
    "share_gpus": False, "chunk_rows": None, "checkpoint": None, "checkpoint_every": None, "resume": None,
    "overwrite": False, "ignore": None, "missing": "error", "n_init": 1, "normalize": "none", "write_arff": False,
}


def yaml_file(tmp_path, text: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return str(path)


def test_defaults():
    got = dataclasses.asdict(RunConfig())
    assert {key: got[key] for key in DEFAULTS} == DEFAULTS
    assert option_keys() == [f.name.replace("_", "-") for f in dataclasses.fields(RunConfig)]
    assert set(option_keys()) >= {key.replace("_", "-") for key in DEFAULTS}
    as_dict = RunConfig(k=3).as_dict()
    assert list(as_dict) == option_keys()
    assert {key: as_dict[key.replace("_", "-")] for key in DEFAULTS} == {**DEFAULTS, "k": 3}


def test_build_with_only_k():
    cfg = build_config({}, {"k": 5})
    assert cfg == dataclasses.replace(RunConfig(), k=5)
    assert cfg.k == 5 and cfg.max_iter == 300 and cfg.init == "k-means++"


def test_k_is_required():
    with pytest.raises(UsageError, match="-k"):
        build_config({}, {})


def test_yaml_dashed_and_underscored_keys(tmp_path):
    a = load_yaml(yaml_file(tmp_path, "max-iter: 5\nempty-cluster: farthest\nshare-gpus: true\n"))
    b = load_yaml(yaml_file(tmp_path, "max_iter: 5\nempty_cluster: farthest\nshare_gpus: true\n"))
    assert a == b == {"max_iter": 5, "empty_cluster": "farthest", "share_gpus": True}


def test_layering_file_then_cli(tmp_path):
    file_values = load_yaml(yaml_file(tmp_path, "k: 4\nseed: 3\nmax-iter: 7\ntol: 0.5\nbackend: cpu\n"))
    cfg = build_config(file_values, {"seed": 9, "backend": "auto"})
    assert cfg.k == 4 and cfg.max_iter == 7 and cfg.tol == 0.5  # from the file
    assert cfg.seed == 9 and cfg.backend == "auto"  # the CLI wins
    assert cfg.dtype == "float64" and cfg.init == "k-means++"  # packaged defaults
    cfg = build_config(file_values, {"k": 12})
    assert cfg.k == 12 and cfg.seed == 3


def test_integer_tol_becomes_float(tmp_path):
    cfg = build_config(load_yaml(yaml_file(tmp_path, "k: 2\ntol: 1\n")), {})
    assert cfg.tol == 1.0 and isinstance(cfg.tol, float)


def test_init_may_be_an_existing_file(tmp_path):
    centres = tmp_path / "c.csv"
    centres.write_text("1,2\n")
    assert build_config({}, {"k": 1, "init": str(centres)}).init == str(centres)
    assert build_config({}, {"k": 1, "init": "range"}).init == "range"


@pytest.mark.parametrize("text, needle", [
    ("maxiter: 3\n", "maxiter"),
    ("k: 2\nempty_clusters: keep\n", "empty_clusters"),
    ("K: 2\n", "'K'"),
])
def test_unknown_key(tmp_path, text, needle):
    with pytest.raises(UsageError) as info:
        load_yaml(yaml_file(tmp_path, text))
    assert needle in info.value.message
    assert "max-iter" in info.value.message  # lists the known keys


@pytest.mark.parametrize("text", ["- k\n- 3\n", "just a string\n", "k: [1, 2\n"])
def test_not_a_mapping_or_not_yaml(tmp_path, text):
    with pytest.raises(UsageError, match="--config"):
        load_yaml(yaml_file(tmp_path, text))


def test_missing_and_empty_file(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        load_yaml(str(tmp_path / "missing.yaml"))
    assert load_yaml(yaml_file(tmp_path, "# nothing\n")) == {}


INVALID = [
    ("k", 0), ("k", -3), ("k", 2.5), ("k", "8x"), ("k", "2:1"), ("k", [2, "x"]), ("k", True),
    ("scores", "some"), ("scores", None), ("score_sample", -1), ("score_sample", 2.5),
    ("seed", -1), ("seed", 1.5), ("seed", "x"),
    ("max_iter", 0), ("max_iter", -1), ("max_iter", 2.5), ("max_iter", "10"),
    ("tol", -0.1), ("tol", "small"), ("tol", float("nan")), ("tol", None),
    ("backend", "tpu"), ("backend", "CPU"), ("backend", None),
    ("dtype", "float16"), ("dtype", "double"),
    ("empty_cluster", "nearest"), ("empty_cluster", None),
    ("init", "kmeans++"), ("init", "no-such-file.csv"), ("init", None),
    ("threads", 0), ("threads", -2), ("threads", 1.5),
    ("chunk_rows", 0), ("chunk_rows", 2.5),
    ("checkpoint_every", 0), ("checkpoint_every", 1.5), ("resume", "no-such-checkpoint.npz"),
]

# values YAML produces from a slip of the pen ('max-iter: yes', 'share-gpus: "no"',
# 'threads: true'): a bool is not a count, and a string is not a flag
INVALID_TYPES = [
    ("max_iter", True), ("seed", True), ("tol", True), ("threads", True), ("chunk_rows", True),
    ("share_gpus", "no"), ("share_gpus", "yes"), ("share_gpus", 1),
    ("checkpoint_every", True), ("overwrite", "no"),
]


@pytest.mark.parametrize("key, value", INVALID + INVALID_TYPES, ids=lambda v: repr(v))
def test_invalid_values(key, value):
    if key not in {f.name for f in dataclasses.fields(RunConfig)}:
        pytest.skip(f"no setting {key} in this version")
    values = {"k": 3, key: value}
    with pytest.raises(UsageError) as info:
        build_config(values, {})
    shown = key.replace("_", "-")
    assert shown in info.value.message or (key == "k" and "-k" in info.value.message), info.value.message


def test_output_dir_from_yaml_is_a_path(tmp_path):
    # 'output-dir: 2024' is a directory named 2024 to the user; YAML reads an int
    try:
        cfg = build_config(load_yaml(yaml_file(tmp_path, "k: 2\noutput-dir: 2024\n")), {})
    except UsageError:
        return
    assert isinstance(cfg.output_dir, str) and cfg.output_dir == "2024"


def test_cli_option_for_every_key():
    # the YAML keys are the long option names of 'mpikmeans run'
    from mpikmeans.cli.run import run

    opts = {o for p in run.params for o in getattr(p, "opts", [])}
    for key in option_keys():
        assert f"--{key}" in opts or (key == "k" and "-k" in opts), key


# --------------------------------------------------------------------------- configs/default.yaml

def test_default_yaml_is_the_packaged_defaults():
    assert DEFAULT_YAML.is_file(), f"{DEFAULT_YAML} is missing"
    values = load_yaml(str(DEFAULT_YAML))
    assert dataclasses.replace(RunConfig(), **values) == RunConfig()


def test_default_yaml_documents_every_key():
    assert DEFAULT_YAML.is_file(), f"{DEFAULT_YAML} is missing"
    lines = DEFAULT_YAML.read_text().splitlines()
    for key in option_keys():
        pattern = re.compile(rf"^\s*(#\s*)?({re.escape(key)}|{re.escape(key.replace('-', '_'))})\s*:")
        found = [i for i, line in enumerate(lines) if pattern.match(line)]
        assert found, f"{key} is not in {DEFAULT_YAML}"
        i = found[0]
        documented = "#" in lines[i].split(":", 1)[1] or (i > 0 and lines[i - 1].lstrip().startswith("#"))
        assert documented, f"{key}: no comment on or above its line in {DEFAULT_YAML}"


@pytest.mark.parametrize("values, needle", [
    ({"n_init": 0}, "--n-init"),
    ({"normalize": "unit"}, "--normalize"),
    ({"missing": "skip"}, "--missing"),
    ({"write_arff": "yes"}, "--write-arff"),
    ({"ignore": ["a"]}, "--ignore"),
    ({"n_init": 2, "resume": __file__}, "--n-init > 1"),
])
def test_issue_8_and_4_settings_are_checked(values, needle):
    with pytest.raises(UsageError, match=needle):
        build_config({}, {"k": 2, **values})


# --------------------------------------------------------------------------- where a bad value came from (issue 40, item 12)

def test_item12_a_file_value_is_named_by_file_key_and_line(tmp_path):
    path = yaml_file(tmp_path, "seed: 1\nk: three\n")
    with pytest.raises(UsageError) as info:
        build_config(load_yaml(path), {})
    assert info.value.message == f"{path}: key k: expected an integer >= 1, got 'three' (line 2)"
    path = yaml_file(tmp_path, "k: 2\nmax_iter: 0\n")
    with pytest.raises(UsageError) as info:
        build_config(load_yaml(path), {})
    assert info.value.message.startswith(f"{path}: key max_iter: expected an integer >= 1, got 0")


@pytest.mark.parametrize("values, message", [
    ({"k": 0}, "-k 0: expected an integer >= 1"),
    ({"k": "2:1"}, "-k 2:1: expected K >= 1, a list K1,K2,... or a range FIRST:LAST[:STEP] (1 <= FIRST <= LAST, "
                   "STEP >= 1); its LAST 1 is below its FIRST 2"),
    ({"k": 3, "max_iter": 0}, "--max-iter 0: expected an integer >= 1"),
    ({"k": 3, "tol": -1.0}, "--tol -1.0: expected a number >= 0"),
])
def test_item12_a_flag_is_named_as_typed(values, message):
    with pytest.raises(UsageError) as info:
        build_config({}, values)
    assert info.value.message == message


@pytest.mark.parametrize("text, needle", [
    ("k: 3\nk: 4\n", "key 'k' on line 2 is given twice: first on line 1"),
    ("k: 3\nseed: 1\nmax-iter: 2\nmax_iter: 3\n", "key 'max_iter' on line 4 is given twice: first on line 3 (as 'max-iter')"),
])
def test_item12_duplicate_keys_are_an_error(tmp_path, text, needle):
    path = yaml_file(tmp_path, text)
    with pytest.raises(UsageError) as info:
        load_yaml(path)
    assert needle in info.value.message and path in info.value.message
