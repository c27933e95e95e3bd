"""Any TFDS text dataset (pg19, lm1b, wiki40b, ...) already prepared as array_record.

Nothing is downloaded here: the dataset must be in `data_dir` (prepare it once with
`tfds build NAME --data_dir=DIR --file_format=array_record`, or convert an existing tfrecord
copy with `tfds convert_format`). `data_dir=None` means TFDS's own default ($TFDS_DATA_DIR or
~/tensorflow_datasets). The text feature is picked by `text_key` ("text" by default).
"""

from __future__ import annotations

import os

import tensorflow_datasets as tfds

from train.datasets import common


def tfds_data_dir(data_dir) -> str:
    """`data_dir` as an absolute path; None means TFDS's default data directory."""
    if data_dir is None:
        return tfds.core.constants.get_default_data_dir()
    return os.path.abspath(os.path.expanduser(os.fspath(data_dir)))


def _why_missing(name: str, data_dir: str) -> str:
    if not os.path.isdir(data_dir):
        return f"data_dir={data_dir!r} does not exist"
    entries = sorted(e for e in os.listdir(data_dir) if not e.startswith("."))
    if not entries:
        return f"data_dir={data_dir!r} is empty"
    if name.split("/")[0].split(":")[0] not in entries:
        return (f"data_dir={data_dir!r} has no folder {name.split('/')[0]!r} "
                f"(it holds: {', '.join(entries[:20])})")
    return f"{os.path.join(data_dir, name)!r} is not a complete array_record dataset"


def tfds_documents(name: str, split: str, *, data_dir=None, text_key: str = "text",
                   builtin_names: tuple[str, ...] = ()) -> common.ByteDocuments:
    """Documents of `split` of the prepared TFDS dataset `name` -> uint8 [N_i] each.

    Raises ValueError naming the dataset, the data_dir looked in and why it failed (not a TFDS
    name, data_dir missing or empty, not prepared as array_record, unknown split or text_key).
    """
    where = tfds_data_dir(data_dir)
    how = (f"prepare it with `tfds build {name} --data_dir={where} "
           "--file_format=array_record` (or `tfds convert_format` for a tfrecord copy)")
    try:
        source = tfds.data_source(name, split=split, data_dir=where, download=False,
                                  try_gcs=False)
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(
            f"unknown dataset name {name!r}: the built-in names are {list(builtin_names)}; any "
            f"other name must be a TFDS dataset prepared (array_record) in data_dir, and "
            f"{name!r} is neither a registered TFDS dataset nor found in "
            f"data_dir={where!r}") from None
    except Exception as error:  # TFDS raises KeyError/NotImplementedError/... here
        builder_splits = _known_splits(name, where)
        if builder_splits and split.split("[")[0] not in builder_splits:
            raise ValueError(f"TFDS dataset {name!r} in {where!r} has splits "
                             f"{builder_splits}, got split={split!r}") from error
        raise ValueError(f"TFDS dataset {name!r} is not prepared in data_dir: "
                         f"{_why_missing(name, where)}; {how}. "
                         f"(TFDS said: {type(error).__name__}: {error})"[:2000]) from error
    features = getattr(getattr(source, "dataset_info", None), "features", None)
    if features is not None and text_key not in features:
        raise ValueError(f"text_key={text_key!r} is not a feature of TFDS dataset {name!r}; "
                         f"its features are {sorted(features.keys())}")
    if len(source) == 0:
        raise ValueError(f"split {split!r} of TFDS dataset {name!r} in {where!r} is empty")
    identity = {"name": name, "split": split, "data_dir": where, "text_key": text_key,
                "num_examples": len(source)}
    info = getattr(source, "dataset_info", None)
    if info is not None:
        identity.update(version=str(info.version), full_name=info.full_name)
    return common.ByteDocuments(source, text_key=text_key, identity=identity)


def _known_splits(name: str, data_dir: str) -> list[str]:
    """The splits of a prepared dataset, or [] when it is not prepared (best effort)."""
    try:
        builder = tfds.builder(name, data_dir=data_dir)
        return sorted(builder.info.splits.keys()) if builder.is_prepared() else []
    except Exception:  # noqa: BLE001 - only used to improve an error message
        return []
