"""One typed run configuration: packaged defaults < YAML file < command-line flags.

The keys of a YAML file are the long option names of ``mpikmeans run``
(``max-iter: 100``; ``max_iter`` is accepted too).  An unknown key is an error,
so a misspelt setting never silently does nothing.  configs/default.yaml
documents every key with its default.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields

from .choices import (BACKEND_NAMES as BACKENDS, DEFAULT_SCORE_SAMPLE, DTYPES, INIT_METHODS, NORMALIZE_METHODS,
                      SCORE_CHOICES)
from .errors import UsageError

#: The log level of notices: what a run is about to do and what will take a while.  Shown by
#: default, as warnings are (on stderr), and above ``-v``'s INFO lines.
NOTICE = 25

EMPTY_POLICIES = ("farthest", "keep", "drop")
MISSING_POLICIES = ("error", "drop", "mean")
NOMINAL_POLICIES = ("skip", "weka")
#: What ``-k`` takes, for messages
K_FORMS = "K >= 1, a list K1,K2,... or a range FIRST:LAST[:STEP] (1 <= FIRST <= LAST, STEP >= 1)"


@dataclass
class RunConfig:
    """Settings of one ``mpikmeans run``; the field defaults are the packaged defaults.

    Attributes
    ----------
    k : int, tuple of int, or None
        Number of clusters (required).  A list (``2,4,8``) or a range
        (``2:64``, ``2:64:2``, both ends included) is a K sweep: :meth:`validate`
        makes it a sorted tuple of distinct values (:func:`parse_k`), a single
        number an int.
    init : str
        ``k-means++`` (D² sampling, scikit-learn's greedy variant), ``k-means||``
        (scalable oversampling), ``range`` (uniform in the per-attribute
        [min, max]), ``sample`` (k distinct rows drawn uniformly) or the path
        of a CSV of k x m centres.
    seed : int
        Seed of the initialisation; the result does not depend on the ranks.
    max_iter : int
        Upper bound on Lloyd iterations.
    tol : float
        Stop when no centre moved more than this (Euclidean, data units);
        0 runs until the assignment no longer changes.
    backend : str
        ``auto`` (a GPU when one is usable), ``cpu`` or ``gpu``.
    dtype : str
        Precision of the data on the GPU; sums are always float64.
    empty_cluster : str
        ``keep`` the old centre of an empty cluster, or move it to the
        ``farthest`` point from its centre.
    output_dir : str or None
        Default: the data file's stem + ``.mpikmeans/``.
    threads : int or None
        CPU threads per rank (parsing and the CPU backend); default: the rank's
        share of its node's CPUs (:func:`mpikmeans.comm.default_threads`).
    share_gpus : bool
        Allow more ranks on a node than GPUs (they then share devices).
    chunk_rows : int or None
        GPU: stream the data through in chunks of this many rows (default:
        keep it resident when it fits).
    checkpoint : str or None
        Write the loop state here during the run (and on SIGTERM/SIGUSR1).
    checkpoint_every : int or None
        Checkpoint every N iterations; default: at most every 60 seconds.
    resume : str or None
        Go on from this checkpoint.
    overwrite : bool
        Replace results already in the output directory.
    ignore : str or None
        Attributes not to cluster: names, ``first``, ``last``, 1-based
        indices or ranges, comma-separated (as Weka's ``-I``).
    missing : str
        ``?`` values: ``error``, ``drop`` the row, or fill in the attribute's
        global ``mean`` (a nominal attribute's mode; as Weka's SimpleKMeans).
    nominal : str
        Nominal attributes: ``skip`` them, or cluster them as Weka's SimpleKMeans
        does (``weka``: 0/1 distance, the mode as the centroid's value).
    n_init : int
        Initialisations to run; the lowest SSE is kept.
    normalize : str
        ``none``, ``minmax`` (Weka's default for Euclidean distance) or ``zscore``.
    write_arff : bool
        Also write the input rows with a nominal ``cluster`` attribute (Weka's AddCluster layout).
    scores : str
        ``all``: the quality scores (:mod:`mpikmeans.scores`) after the fit, in
        summary.json; ``none``: not computed.
    score_sample : int
        Rows of the sampled Euclidean silhouette (0: left out).
    """

    k: int | tuple | str | None = None
    init: str = "k-means++"
    seed: int = 0
    max_iter: int = 300
    tol: float = 0.0
    backend: str = "auto"
    dtype: str = "float64"
    empty_cluster: str = "farthest"
    output_dir: str | None = None
    threads: int | None = None
    share_gpus: bool = False
    chunk_rows: int | None = None
    checkpoint: str | None = None
    checkpoint_every: int | None = None
    resume: str | None = None
    overwrite: bool = False
    ignore: str | None = None
    missing: str = "error"
    nominal: str = "skip"
    n_init: int = 1
    normalize: str = "none"
    write_arff: bool = False
    scores: str = "all"
    score_sample: int = DEFAULT_SCORE_SAMPLE

    @property
    def sweep(self) -> bool:
        """Whether ``k`` asks for a K sweep (a list or range of K, after :meth:`validate`)."""
        return isinstance(self.k, tuple)

    @property
    def k_values(self) -> tuple:
        """The K values to cluster: the sweep's, or ``(k,)``."""
        return self.k if isinstance(self.k, tuple) else (self.k,)

    def validate(self) -> "RunConfig":
        """Check every setting; raise :class:`UsageError` naming the first bad one."""
        if self.k is None:
            # a model (--init model.json) says its K itself; model.py is imported only then, so that parsing the
            # command line (and its usage errors) imports no numpy
            given_model = isinstance(self.init, str) and self.init not in INIT_METHODS
            if given_model:
                from .model import looks_like_model

                given_model = looks_like_model(self.init)
            if not given_model:
                raise UsageError("the number of clusters is required: -k K (or 'k:' in the config file)")
        else:
            self.k = parse_k(self.k)
        _check(_is_int(self.seed) and self.seed >= 0, "seed", self.seed, "an integer >= 0")
        _check(_is_int(self.max_iter) and self.max_iter >= 1, "max-iter", self.max_iter, "an integer >= 1")
        _check(isinstance(self.tol, (int, float)) and not isinstance(self.tol, bool) and self.tol >= 0,
               "tol", self.tol, "a number >= 0")
        _check(self.backend in BACKENDS, "backend", self.backend, " or ".join(BACKENDS))
        _check(self.dtype in DTYPES, "dtype", self.dtype, " or ".join(DTYPES))
        _check(self.empty_cluster in EMPTY_POLICIES, "empty-cluster", self.empty_cluster, " or ".join(EMPTY_POLICIES))
        for key in ("threads", "chunk_rows", "checkpoint_every"):
            value = getattr(self, key)
            _check(value is None or (_is_int(value) and value >= 1), key.replace("_", "-"), value, "an integer >= 1")
        _check(_is_int(self.n_init) and self.n_init >= 1, "n-init", self.n_init, "an integer >= 1")
        _check(self.normalize in NORMALIZE_METHODS, "normalize", self.normalize, " or ".join(NORMALIZE_METHODS))
        if self.n_init > 1 and (self.resume or self.init not in INIT_METHODS):
            raise UsageError("--n-init > 1 needs a random initialisation (not a file) and cannot --resume")
        _check(self.scores in SCORE_CHOICES, "scores", self.scores, " or ".join(SCORE_CHOICES))
        _check(_is_int(self.score_sample) and self.score_sample >= 0, "score-sample", self.score_sample,
               "an integer >= 0")
        for key in ("share_gpus", "overwrite", "write_arff"):
            _check(isinstance(getattr(self, key), bool), key.replace("_", "-"), getattr(self, key), "true or false")
        _check(self.missing in MISSING_POLICIES, "missing", self.missing, " or ".join(MISSING_POLICIES))
        _check(self.nominal in NOMINAL_POLICIES, "nominal", self.nominal, " or ".join(NOMINAL_POLICIES))
        if isinstance(self.ignore, int) and not isinstance(self.ignore, bool):
            self.ignore = str(self.ignore)
        for key in ("output_dir", "checkpoint", "resume", "ignore"):
            value = getattr(self, key)
            _check(value is None or isinstance(value, str), key.replace("_", "-"), value, "a path")
        if self.resume is not None and not os.path.isfile(str(self.resume)):
            raise InvalidSetting("resume", self.resume, "an existing checkpoint file")
        _check(isinstance(self.init, str) and (self.init in INIT_METHODS or os.path.isfile(self.init)), "init",
               self.init, f"{', '.join(INIT_METHODS)}, an existing CSV file of centres or a model.json")
        if self.sweep and self.init not in INIT_METHODS:
            raise UsageError(f"-k {format_k(self.k)} (a K sweep) needs a random initialisation ({', '.join(INIT_METHODS)}): "
                             f"--init {self.init} gives centres for one K")
        return self

    def as_dict(self) -> dict:
        """Settings keyed by option name (for summary.json and checks)."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _k_error(value, why: str) -> "InvalidSetting":
    return InvalidSetting("k", value, f"{K_FORMS}; {why}")


def parse_k(value) -> int | tuple:
    """``-k``: one number of clusters (an int), or the K values of a sweep (a sorted tuple).

    Parameters
    ----------
    value : int, str or list of int
        ``8``; ``"8"``; a list ``"2,4,8,16"`` (or a YAML list); a range
        ``"FIRST:LAST"`` or ``"FIRST:LAST:STEP"``, both ends included
        (``"2:64:2"`` is 2, 4, ..., 64).

    Returns
    -------
    int or tuple of int
        An int for one number; the distinct values of a list or range, sorted,
        as a tuple (a sweep, even of one K).

    Raises
    ------
    InvalidSetting
        One value that is not an integer >= 1 ("expected an integer >= 1");
        a list or range that is not one of these forms, holds a K below 1,
        ends below its start or has a step below 1 (the message says which).
    """
    if _is_int(value):
        if value < 1:
            raise InvalidSetting("k", value, "an integer >= 1")
        return value
    if isinstance(value, (list, tuple)):
        if not value or not all(_is_int(v) for v in value):
            raise _k_error(value, "a list of K holds integers only")
        ks = tuple(value)
    elif isinstance(value, str):
        text = value.strip()
        parts = [p.strip() for p in text.split(":")] if ":" in text else [p.strip() for p in text.split(",")]
        try:
            numbers = [int(p) for p in parts]
        except ValueError:
            if len(parts) == 1:  # one value: a single run's K
                raise InvalidSetting("k", value, "an integer >= 1") from None
            bad = next(p for p in parts if not _int_text(p))
            raise _k_error(value, f"{bad!r} is not an integer") from None
        if ":" in text:
            if len(numbers) not in (2, 3):
                raise _k_error(value, "a range is FIRST:LAST or FIRST:LAST:STEP")
            first, last = numbers[0], numbers[1]
            step = numbers[2] if len(numbers) == 3 else 1
            if step < 1:
                raise _k_error(value, f"its STEP {step} is below 1")
            if last < first:
                raise _k_error(value, f"its LAST {last} is below its FIRST {first}")
            ks = tuple(range(first, last + 1, step))
        elif "," in text:
            ks = tuple(numbers)
        else:
            return parse_k(numbers[0])
    else:
        raise InvalidSetting("k", value, "an integer >= 1")
    low = min(ks)
    if low < 1:
        raise _k_error(value, f"{low} is below 1")
    return tuple(sorted(set(ks)))


def _int_text(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


def format_k(k) -> str:
    """``-k`` as a person writes it: ``8``, ``2,4,8``, ``2:64`` (a range of step 1), ``2:64:2``."""
    if not isinstance(k, tuple):
        return str(k)
    if len(k) > 2:
        steps = {b - a for a, b in zip(k, k[1:])}
        if len(steps) == 1:
            step = steps.pop()
            return f"{k[0]}:{k[-1]}" + (f":{step}" if step != 1 else "")
    return ",".join(str(v) for v in k)


#: The flag a message names for a setting: the short form where there is one.
_FLAGS = {"k": "-k", "output_dir": "--output-dir"}


def flag_of(key: str) -> str:
    """The command-line flag of a setting (``k`` -> ``-k``, ``max-iter`` -> ``--max-iter``)."""
    name = key.replace("-", "_")
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


class InvalidSetting(UsageError):
    """A setting with a value of the wrong type or range; :func:`build_config` says where it came from."""

    def __init__(self, key: str, value, expected: str):
        self.key = key.replace("-", "_")
        self.value = value
        self.expected = expected
        super().__init__(f"{flag_of(key)} {value!r}: expected {expected}")


def _check(ok: bool, key: str, value, expected: str) -> None:
    if not ok:
        raise InvalidSetting(key, value, expected)


def option_keys() -> list:
    """The YAML keys: the long option names."""
    return [f.name.replace("_", "-") for f in fields(RunConfig)]


class ConfigValues(dict):
    """The settings of a YAML file, ``{field_name: value}``, and where each was written.

    Attributes
    ----------
    path : str
    written : dict
        ``{field_name: (key as written, line number)}``.
    """

    def __init__(self, values: dict, path: str = "", written: dict | None = None):
        super().__init__(values)
        self.path = path
        self.written = written or {}


def load_yaml(path: str) -> ConfigValues:
    """Read a YAML configuration file into ``{field_name: value}``.

    Raises
    ------
    UsageError
        Unreadable file, not a mapping, an unknown key, or a key given twice
        (``max-iter`` and ``max_iter`` are one key), naming the file and line.
    """
    import yaml

    try:
        with open(path) as f:
            text = f.read()
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except OSError as exc:
        raise UsageError(f"--config {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--config {path}: not a text file") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--config {path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if data is None:
        return ConfigValues({}, path)
    if not isinstance(data, dict) or not isinstance(root, yaml.MappingNode):
        raise UsageError(f"--config {path}: expected a mapping of option names to values")
    known = {f.name for f in fields(RunConfig)}
    written = {}
    for key_node, _ in root.value:
        key, line = str(key_node.value), key_node.start_mark.line + 1
        name = key.replace("-", "_")
        if name in written:
            first_key, first_line = written[name]
            same = "" if first_key == key else f" (as {first_key!r})"
            raise UsageError(f"{path}: key {key!r} on line {line} is given twice: first on line {first_line}{same}")
        written[name] = (key, line)
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in known:
            where = f" (line {written[name][1]})" if name in written else ""
            raise UsageError(f"{path}: unknown key {key!r}{where}; known keys: {', '.join(option_keys())}")
        out[name] = value
    return ConfigValues(out, path, written)


def build_config(file_values: dict, cli_values: dict) -> RunConfig:
    """Merge the layers: packaged defaults < ``file_values`` < ``cli_values``.

    Parameters
    ----------
    file_values : dict
        From :func:`load_yaml` (field names as keys).
    cli_values : dict
        Only the flags given on the command line (field names as keys).

    Raises
    ------
    UsageError
        The first setting that is not valid, named as it was given: ``-k 0`` for
        a flag, the file, key and line for a file's value.
    """
    merged = {**file_values, **cli_values}
    try:
        cfg = dataclasses.replace(RunConfig(), **merged)
    except TypeError as exc:  # pragma: no cover - keys are checked before
        raise UsageError(str(exc)) from None
    if isinstance(cfg.tol, int) and not isinstance(cfg.tol, bool):
        cfg.tol = float(cfg.tol)
    try:
        return cfg.validate()
    except InvalidSetting as exc:
        if exc.key in cli_values:
            raise UsageError(f"{flag_of(exc.key)} {exc.value}: expected {exc.expected}") from None
        if exc.key in file_values:
            path = getattr(file_values, "path", "") or "the config file"
            key, line = getattr(file_values, "written", {}).get(exc.key, (exc.key.replace("_", "-"), None))
            where = f" (line {line})" if line else ""
            raise UsageError(f"{path}: key {key}: expected {exc.expected}, got {exc.value!r}{where}") from None
        raise
