"""Reader of classification splits from tensorflow-datasets data already prepared on disk.

Never downloads: the dataset must be prepared in `data_dir` (tfds' default
when None). glue.py says which dataset, split and text features a GLUE task
uses; this module only reads them into records.Example.
"""

from typing import Sequence

from bert_jax.finetune.readers import records


def read_split(tfds_name: str, data_dir: str | None, tfds_split: str, *,
               text_features: tuple[str, str | None], labels: Sequence[str] | None,
               regression: bool) -> list[records.Example]:
  """One split of a tfds classification dataset as Examples.

  tfds stores class ids whose names follow its own ClassLabel order (for MNLI
  entailment, neutral, contradiction); ids are mapped through those names to
  `labels`, and an id whose name is not among them (binary GLUE tasks name
  their classes "acceptable", "positive", ...) keeps its number as a string,
  i.e. GLUE's "0"/"1". Test-split labels (-1) become None, and every row keeps
  its tfds "idx" (when the dataset has one) as Example.index.

  Args:
    tfds_name: e.g. "glue/mnli".
    data_dir: where it is prepared; None: tfds' default.
    tfds_split: tfds' split name ("validation_matched", "test", ...).
    text_features: the (first, second or None) text feature names.
    labels: the task's class names (None for regression).
    regression: the label is a float.
  """
  # pylint: disable=g-import-not-at-top  # heavy; only this reader needs it
  from host import tf_cpu  # pylint: disable=unused-import  # first: keeps TF off accelerators
  import tensorflow_datasets as tfds
  try:
    builder = tfds.builder(tfds_name, data_dir=data_dir)
    ds = builder.as_dataset(split=tfds_split, shuffle_files=False)
  except Exception as e:   # tfds raises assorted types for "not prepared"
    raise ValueError(f"{tfds_name} split {tfds_split!r} is not prepared in data_dir "
                     f"{data_dir!r}: {e}") from e
  names = None if regression else builder.info.features["label"].names
  text_a, text_b = text_features
  where = f"tfds:{tfds_name}/{tfds_split}"
  examples = []
  for n, row in enumerate(tfds.as_numpy(ds)):
    label = row["label"]
    if regression:
      label = float(label)
    elif label < 0:
      label = None
    else:
      label = names[label] if names[label] in labels else str(int(label))
      if label not in labels:
        raise ValueError(f"{where}#{n}: label {label!r} is not one of {list(labels)}")
    index = str(int(row["idx"])) if "idx" in row else None
    examples.append(records.Example(f"{where}#{n}", row[text_a].decode("utf-8"),
                                    row[text_b].decode("utf-8") if text_b else None, label,
                                    index))
  return examples
