"""``model.json``: a fitted clustering on disk, versioned, documented, without pickle.

A model holds what applying the clustering to new rows needs and what a
reader wants to know about it: the attributes (names, types, a nominal
attribute's categories, which were clustered, ignored or skipped), the
scaling (method, per-column offsets and scales), the missing-value policy,
the K centres in data units (a nominal attribute's value by its category's
name) and, to the bit, in the scaled units the distances are measured in,
with the run's K, dtype, initialisation, seed, SSE and row count.  The format
is described key by key in docs/model.md; :data:`FORMAT_VERSION` changes
whenever a reader of the old version would misread a new file.

Errors (docs/model.md lists them): a file that is not a model, or a model of
another format version, is a usage error (exit 2: another file, or another
mpikmeans, is wanted); a model with missing or malformed keys is bad input
(exit 3); so is a data file whose attributes do not match the model
(:func:`match_header`): the first mismatch, one line naming both files and
the attribute.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from .choices import DTYPES, NORMALIZE_METHODS as SCALING_METHODS
from .errors import InputError, RunError, UsageError
from .io.arff import select_attributes
from .io.output import MODEL, write_atomic
from .nominal import ONE, Layout
from .scaling import Scaler

#: The ``format`` key's value: what marks a JSON file as an mpikmeans model.
FORMAT = "mpikmeans-model"
#: The package's version, read from the package itself (imported before any of its modules): an import of
#: it here would close a cycle through the package's lazily loaded API (api -> model -> package -> api)
_TOOL_VERSION = sys.modules[__package__].__version__
#: The format version this mpikmeans writes and reads.
FORMAT_VERSION = 1
#: The file name a run writes its model under.
MODEL_FILE = MODEL
#: Keys every model of this version has (docs/model.md).
REQUIRED = ("format", "format_version", "tool_version", "attributes", "nominal", "missing", "scaling", "k",
            "centres", "dtype", "init", "seed", "sse", "n")
#: ``role`` of an attribute of the training data.
ROLES = ("clustered", "ignored", "skipped")
#: Keys written one entry a line
_ONE_A_LINE = ("attributes", "centres", "centres_scaled")
#: How far the data-unit centres may be from the scaled ones mapped back (a model edited by hand
#: must change both, or drop ``centres_scaled``).
_CENTRES_RTOL = 1e-9


@dataclass
class Model:
    """A fitted clustering, as :func:`load_model` reads it and :func:`save_model` writes it.

    Attributes
    ----------
    attributes : list of dict
        Every attribute of the training data, in its order: ``name``, ``type``
        (``numeric``, ``nominal``, ``string``, ``date``; None where unknown),
        ``role`` (:data:`ROLES`) and, for a nominal one, ``categories``.
    nominal : {"skip", "weka"}
        How nominal attributes were treated.
    missing : dict
        ``policy`` (``error``, ``drop``, ``mean``) and ``fill``: with ``mean``,
        the values that replace ``?`` per column (the training means, a nominal
        attribute's block one-hot at its mode, in data units: before scaling),
        a list of ``columns`` floats; None with another policy, or where not
        recorded (a model of an earlier mpikmeans).
    scaler : Scaler
        Per column (a nominal attribute's one-hot block passes unscaled).
    centres_scaled : ndarray, shape (k, columns), float64
        The centres the distances are measured to.
    dtype, init : str
    seed : int
    sse : float
        The training SSE (in the scaled units when scaled).
    n : int
        Training rows clustered.
    info : dict
        The other keys (``tool_version``, ``created``, ``data``, ``iterations``,
        ``converged``, ``sizes``, ``sse_units``, ``scores``...), kept as read.
    """

    attributes: list
    nominal: str
    missing: dict
    scaler: Scaler
    centres_scaled: np.ndarray
    dtype: str = "float64"
    init: str = "k-means++"
    seed: int = 0
    sse: float = 0.0
    n: int = 0
    info: dict = field(default_factory=dict)

    @property
    def k(self) -> int:
        return int(self.centres_scaled.shape[0])

    @property
    def clustered(self) -> list:
        """The clustered attributes' entries, in order."""
        return [a for a in self.attributes if a["role"] == "clustered"]

    @property
    def names(self) -> list:
        """The clustered attributes' names."""
        return [a["name"] for a in self.clustered]

    @property
    def layout(self) -> Layout:
        """Which columns hold which clustered attribute."""
        names, starts, values, column = [], [], [], 0
        for a in self.clustered:
            cats = tuple(a["categories"]) if a["type"] == "nominal" and self.nominal == "weka" else None
            names.append(a["name"])
            starts.append(column)
            values.append(cats)
            column += 1 if cats is None else len(cats)
        return Layout(names, starts, values)

    @property
    def centres(self) -> np.ndarray:
        """The centres in data units, shape (k, columns) (a nominal block one-hot)."""
        return self.scaler.inverse(self.centres_scaled)

    def centres_for(self, layout: Layout, model_path: str, data_path: str = "the data") -> np.ndarray:
        """The centres in data units as a run with ``layout`` starts from them (``--init model.json``).

        Parameters
        ----------
        layout : Layout
            The run's clustered attributes (``LocalData.layout``).
        model_path, data_path : str
            For the message.

        Returns
        -------
        ndarray, shape (k, layout.columns), float64
            In the run's columns (a nominal attribute's categories in the run's order).

        Raises
        ------
        InputError
            The run's data clusters other attributes than the model (by name,
            order or type), or a centre's category is not among the data's: the
            first mismatch, one line naming both files and the attribute (exit 3).
        """
        mine = self.layout
        theirs_is = f"the model {model_path}"
        for position, name in enumerate(layout.names):
            if name not in mine.names:
                raise InputError(f"{data_path}: attribute {name!r} is clustered here and not by {theirs_is} "
                                 f"(it clusters {', '.join(mine.names)})")
            if position >= len(mine.names) or mine.names[position] != name:
                raise InputError(f"{data_path}: attribute {name!r} comes where {theirs_is} has "
                                 f"{mine.names[position]!r} (clustered attribute {position + 1})")
        if len(mine.names) > len(layout.names):
            raise InputError(f"{data_path}: attribute {mine.names[len(layout.names)]!r}, which {theirs_is} clusters, "
                             "is not clustered here")
        data = self.centres
        out = np.zeros((self.k, layout.columns))
        for name, start, values, theirs_start, theirs in zip(layout.names, layout.starts, layout.values,
                                                              mine.starts, mine.values):
            if (values is None) != (theirs is None):
                raise InputError(f"{data_path}: attribute {name!r} is {'numeric' if values is None else 'nominal'} "
                                 f"here and {'nominal' if values is None else 'numeric'} in {theirs_is}")
            if values is None:
                out[:, start] = data[:, theirs_start]
                continue
            for c, category in enumerate(values):
                if category in theirs:
                    out[:, start + c] = data[:, theirs_start + theirs.index(category)]
            lost = np.flatnonzero(out[:, start:start + len(values)].max(axis=1) == 0.0)
            if len(lost):
                category = theirs[int(np.argmax(data[lost[0], theirs_start:theirs_start + len(theirs)]))]
                raise InputError(f"{data_path}: attribute {name!r}: centre {lost[0] + 1} of {theirs_is} has "
                                 f"category {category!r}, not one of this data's")
        return out

    @classmethod
    def from_run(cls, local, scaler: Scaler, result, cfg, dtype: str, scores: dict | None = None) -> "Model":
        """The model of a finished ``mpikmeans run`` (every rank builds the same one; no collective).

        Parameters
        ----------
        local : mpikmeans.io.arff.LocalData
            The run's data (its header, attribute selection, row counts and,
            with ``--missing mean``, the fill values).
        scaler : Scaler
        result : mpikmeans.lloyd.KMeansResult
            The best restart: its centres (scaled), SSE, iterations, sizes.
        cfg : mpikmeans.config.RunConfig
            ``nominal``, ``missing``, ``init``, ``seed``, ``normalize``.
        dtype : str
            The backend's (``backend.info().dtype``).
        scores : dict, optional
            :func:`mpikmeans.scores.quality_scores`'s result, kept in the model.
        """
        sel = local.selection
        clustered, ignored, skipped = list(local.names), set(sel.ignored if sel else ()), set(sel.skipped if sel else ())
        layout = local.layout
        cats = {name: list(v) for name, v in zip(layout.names, layout.values) if v is not None}
        attributes = []
        if local.header.attributes:
            for a in local.header.attributes:
                role = "clustered" if a.name in clustered else "ignored" if a.name in ignored else "skipped"
                entry = {"name": a.name, "type": a.kind, "role": role}
                if a.kind == "nominal":
                    entry["categories"] = list(a.values)
                attributes.append(entry)
        else:  # a .npy copy: its clustered columns are numeric, the others' types are not recorded
            attributes = [{"name": name, "type": "numeric", "role": "clustered"} for name in clustered]
            attributes += [{"name": name, "type": None, "role": "ignored"} for name in sorted(ignored)]
            attributes += [{"name": name, "type": None, "role": "skipped"} for name in sorted(skipped)]
        for entry in attributes:
            if entry["name"] in cats:
                entry["categories"] = cats[entry["name"]]
        info = {
            "tool_version": _TOOL_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "data": {"path": os.path.abspath(local.path), "relation": local.header.relation,
                     "format": local.header.format, "input_rows": int(local.input_rows)},
            "sse_units": "data" if scaler.method == "none" else f"scaled ({scaler.method})",
            "iterations": int(result.iterations),
            "converged": bool(result.converged),
            "stop_reason": str(result.stop_reason),
            "sizes": None if result.sizes is None else [int(s) for s in result.sizes],
        }
        if scores is not None:  # the scores of the fit, without their timing (summary.json has it)
            info["scores"] = {key: v for key, v in scores.items() if key != "seconds"}
        # the training means a '?' became: what fills a '?' of new rows (a fitted imputer, as scikit-learn's)
        fill = [float(v) for v in local.fill] if cfg.missing == "mean" and local.fill is not None else None
        return cls(attributes, cfg.nominal, {"policy": cfg.missing, "fill": fill}, scaler,
                   np.array(result.centres, dtype=np.float64), dtype, str(cfg.init), int(cfg.seed),
                   float(result.inertia), int(local.n), info)

    def to_dict(self) -> dict:
        """The JSON document (docs/model.md), keys in a fixed order."""
        layout = self.layout
        doc = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tool_version": self.info.get("tool_version", _TOOL_VERSION),
            "created": self.info.get("created"),
            "data": self.info.get("data"),
            "attributes": self.attributes,
            "nominal": self.nominal,
            "one_hot_value": ONE,
            "missing": self.missing,
            "scaling": {"method": self.scaler.method, "offset": self.scaler.offset.tolist(),
                        "scale": self.scaler.scale.tolist(),
                        "constant": [int(j) for j in np.flatnonzero(self.scaler.constant)]},
            "k": self.k,
            "centres": layout.decode(self.centres),
            "centres_scaled": self.centres_scaled.tolist(),
            "dtype": self.dtype,
            "init": self.init,
            "seed": self.seed,
            "sse": self.sse,
            "sse_units": self.info.get("sse_units", "data" if self.scaler.method == "none" else
                                       f"scaled ({self.scaler.method})"),
            "n": self.n,
        }
        for key, value in self.info.items():
            doc.setdefault(key, value)
        return doc

    def to_json(self) -> bytes:
        """The file's bytes: one key a line (an attribute, a centre a line), floats that read back to the same bits."""
        doc = self.to_dict()
        parts = []
        try:
            for key, value in doc.items():
                if key in _ONE_A_LINE and isinstance(value, list):
                    body = ",\n".join("  " + json.dumps(v, allow_nan=False) for v in value)
                    parts.append(f" {json.dumps(key)}: [\n{body}\n ]")
                else:
                    parts.append(f" {json.dumps(key)}: {json.dumps(value, allow_nan=False)}")
        except ValueError:
            raise RunError("the model holds a value that is not a finite number: not written") from None
        return ("{\n" + ",\n".join(parts) + "\n}\n").encode("utf-8")


# ======================================================================== writing

def looks_like_model(path: str) -> bool:
    """Whether ``path`` holds a JSON object (its first byte past blanks is ``{``), as a model does and a CSV
    file of centres never does: the file is then read as a model, and a damaged one says so."""
    try:
        with open(path, "rb") as f:
            return f.read(4096).lstrip()[:1] == b"{"
    except OSError:
        return False


def is_model(path: str) -> bool:
    """Whether ``path`` is a model file of any format version (no error for any other file)."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def save_model(path: str, model: Model, overwrite: bool = False) -> None:
    """Write ``model`` to ``path`` atomically (a temporary name, then renamed).

    Never over a file that is not a model; over an earlier model only with
    ``overwrite``.

    Raises
    ------
    UsageError
        ``path`` is a directory, another kind of file, or a model and not ``overwrite``.
    RunError
        It cannot be written.
    """
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a directory; a model is written to a file")
    if os.path.exists(path):
        if not is_model(path):
            raise UsageError(f"{path}: the file exists and is not an mpikmeans model: it is never written over "
                             "(choose another path)")
        if not overwrite:
            raise UsageError(f"{path}: a model is already there: replace it with overwrite (--overwrite), or "
                             "choose another path")
    data = model.to_json()
    write_atomic(path, data)


def write_model(comm, path: str, model: Model, overwrite: bool = False) -> None:
    """:func:`save_model` on rank 0, its failure raised on every rank (collective)."""
    error = None
    if comm.rank == 0:
        try:
            save_model(path, model, overwrite)
        except (UsageError, RunError) as exc:
            error = exc
    comm.agree(error)


# ======================================================================== reading

def load_model(path: str) -> Model:
    """Read and check a model file.

    Returns
    -------
    Model

    Raises
    ------
    UsageError
        ``path`` cannot be read, is not a model, or is a model of another format version.
    InputError
        A model with a key missing or malformed (the message names the key).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a model file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the model: {exc.strerror or exc}") from None
    not_one = UsageError(f"{path}: not an mpikmeans model (model.json, as a run writes it, is a JSON file "
                         f"with \"format\": \"{FORMAT}\")")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise not_one from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise not_one
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise UsageError(f"{path}: a model of format version {version!r} (written by mpikmeans "
                         f"{doc.get('tool_version', '?')}); this mpikmeans {_TOOL_VERSION} reads version "
                         f"{FORMAT_VERSION}: use the mpikmeans that wrote it, or fit the model again")
    missing = [key for key in REQUIRED if key not in doc]
    if missing:
        raise InputError(f"{path}: the model has no {', '.join(repr(k) for k in missing)} (a damaged or edited "
                         "file: fit the model again)")
    return _parse(doc, path)


def _bad(path: str, key: str, what: str) -> InputError:
    return InputError(f"{path}: the model's {key!r} {what}")


def _floats(value, shape: tuple, path: str, key: str) -> np.ndarray:
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise _bad(path, key, "holds something that is not a number") from None
    if arr.shape != shape:
        raise _bad(path, key, f"has shape {arr.shape}, expected {shape}")
    if not np.isfinite(arr).all():
        raise _bad(path, key, "holds a value that is not a finite number")
    return arr


def _parse(doc: dict, path: str) -> Model:
    attrs = doc["attributes"]
    if not isinstance(attrs, list) or not attrs:
        raise _bad(path, "attributes", "is not a list of attributes")
    seen = set()
    for i, a in enumerate(attrs):
        if not isinstance(a, dict) or not isinstance(a.get("name"), str) or a.get("role") not in ROLES:
            raise _bad(path, "attributes", f"entry {i + 1} is not an attribute (name, type, role: "
                       f"{', '.join(ROLES)})")
        if a["name"] in seen:
            raise _bad(path, "attributes", f"names {a['name']!r} twice")
        seen.add(a["name"])
        if a.get("type") == "nominal" and not (isinstance(a.get("categories"), list)
                                               and all(isinstance(c, str) for c in a["categories"])):
            raise _bad(path, "attributes", f"gives the nominal attribute {a['name']!r} no list of categories")
        if a["role"] == "clustered" and a.get("type") not in ("numeric", "nominal"):
            raise _bad(path, "attributes", f"clusters {a['name']!r} of type {a.get('type')!r}")
    if doc["nominal"] not in ("skip", "weka"):
        raise _bad(path, "nominal", f"is {doc['nominal']!r}, expected skip or weka")
    missing = doc["missing"]
    if not isinstance(missing, dict) or missing.get("policy") not in ("error", "drop", "mean"):
        raise _bad(path, "missing", "has no policy error, drop or mean")
    model = Model(attrs, doc["nominal"], {"policy": missing["policy"], "fill": missing.get("fill")},
                  Scaler("none", np.zeros(0), np.zeros(0), np.zeros(0, dtype=bool)), np.zeros((0, 0)))
    if not model.clustered:
        raise _bad(path, "attributes", "has no clustered attribute")
    if any(a["type"] == "nominal" for a in model.clustered) and model.nominal != "weka":
        raise _bad(path, "attributes", "clusters a nominal attribute, and 'nominal' is not weka")
    layout = model.layout
    columns = layout.columns
    scaling = doc["scaling"]
    if not isinstance(scaling, dict) or scaling.get("method") not in SCALING_METHODS:
        raise _bad(path, "scaling", f"has no method ({', '.join(SCALING_METHODS)})")
    offset = _floats(scaling.get("offset"), (columns,), path, "scaling.offset")
    scale = _floats(scaling.get("scale"), (columns,), path, "scaling.scale")
    if (scale == 0).any():
        raise _bad(path, "scaling.scale", "holds a 0")
    constant = np.zeros(columns, dtype=bool)
    try:
        constant[np.asarray(scaling.get("constant", []), dtype=np.int64)] = True
    except (TypeError, ValueError, IndexError):
        raise _bad(path, "scaling.constant", f"is not a list of column indices below {columns}") from None
    model.scaler = Scaler(scaling["method"], offset, scale, constant)
    k = doc["k"]
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise _bad(path, "k", f"is {k!r}, not a count of clusters")
    try:
        model.info = {key: v for key, v in doc.items() if key not in REQUIRED + ("centres_scaled", "one_hot_value")}
        model.info["tool_version"] = doc["tool_version"]
        data_centres = layout.encode([[v if isinstance(v, str) else repr(float(v)) for v in row]
                                      for row in _rows(doc["centres"], k, path)])
    except (TypeError, ValueError) as exc:
        raise _bad(path, "centres", f"does not give {k} centres of the attributes {', '.join(layout.names)}: "
                   f"{exc}") from None
    if "centres_scaled" in doc:
        model.centres_scaled = _floats(doc["centres_scaled"], (k, columns), path, "centres_scaled")
        back = model.centres
        if not np.allclose(back, data_centres, rtol=_CENTRES_RTOL, atol=0.0):
            raise _bad(path, "centres", "and 'centres_scaled' disagree (a model edited by hand: change both, or "
                       "remove centres_scaled)")
    else:  # a model written by hand: its centres in data units are the ones
        model.centres_scaled = model.scaler.transform(data_centres)
        for _, s, v in layout.blocks():
            model.centres_scaled[:, s:s + len(v)] = data_centres[:, s:s + len(v)]
    for key, kind in (("dtype", str), ("init", str)):
        if not isinstance(doc[key], kind):
            raise _bad(path, key, "is not a string")
    if doc["dtype"] not in DTYPES:
        raise _bad(path, "dtype", f"is {doc['dtype']!r}, expected {' or '.join(DTYPES)}")
    for key in ("seed", "n"):
        if not isinstance(doc[key], int) or isinstance(doc[key], bool) or doc[key] < 0:
            raise _bad(path, key, "is not a count >= 0")
    if not isinstance(doc["sse"], (int, float)) or isinstance(doc["sse"], bool) or not math.isfinite(doc["sse"]):
        raise _bad(path, "sse", "is not a finite number")
    fill = model.missing["fill"]
    if fill is not None:
        fill = _floats(fill, (columns,), path, "missing.fill")
        for a, s, v in layout.blocks():
            block = fill[s:s + len(v)]
            if np.count_nonzero(block) != 1 or not np.isclose(block.max(), ONE, rtol=_CENTRES_RTOL, atol=0.0):
                raise _bad(path, "missing.fill", f"gives the nominal attribute {layout.names[a]!r} no category "
                           f"(its {len(v)} columns: one {ONE!r}, the others 0)")
            block[block != 0] = ONE
        model.missing["fill"] = fill.tolist()
    model.dtype, model.init, model.seed, model.sse, model.n = doc["dtype"], doc["init"], doc["seed"], \
        float(doc["sse"]), doc["n"]
    return model


def _rows(value, k: int, path: str) -> list:
    if not isinstance(value, list) or len(value) != k or not all(isinstance(r, list) for r in value):
        raise ValueError(f"expected a list of {k} rows")
    for row in value:
        for v in row:
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise ValueError(f"{v!r} is neither a number nor a category")
    return value


# ======================================================================== data against a model

@dataclass
class HeaderMatch:
    """How a data file's attributes map onto a model's.

    Attributes
    ----------
    ignore : str or None
        The reader's ``ignore`` (1-based indices) that leaves out what the model
        does not cluster, and what the user asked to leave out.
    columns : ndarray, shape (data columns,), int64, or None
        The model's column of each of the data's columns (a nominal attribute
        whose categories come in another order, or fewer of them); None: the same.
    """

    ignore: str | None
    columns: np.ndarray | None = None


def match_header(model: Model, header, data_path: str, model_path: str, ignore: str | None = None) -> HeaderMatch:
    """Check a data file's attributes against a model's: name, type and order after the ignored ones.

    The model's ignored attributes are left out of the data too, and so are
    those named by ``ignore``; the data's other attributes of a type the model
    clusters (numeric; nominal with ``nominal == "weka"``) must then be the
    model's clustered attributes, in order, of the same types, a nominal one's
    categories among the model's (their order may differ).

    Parameters
    ----------
    model : Model
    header : mpikmeans.io.header.Header
        The data's (an ARFF or CSV file's).
    data_path, model_path : str
        For the messages.
    ignore : str, optional
        ``--ignore`` of the command: more of the data's attributes to leave out.

    Returns
    -------
    HeaderMatch

    Raises
    ------
    InputError
        The first mismatch: one line naming both files and the attribute.
    UsageError
        ``ignore`` names no attribute of the data.
    """
    where = f"{data_path}: attribute"
    theirs = f"the model {model_path}"
    names = header.names
    by_name = {a.name: a for a in header.attributes}
    dropped = [names.index(a["name"]) + 1 for a in model.attributes
               if a["role"] == "ignored" and a["name"] in by_name]
    spec = ",".join([str(i) for i in dropped] + ([ignore] if ignore else [])) or None
    sel = select_attributes(header, spec, model.nominal)
    user_ignored = set(sel.ignored) - {names[i - 1] for i in dropped}
    for a in model.clustered:
        mine = by_name.get(a["name"])
        if mine is None:
            raise InputError(f"{data_path}: no attribute {a['name']!r}, which {theirs} clusters")
        if a["name"] in user_ignored:
            raise InputError(f"{where} {a['name']!r} is left out with --ignore, and {theirs} clusters it")
        if mine.kind != a["type"]:
            raise InputError(f"{where} {a['name']!r} is {mine.kind}, {a['type']} in {theirs}")
    wanted = model.names
    for name in sel.names:
        if name not in wanted:
            entry = next((a for a in model.attributes if a["name"] == name), None)
            role = "not in" if entry is None else f"{entry['role']} ({entry['type']}) in"
            raise InputError(f"{where} {name!r} is {by_name[name].kind} and {role} {theirs}: leave it out with "
                             f"--ignore {name}")
    for position, (name, expected) in enumerate(zip(sel.names, wanted)):
        if name != expected:
            raise InputError(f"{where} {name!r} comes where {theirs} has {expected!r} (clustered attribute "
                             f"{position + 1}): the attributes must come in the model's order "
                             f"({', '.join(wanted[:8])}{', ...' if len(wanted) > 8 else ''})")
    layout = model.layout
    if not layout.has_nominal:
        return HeaderMatch(spec)
    data_layout = sel.layout
    columns = []
    for name, start, values in zip(layout.names, layout.starts, layout.values):
        if values is None:
            columns.append(start)
            continue
        for category in by_name[name].values:
            if category not in values:
                shown = ", ".join(values[:8]) + (", ..." if len(values) > 8 else "")
                raise InputError(f"{where} {name!r}: category {category!r} is not one of {theirs}'s ({shown})")
            columns.append(start + values.index(category))
    columns = np.array(columns, dtype=np.int64)
    same = data_layout is not None and data_layout.columns == layout.columns and \
        np.array_equal(columns, np.arange(layout.columns))
    return HeaderMatch(spec, None if same else columns)


def match_names(model: Model, names: list, data_path: str, model_path: str) -> None:
    """Check a ``.npy`` copy's column names (all numeric) against a model's clustered attributes.

    Raises
    ------
    InputError
        The first mismatch, naming both files and the attribute.
    """
    theirs = f"the model {model_path}"
    wanted = model.names
    for a in model.clustered:
        if a["type"] != "numeric":
            raise InputError(f"{data_path}: a .npy copy holds numeric columns only, and {theirs} clusters the "
                             f"nominal attribute {a['name']!r}: give the ARFF or CSV file")
        if a["name"] not in names:
            raise InputError(f"{data_path}: no column {a['name']!r}, which {theirs} clusters")
    for position, name in enumerate(names):
        if name not in wanted:
            raise InputError(f"{data_path}: column {name!r} is not in {theirs}: convert the file with --ignore "
                             f"{name}, or give the ARFF or CSV file")
        if name != wanted[position]:
            raise InputError(f"{data_path}: column {name!r} comes where {theirs} has {wanted[position]!r} "
                             f"(column {position + 1}): the columns must come in the model's order")


__all__ = ["FORMAT", "FORMAT_VERSION", "MODEL_FILE", "HeaderMatch", "Model", "is_model", "load_model",
           "match_header", "match_names", "save_model", "write_model"]
