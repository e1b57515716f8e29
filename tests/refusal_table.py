"""bert_jax.main's refusal table: each bad input and the text its one line must hold.

tests/test_refusals.py runs every row (a row whose message the code no longer gives, or a
case without a row, fails); docs/workdir.md's "Refusals" table is written from it, so the
page shows exactly what the tests hold. After changing a row, regenerate the page:

  python tests/refusal_table.py

(tests/test_refusals.py fails while the page and this table differ.)
"""

import pathlib
import sys

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "workdir.md"
MARKER = "<!-- refusals table -->"

# (bad input, text the refusal line contains), in the order the page lists them.
ROWS = (
    ('a negative learning rate',
     'learning_rate=-1.0 must be >= 0'),
    ('a nonexistent `init_checkpoint`',
     'does not exist'),
    ('an init checkpoint without a complete step',
     'holds no complete checkpoint'),
    ('a corpus glob that matches nothing',
     '(config.data.corpus) matches no file'),
    ('a corpus that is a directory',
     "is a directory; give a glob of its files, e.g. --config.data.corpus='raw:"),
    ('a corpus of one-sentence documents (NSP)',
     'needs documents of at least 2 sentences'),
    ('a binary file in the corpus glob',
     'blob.bin: '),
    ('no held-out document',
     'is held out: give more documents or a smaller modulus'),
    ('an unknown `config.family`',
     "config.family='pretrian': expected one of"),
    ('a batch size below 1',
     'config.batch_size=-8 must be positive'),
    ('a batch size of 0',
     'config.batch_size=0 must be positive'),
    ('an eval batch size of 0',
     'config.eval_batch_size=0 must be positive'),
    ('a Parquet file named without its `parquet:` prefix',
     "a Parquet file read as text: name it --config.data.corpus='parquet:"),
    ('a phase list whose lengths go down',
     "config.phases[1].max_seq_length=16 is shorter than the previous phase's 32: lengths only grow"),
    ('a JSONL text with a lone surrogate escape',
     "surrogate.jsonl:41: field 'text' holds '\\ud800', a lone surrogate escape"),
    ('a non-finite loss',
     'non-finite loss (nan) or gradient norm (inf) at step 5'),
    ("a fine-tuning vocabulary in another order than the checkpoint's",
     'first difference at id 1000'),
    ('fine-tuning into a pretraining workdir',
     'is a pretraining workdir; a fine-tuning run needs its own --workdir'),
    ('an empty dev file',
     'empty.tsv: the dev split has no examples (empty file, header only, or every row skipped)'),
    ('a header-only dev file',
     'header_only.tsv: the dev split has no examples'),
    ('a label outside `--config.task.labels`',
     "other_label.tsv:5: label 'maybe' is not one of ['neg', 'pos']"),
    ('a byte that is not UTF-8 in a fine-tuning file',
     'latin1.tsv is not valid UTF-8 at line 5: byte 0xe9'),
    ('a fine-tuning file without the named column',
     "other_columns.tsv:2: row has no column 'sentence' (2 fields); a missing field or a wrong column name; the file's columns: 'text', 'label'"),
    ('a negative fine-tuning learning rate',
     'config.optimizer.learning_rate=-1.0 must be >= 0'),
    ('a fine-tuning run without seeds',
     'config.seeds is empty: give at least one seed'),
    ('two labels without `--config.task.positive_label` among them',
     "config.task.positive_label='1' is not one of the labels ['neg', 'pos']; binary F1 is reported for it: set --config.task.positive_label=pos"),
    ('a mistyped config field',
     'flag --config.data.masking.ratoi=0.2: the config has no field \'ratoi\'. Did you mean "ratio"'),
    ('an unknown config variant',
     "flag --config=experiments/configs/pretrain.py:tinny: unknown pretrain variant 'tinny'"),
    ('a config file that is not there',
     'cannot load the config file'),
    ('a tokenized store root that is not a writable directory',
     'key.json: Not a directory; make '),
    ('an empty (0-byte) Parquet file in the corpus glob',
     'empty.parquet is empty (0 bytes), not a Parquet file'),
    ('a Parquet file with a corrupt data page',
     '(Corrupt snappy compressed data.): the file is damaged; fetch or write it again'),
    ('a tokenized store whose manifest.json is cut',
     'manifest.json is damaged (Unterminated string starting at: line '),
)


def markdown() -> str:
  """The page's table, between its two markers."""
  lines = ["| bad input | the line contains |", "|---|---|"]
  lines += [f"| {name} | `{text}` |" for name, text in ROWS]
  return "\n".join(lines)


def page_with_table(page: str) -> str:
  """`page` with the text between its two markers replaced by markdown()."""
  before, _, rest = page.partition(MARKER)
  _, _, after = rest.partition(MARKER)
  return f"{before}{MARKER}\n{markdown()}\n{MARKER}{after}"


def main() -> int:
  page = DOC.read_text()
  if page.count(MARKER) != 2:
    print(f"error: {DOC} must hold the marker {MARKER!r} twice", file=sys.stderr)
    return 1
  DOC.write_text(page_with_table(page))
  print(f"wrote {len(ROWS)} rows to {DOC}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
