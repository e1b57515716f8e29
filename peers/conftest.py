"""The peers' tests: what needs transformers 4, which transformers 5 cut down: its Flax BERT
(the speed peer) and its ports of the official SQuAD scripts (test_squad_oracles.py).

test_finetune_sides.py checks the machinery of the fine-tuning comparison against transformers
(experiments/benchmarks/finetune/): the same rows, the same start, the same dropout draws
on both sides. Run them in an environment with the `peers` extra, not the `dev` one
(docs/install.md): `pip install -e '.[peers]'`, the data packages of
tests/requirements-nodeps.txt, then `python -m pytest peers`. The fixtures are the main
suite's (tests/conftest.py), loaded here under a name of their own.
"""

import importlib.util
import pathlib

_SHARED = pathlib.Path(__file__).resolve().parents[1] / "tests" / "conftest.py"
_spec = importlib.util.spec_from_file_location("bert_jax_tests_conftest", _SHARED)
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
# The fixtures (and pytest hooks) of the main suite, by name, as pytest finds them here.
globals().update({k: v for k, v in vars(_shared).items() if not k.startswith("_")
                  and k != "pytest_collection_modifyitems"})
