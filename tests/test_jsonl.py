"""bert_jax.run.jsonl.parse_rows, the one reading of metrics.jsonl and batch_log*.jsonl.

A kill mid-write leaves a torn last line (no newline after it): dropped by
every reader and by both writers' resume. A malformed complete line is damage:
every reader and both writers refuse it naming the file and line, rather than
skip it (a resume would rewrite the file without it). The tests fail if a
reader or writer parses on its own with another rule.
"""

import json

import pytest

from bert_jax import errors
from bert_jax.run import batch_log
from bert_jax.run import jsonl
from bert_jax.run import metrics_io


def _rows(steps, **extra):
  return "".join(json.dumps({"step": s, **extra}) + "\n" for s in steps)


def test_a_torn_last_line_is_dropped_and_a_malformed_one_before_it_is_an_error():
  """Fails if a torn last line is not dropped, a malformed line before it, a complete last line that
  is not an object, or a row is_row rejects is not refused by name and line, or an empty text gives
  rows."""
  text = _rows([1, 2])
  assert [r["step"] for r in jsonl.parse_rows(text + '{"step": 3, "lo', "m")] == [1, 2]
  with pytest.raises(jsonl.MalformedLine, match=r"^m:2: malformed line"):
    jsonl.parse_rows(_rows([1]) + "garbage\n" + _rows([3]), "m")
  # A complete last line (it ends in a newline) was not torn by a kill.
  with pytest.raises(jsonl.MalformedLine, match=r"^m:3: "):
    jsonl.parse_rows(text + "[1, 2]\n", "m")
  with pytest.raises(jsonl.MalformedLine, match=r"^m:1: "):
    jsonl.parse_rows(_rows([1]), "m", is_row=lambda r: r["step"] > 1)
  assert jsonl.parse_rows("", "m") == []


def test_a_damaged_log_is_a_one_line_refusal_that_says_what_to_do():
  """bert_jax.jobs prints a UsageError as one line (exit 1) and anything else as a
  traceback: this fails if a damaged log on resume became a bug's traceback again."""
  with pytest.raises(errors.UsageError) as caught:
    jsonl.parse_rows(_rows([1]) + "garbage\n" + _rows([3]), "w/metrics.jsonl")
  assert errors.one_line(str(caught.value)) == str(caught.value)
  assert "w/metrics.jsonl:2" in str(caught.value) and "delete that line" in str(caught.value)


def test_metrics_resume_drops_later_rows_and_the_torn_line(tmp_path):
  """Fails if resuming metrics.jsonl at step 2 keeps a later row or the torn line, or recorded() and
  read_metrics disagree with the rows kept."""
  path = tmp_path / metrics_io.METRICS_FILE
  path.write_text(_rows([1, 2, 3, 4], loss=1.0) + '{"step": 5, "lo')
  writer = metrics_io.MetricWriter(str(tmp_path), start_step=2)
  writer.close()
  assert path.read_text() == _rows([1, 2], loss=1.0)
  assert writer.recorded(2) == {"step": 2, "loss": 1.0} and writer.recorded(3) == {}
  assert [r["step"] for r in metrics_io.read_metrics(str(path))] == [1, 2]


def test_batch_log_resume_drops_later_rows_and_the_torn_line(tmp_path):
  """Fails if resuming the batch log at step 2 keeps a later row or the torn line, or read() sees
  other rows."""
  row = {"batch": "ab", "tokens": 3, "predictions": 1}
  path = tmp_path / batch_log.FILE_NAME
  path.write_text(_rows([1, 2, 3], **row) + '{"step": 4, "ba')
  batch_log.BatchLog(str(tmp_path), 2, process_index=0, process_count=1).close()
  assert path.read_text() == _rows([1, 2], **row)
  assert [r["step"] for r in batch_log.read(str(tmp_path))[batch_log.FILE_NAME]] == [1, 2]


def test_both_logs_refuse_a_damaged_middle_line_naming_file_and_line(tmp_path):
  """Fails if a damaged middle line in metrics.jsonl or the batch log is skipped by a writer's
  resume or a reader instead of refused naming the file and line 2."""
  (tmp_path / metrics_io.METRICS_FILE).write_text(_rows([1]) + "{oops\n" + _rows([2]))
  with pytest.raises(jsonl.MalformedLine, match=r"metrics\.jsonl:2: malformed"):
    metrics_io.MetricWriter(str(tmp_path), start_step=2)
  with pytest.raises(jsonl.MalformedLine, match=r"metrics\.jsonl:2: malformed"):
    metrics_io.read_metrics(str(tmp_path / metrics_io.METRICS_FILE))
  (tmp_path / batch_log.FILE_NAME).write_text(
      _rows([1], batch="ab", tokens=3, predictions=1) + '{"step": 2}\n')
  with pytest.raises(jsonl.MalformedLine, match=r"batch_log\.jsonl:2: malformed"):
    batch_log.BatchLog(str(tmp_path), 2, process_index=0, process_count=1)
  with pytest.raises(batch_log.BatchLogError, match=r"batch_log\.jsonl:2: malformed"):
    batch_log.read(str(tmp_path))


def test_resume_cuts_back_only_when_needed_and_only_where_allowed(tmp_path):
  """jsonl.resume, the one cut both writers make on resume: fails if it rewrote a log
  that needs no cut (a needless upload per start on gs://), if a process told not to
  write (MetricWriter's processes other than 0) wrote, or if the rows it returns (what
  MetricWriter.recorded answers from) differed from what it kept."""
  path = tmp_path / "log.jsonl"
  is_row = lambda r: isinstance(r.get("step"), int)
  assert jsonl.resume(str(path), 3, is_row) == [] and not path.exists()
  path.write_text(_rows([1, 2]))
  inode = path.stat().st_ino
  assert [r["step"] for r in jsonl.resume(str(path), 2, is_row)] == [1, 2]
  assert path.stat().st_ino == inode  # write_atomic renames a new file over it
  path.write_text(_rows([1, 2, 3]) + '{"st')
  kept = jsonl.resume(str(path), 1, is_row, rewrite=False)
  assert kept == [{"step": 1}] and path.read_text() == _rows([1, 2, 3]) + '{"st'
  assert jsonl.resume(str(path), 1, is_row) == [{"step": 1}]
  assert path.read_text() == _rows([1]) == jsonl.line({"step": 1})
