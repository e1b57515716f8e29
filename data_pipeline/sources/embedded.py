"""The embedded corpus: the docstrings of the installed Python packages (and the Python
HTML documentation where present), harvested once into a BERT-format file in a cache
directory, so the default job has real English prose on any machine without a download.

The harvest walks files in sorted order, drops duplicates and stops at a byte budget, so
two machines with the same packages get the same bytes; it splits sentences with the
regex splitter whatever a run's `sentence_splitter` (the file is cached, and a harvest on
a new machine must give the bytes an old cache holds). corpora.py reads the file as any
BERT-format corpus ("embedded").
"""

import ast
import collections
import glob as globlib
import hashlib
import html.parser
import logging
import os
import pathlib
import sys
from typing import Iterator

from data_pipeline.sources import sentences

# Default cache location of the embedded corpus (overridable per call or by env).
_DEFAULT_CACHE = pathlib.Path("~/.cache/bert_jax/embedded_corpus")
_EMBEDDED_FILE = "corpus.txt"


def _site_dirs() -> list[pathlib.Path]:
  """site-packages / dist-packages directories on this interpreter's sys.path."""
  dirs = []
  for entry in sys.path:
    path = pathlib.Path(entry or ".")
    if path.name in ("site-packages", "dist-packages") and path.is_dir():
      resolved = path.resolve()
      if resolved not in dirs:
        dirs.append(resolved)
  return dirs


def _docstring_sentences(docstring: str) -> list[str]:
  """Prose sentences of a docstring: doctest lines and "::" literal blocks dropped."""
  prose, literal_indent = [], None
  for line in docstring.splitlines():
    stripped = line.strip()
    indent = len(line) - len(line.lstrip())
    if literal_indent is not None:
      if not stripped or indent > literal_indent:
        continue  # inside the indented code block of a "::" paragraph
      literal_indent = None
    if stripped.startswith((">>>", "...", "$ ", "%")) or stripped.endswith("::"):
      if stripped.endswith("::"):
        literal_indent = indent
      prose.append("")  # a paragraph break: never glue prose across code
      continue
    prose.append(stripped)
  return sentences.paragraph_sentences("\n".join(prose))  # the regex: see the module doc


# The fields of a node that hold statements, in the order of the nodes' _fields.
_STATEMENT_FIELDS = ("body", "handlers", "orelse", "finalbody", "cases")


def _statement_nodes(tree: ast.AST) -> Iterator[ast.AST]:
  """The nodes of ast.walk(tree) that hold statements, in ast.walk's order.

  A definition is never inside an expression, so the walk skips expressions (most
  of a module's nodes; walking them was half of the harvest's time). Breadth-first
  like ast.walk, children in field order: the corpus stays byte-identical.
  """
  todo = collections.deque([tree])
  while todo:
    node = todo.popleft()
    for field in _STATEMENT_FIELDS:
      children = getattr(node, field, None)
      if isinstance(children, list):
        todo.extend(children)
    yield node


def _python_file_documents(path: pathlib.Path) -> Iterator[list[str]]:
  """One document per module/class/function docstring of >= 2 sentences."""
  try:
    tree = ast.parse(path.read_bytes(), filename=str(path))
  except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
    return  # not every .py in site-packages is valid Python 3 for this interpreter
  for node in _statement_nodes(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)):
      docstring = ast.get_docstring(node, clean=True)
      if docstring:
        found = _docstring_sentences(docstring)
        if len(found) >= 2:
          yield found


class _ParagraphText(html.parser.HTMLParser):
  """Collects the text of <p> elements of an HTML page."""

  def __init__(self):
    super().__init__()
    self.paragraphs, self._depth = [], 0

  def handle_starttag(self, tag, attrs):
    if tag == "p":
      self._depth += 1
      self.paragraphs.append("")

  def handle_endtag(self, tag):
    if tag == "p" and self._depth:
      self._depth -= 1

  def handle_data(self, data):
    if self._depth:
      self.paragraphs[-1] += data


