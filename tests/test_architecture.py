"""docs/architecture.md and the README's layout table, held to the code.

The module map in docs/architecture.md and the layout table in README.md are
where the next engineer learns which module holds what; both go stale silently
when a module is added or removed. These tests walk the packages on disk and
fail when a module is missing from either, when either names a module that does
not exist, when the architecture's TensorFlow rule is broken, when modules
import each other in a circle, when an import crosses the layers the wrong way
(host <- data_pipeline <- bert_jax), when docs/ links outside the repository, or when a
test function has no docstring.
"""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The packages whose every module the map must name (recursively, so a new
# sub-package such as a shared floor under bert_jax/ is covered as well).
PACKAGES = ("bert_jax", "data_pipeline", "experiments")
TENSORFLOW_IMPORT = re.compile(
    r"^\s*(import|from)\s+tensorflow(_text|_datasets)?(\s|\.|$)")


def _only_docstring(path: pathlib.Path) -> bool:
  """True for a file that holds nothing or a docstring alone (an empty package face)."""
  body = ast.parse(path.read_text()).body
  return not body or (len(body) == 1 and isinstance(body[0], ast.Expr)
                      and isinstance(body[0].value, ast.Constant))


def _modules() -> set[str]:
  """Every .py file of the packages, relative to the root; docstring-only __init__s left out."""
  found = set()
  for package in PACKAGES + tuple(
      p.name for p in ROOT.iterdir()
      if (p / "__init__.py").is_file() and p.name not in PACKAGES + ("tests",)):
    for path in (ROOT / package).rglob("*.py"):
      if path.name == "__init__.py" and _only_docstring(path):
        continue
      found.add(path.relative_to(ROOT).as_posix())
  return found


def _section(text: str, heading: str) -> str:
  """The text under a markdown heading, up to the next heading of the same or a higher level."""
  level = len(heading) - len(heading.lstrip("#"))
  start = text.index(heading + "\n")
  end = re.compile(r"^#{1,%d} " % level, re.M).search(text, start + len(heading) + 1)
  return text[start:end.start() if end else len(text)]


def _map_modules() -> set[str]:
  """The modules docs/architecture.md's module map names (first cell of each row)."""
  section = _section((ROOT / "docs/architecture.md").read_text(), "## The module map")
  return set(re.findall(r"^\| `([\w/]+\.py)` \|", section, re.M))


def _packages() -> set[str]:
  """Every package directory of the project (a folder with an __init__.py), as "a/b/"."""
  return {p.parent.relative_to(ROOT).as_posix() + "/"
          for package in PACKAGES + ("host",) for p in (ROOT / package).rglob("__init__.py")}


def _layout_rows() -> dict[str, str]:
  """README's layout table: {first cell's path: second cell}."""
  section = _section((ROOT / "README.md").read_text(), "## Layout")
  rows = {}
  for row in re.findall(r"^\|(.+)\|\s*$", section, re.M):
    cells = [c.strip() for c in row.split("|")]
    where = re.findall(r"`([^`]+)`", cells[0])
    if where:
      rows[where[0]] = cells[1]
  return rows


def test_every_module_is_in_the_architecture_map_and_nothing_else():
  """Fails when a module is added without a line in the map, or the map keeps a removed one."""
  modules, mapped = _modules(), _map_modules()
  assert len(mapped) > 50  # the map was found and parsed, not an empty section
  assert sorted(modules - mapped) == [], "missing from docs/architecture.md's module map"
  assert sorted(mapped - modules) == [], "in docs/architecture.md's module map, not on disk"


def test_readme_layout_table_is_a_row_per_package():
  """Fails when the README's layout table leaves out a package or names a path that is not
  one, or when a row runs past one line (the table says what each package owns; the module
  map is docs/architecture.md's and the package docstrings')."""
  rows = _layout_rows()
  packages = _packages()
  assert sorted(packages - set(rows)) == [], "packages missing from README.md's layout table"
  assert sorted(set(rows) - packages) == [], "in README.md's layout table, not a package"
  assert all(len(text) <= 160 for text in rows.values()), [k for k, v in rows.items()
                                                           if len(v) > 160]


def test_each_package_docstring_names_its_modules():
  """Fails when a package's __init__ docstring is missing or leaves out one of its modules or
  sub-packages (the docstring is where a reader of the code finds what the package owns)."""
  missing = []
  for package in sorted(_packages()):
    init = ROOT / package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    if not doc.strip():
      missing.append(f"{package}: no docstring")
      continue
    for child in sorted((ROOT / package).iterdir()):
      name = child.stem if child.suffix == ".py" else child.name
      if child.name in ("__init__.py", "__pycache__") or name.startswith("_"):
        continue
      if (child.suffix == ".py" or (child / "__init__.py").is_file()) and not re.search(
          rf"\b{re.escape(name)}\b", doc):
        missing.append(f"{package}{child.name}")
  assert missing == []


# The most modules a library folder may hold (issue 47: a flat folder of 25 modules hides
# the groups its docstring already drew), and the longest a library function may be, but
# for the trainers' sectioned orchestrators and configs (data, not logic).
MOST_MODULES = 12
LONGEST_FUNCTION = 100
LONG_FUNCTIONS_ALLOWED = {"bert_jax/pretrain/trainer.py:train_and_evaluate",
                          "bert_jax/finetune/trainer.py:finetune_run"}


def test_no_library_folder_holds_more_than_twelve_modules():
  """Fails when a package directory holds more than MOST_MODULES modules (__init__ aside)."""
  crowded = {package: n for package in _packages()
             if (n := len([p for p in (ROOT / package).glob("*.py")
                           if p.name != "__init__.py"])) > MOST_MODULES}
  assert crowded == {}


def test_no_library_function_is_over_a_hundred_lines():
  """Fails when a function of the project (tests aside) is longer than LONGEST_FUNCTION lines,
  but for the two trainers' orchestrators and the configs' get_config."""
  long = []
  for module in sorted(_modules()):
    for node in ast.walk(ast.parse((ROOT / module).read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        where = f"{module}:{node.name}"
        if lines > LONGEST_FUNCTION and where not in LONG_FUNCTIONS_ALLOWED and not (
            module.startswith("experiments/configs/") and node.name == "get_config"):
          long.append(f"{where} ({lines} lines)")
  assert long == []


def test_tensorflow_is_taken_through_tf_cpu_everywhere():
  """docs/architecture.md says every TensorFlow user goes through host/tf_cpu.py.

  Fails on a module that imports tensorflow, tensorflow_text or tensorflow_datasets
  (at the top or in a function) with no `tf_cpu` import on an earlier line.
  """
  offenders = []
  for module in sorted(_modules()):
    if module == "host/tf_cpu.py":
      continue
    lines = (ROOT / module).read_text().splitlines()
    for number, line in enumerate(lines):
      if TENSORFLOW_IMPORT.match(line) and not any(
          re.match(r"\s*from host(\.| import )tf_cpu", earlier) for earlier in lines[:number]):
        offenders.append(f"{module}:{number + 1}: {line.strip()}")
  assert offenders == []


def test_no_import_circles():
  """Fails when two of the project's modules import each other, directly or through others.

  Imports inside functions count: a lazy import still ties the modules together.
  """
  def name(path: str) -> str:
    parts = path[:-len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
  modules = {name(p): p for p in _modules()}
  graph = {}
  for module, path in modules.items():
    targets = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
      if isinstance(node, ast.Import):
        targets.update(a.name for a in node.names)
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        targets.add(node.module)
        targets.update(f"{node.module}.{a.name}" for a in node.names)
    graph[module] = {t for t in targets if t in modules and t != module}

  def reaches(start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
      current = todo.pop()
      if current == goal:
        return True
      if current not in seen:
        seen.add(current)
        todo.extend(graph[current])
    return False
  # An import a -> b closes a circle when b reaches a again.
  circles = sorted({" <-> ".join(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})
  assert circles == []


def test_every_test_has_a_docstring():
  """Fails when a test function under tests/ has no docstring: each says what would make it
  fail (docs/install.md), which a new test must too."""
  bare = [f"{path.name}::{node.name}"
          for path in sorted((ROOT / "tests").glob("test_*.py"))
          for node in ast.walk(ast.parse(path.read_text()))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.name.startswith("test_") and not (ast.get_docstring(node) or "").strip()]
  assert not bare, bare


def test_docs_link_nowhere_outside_the_repository():
  """Fails on a web link in docs/ or on a relative link that leaves the repository or dangles."""
  bad = []
  for doc in sorted((ROOT / "docs").glob("*.md")):
    text = doc.read_text()
    bad += [f"{doc.name}: {url}" for url in re.findall(r"https?://\S+", text)]
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
      resolved = (doc.parent / target).resolve()
      if ROOT not in resolved.parents or not resolved.exists():
        bad.append(f"{doc.name}: ({target})")
  assert bad == []


# The layers: `host` (the floor: paths, tf_cpu, fields) under both packages; data_pipeline
# under bert_jax, reached only through these modules.
FLOOR = "host"
DATA_PIPELINE_ENTRIES = {
    "data_pipeline.prepare",  # the pretraining trainer's data, as one object
    "data_pipeline.specs",  # what a data config asks for, judged without data
    "data_pipeline.vocab.tokenizers",  # the tokenizers fine-tuning and feature extraction share
}


def _imported(path: str) -> set[str]:
  """The project modules (or packages) a module imports, inside functions too."""
  names = set()
  for node in ast.walk(ast.parse((ROOT / path).read_text())):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for alias in node.names:
        sub = f"{node.module}.{alias.name}"
        names.add(sub if (ROOT / (sub.replace(".", "/") + ".py")).is_file() else node.module)
  return {n for n in names if n.split(".")[0] in PACKAGES + (FLOOR,)}


def test_layers_floor_then_data_pipeline_then_bert_jax():
  """docs/architecture.md's layering: the floor imports neither package, data_pipeline
  never imports bert_jax, and bert_jax reaches data_pipeline only through
  DATA_PIPELINE_ENTRIES. Fails on an import (at the top or in a function) that
  breaks one of the three."""
  wrong = []
  for module in sorted(_modules()):
    package = module.split("/")[0]
    for name in sorted(_imported(module)):
      top = name.split(".")[0]
      if package == FLOOR and top != FLOOR:
        wrong.append(f"{module} (the floor) imports {name}")
      elif package == "data_pipeline" and top == "bert_jax":
        wrong.append(f"{module} imports {name}")
      elif package == "bert_jax" and top == "data_pipeline" and name not in DATA_PIPELINE_ENTRIES:
        wrong.append(f"{module} imports {name}, not one of {sorted(DATA_PIPELINE_ENTRIES)}")
  assert (ROOT / FLOOR / "paths.py").is_file() and (ROOT / FLOOR / "tf_cpu.py").is_file()
  assert wrong == []


# The package rules (docs/architecture.md, "The package rules"; each package's docstring).
HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "tensorflow", "tensorflow_text",
         "tensorflow_datasets", "libtpu")


def _package_modules(package: str) -> list[str]:
  """The modules of one package (a directory such as "bert_jax/run"), __init__.py included."""
  return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob("*.py"))


def _names(path: str, module_level_only: bool) -> set[str]:
  """Every module a file imports (third-party too), as dotted names; `from a import b` is a.b
  when that is one of the project's modules, else a. `module_level_only`: the imports that
  run when the file is imported (not those inside a function)."""
  tree = ast.parse((ROOT / path).read_text())
  nodes, todo = [], list(tree.body)
  while todo:
    node = todo.pop()
    if module_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    nodes.append(node)
    todo.extend(ast.iter_child_nodes(node))
  names = set()
  for node in nodes:
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for alias in node.names:
        sub = f"{node.module}.{alias.name}"
        names.add(sub if _file_of(sub) else node.module)
  return names


def _file_of(module: str) -> str | None:
  """The project file a dotted module name is (a package: its __init__.py), or None."""
  base = ROOT / module.replace(".", "/")
  for candidate in (base.with_suffix(".py"), base / "__init__.py"):
    if candidate.is_file():
      return candidate.relative_to(ROOT).as_posix()
  return None


def _loaded_by(modules: set[str]) -> set[str]:
  """Every module that importing `modules` loads: each one's packages, and transitively the
  module-level imports of the project's modules among them."""
  loaded, todo = set(), list(modules)
  while todo:
    name = todo.pop()
    parts = name.split(".")
    for k in range(1, len(parts) + 1):  # a.b.c loads a, a.b and a.b.c
      prefix = ".".join(parts[:k])
      if prefix in loaded:
        continue
      loaded.add(prefix)
      if (path := _file_of(prefix)) is not None:
        todo.extend(_names(path, module_level_only=True))
  return loaded


def test_model_imports_nothing_of_the_project_outside_the_model():
  """Fails when a module of bert_jax/model/ imports (anywhere in it) a project module that is
  not in bert_jax/model/: the network must build with nothing else of the project loaded."""
  wrong = [f"{m} imports {n}" for m in _package_modules("bert_jax/model")
           for n in sorted(_imported(m)) if not n.startswith("bert_jax.model")]
  assert wrong == []


def test_data_pipeline_sources_and_vocab_sit_under_the_store_and_the_examples():
  """Fails when data_pipeline/sources/ or vocab/ imports (anywhere in it) the store or the
  examples, or data_pipeline/store/ imports the examples: text, then ids, then the kept
  tokenized corpus, then pairs and masks (data_pipeline's docstring)."""
  below = {"data_pipeline/sources": ("data_pipeline.store", "data_pipeline.examples",
                                     "data_pipeline.vocab"),
           "data_pipeline/vocab": ("data_pipeline.store", "data_pipeline.examples"),
           "data_pipeline/store": ("data_pipeline.examples",)}
  wrong = [f"{m} imports {n}" for package, banned in below.items()
           for m in _package_modules(package) for n in sorted(_imported(m))
           if n.startswith(banned)]
  assert wrong == []


def test_run_imports_neither_trainer():
  """Fails when a module of bert_jax/run/ imports (anywhere in it) bert_jax.pretrain or
  bert_jax.finetune: the run's record on disk is the same for both trainers."""
  wrong = [f"{m} imports {n}" for m in _package_modules("bert_jax/run")
           for n in sorted(_imported(m))
           if n.startswith(("bert_jax.pretrain", "bert_jax.finetune"))]
  assert wrong == []
  assert _only_docstring(ROOT / "bert_jax/run/__init__.py")  # the launcher imports run.job_state


def test_launch_never_imports_jax():
  """Fails when anything bert_jax/launch/ imports, inside its functions too, loads JAX, flax,
  optax, orbax, TensorFlow or libtpu when imported, at any depth of the project's modules,
  or when it imports any of bert_jax.preflight but its JAX-free pass cache (the preflight
  runs as a child process; the launcher reads a remembered pass before starting one)."""
  imported = set()
  for module in _package_modules("bert_jax/launch"):
    imported |= _names(module, module_level_only=False)
  loaded = _loaded_by(imported | {m[:-len(".py")].replace("/", ".")
                                  for m in _package_modules("bert_jax/launch")})
  assert "bert_jax.run.job_state" in loaded  # the walk found the lazy import of the record
  assert sorted(n for n in loaded if n.split(".")[0] in HEAVY) == []
  assert sorted(n for n in loaded if n.startswith("bert_jax.preflight")) == [
      "bert_jax.preflight", "bert_jax.preflight.cache"]


def test_launch_and_the_job_record_load_no_jax_in_a_fresh_process():
  """The same rule, run: a fresh interpreter imports every launch module and the job record
  (and so whatever third-party packages they pull in). Fails if JAX or another heavy
  package is then loaded."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  modules = [m[:-len(".py")].replace("/", ".").removesuffix(".__init__")
             for m in _package_modules("bert_jax/launch")] + ["bert_jax.run.job_state"]
  code = ("import importlib, sys\n"
          f"for m in {modules!r}: importlib.import_module(m)\n"
          f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)
  assert result.stdout.strip() == "[]", result.stdout
