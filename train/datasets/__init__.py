"""Document sources behind `train.data`: each split is a random-access sequence of documents.

- `file_corpus`: TFDS builders over a directory of files, `python_stdlib` (the running
  interpreter's own standard library, the bundled default corpus) and `text_dir` (a user's
  directory of text files). Prepared once as array_record, read with `as_data_source()`.
- `synthetic`: `copy`, `passkey` and `assoc_recall` tasks, computed on demand from a seed.
- `tfds_text`: any TFDS text dataset already prepared (array_record) in a data_dir.
- `common`: data directories, the split-by-hash rule, bytes-as-tokens conversion.

Every source returns documents as 1-D uint8 numpy arrays of bytes (vocabulary 256).
"""