def _html_documents(path: pathlib.Path) -> Iterator[list[str]]:
  """One document per HTML page: the sentences of its paragraphs."""
  parser = _ParagraphText()
  parser.feed(path.read_text(encoding="utf-8", errors="replace"))
  found = [s for p in parser.paragraphs for s in sentences.split_sentences(p)]
  if len(found) >= 2:
    yield found


def _harvest_sources(site_dirs, html_dirs) -> Iterator[pathlib.Path]:
  """Files to harvest, in a deterministic (sorted) order."""
  for root in site_dirs:
    for directory, subdirs, files in os.walk(root):
      subdirs.sort()
      for name in sorted(files):
        if name.endswith(".py"):
          yield pathlib.Path(directory, name)
  for root in html_dirs:
    yield from sorted(pathlib.Path(root).rglob("*.html"))


def harvest_embedded_corpus(output: pathlib.Path, *, site_dirs=None, html_dirs=None,
                            max_bytes: int = 32 << 20) -> pathlib.Path:
  """Writes the embedded corpus to ``output`` in BERT format, atomically.

  Documents are docstrings (>= 2 sentences) of the ``.py`` files under
  ``site_dirs`` (default: this interpreter's site-packages) and the paragraphs
  of the HTML pages under ``html_dirs`` (default: /usr/share/doc/python3*/html),
  in sorted file order, duplicates dropped, until ``max_bytes`` of text (32 MiB:
  tens of MB is plenty for the default job, and the sorted walk makes the cut
  deterministic). The text goes to a temporary file in the same directory that
  is renamed onto ``output`` only once complete, so a harvest killed half-way
  never leaves a partial corpus behind.
  """
  site_dirs = _site_dirs() if site_dirs is None else site_dirs
  if html_dirs is None:
    html_dirs = sorted(globlib.glob("/usr/share/doc/python3*/html"))
  output = pathlib.Path(output)
  output.parent.mkdir(parents=True, exist_ok=True)
  # A minute or so of silence otherwise, on a new machine's first run.
  logging.info("harvesting the embedded corpus (the installed packages' docstrings, once; "
               "about a minute) into %s", output)
  temp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
  seen, written = set(), 0
  try:
    with open(temp, "w", encoding="utf-8") as f:
      for path in _harvest_sources(site_dirs, html_dirs):
        if written >= max_bytes:
          break
        documents = (_html_documents(path) if path.suffix == ".html"
                     else _python_file_documents(path))
        for document in documents:
          text = "\n".join(document) + "\n\n"
          key = hashlib.md5(text.encode("utf-8")).digest()
          if key in seen:  # inherited / vendored copies of the same docstring
            continue
          seen.add(key)
          f.write(text)
          written += len(text.encode("utf-8"))
      f.flush()
      os.fsync(f.fileno())
    if not written:
      raise ValueError(f"no docstring prose found under {site_dirs} / {html_dirs}")
    os.replace(temp, output)
  finally:
    if temp.exists():
      temp.unlink()
  logging.info("harvested the embedded corpus: %s (%d bytes)", output, written)
  return output


def embedded_corpus_path(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """Path of the embedded BERT-format corpus, harvesting it on first use.

  ``cache_dir`` defaults to $BERT_JAX_CACHE/embedded_corpus when that variable
  is set, else ~/.cache/bert_jax/embedded_corpus. Delete the directory to
  re-harvest after the installed packages change.
  """
  if cache_dir is None:
    env = os.environ.get("BERT_JAX_CACHE")
    cache_dir = pathlib.Path(env) / "embedded_corpus" if env else _DEFAULT_CACHE
  path = pathlib.Path(cache_dir).expanduser() / _EMBEDDED_FILE
  if not path.exists():
    harvest_embedded_corpus(path)
  return path
