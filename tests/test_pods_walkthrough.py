"""docs/pods.md's "BERT-Base on a v4-32, step by step": its launch command, as written, against
the fake gcloud (tests/fake_gcloud.py), with the real preflight."""

import json
import re
import shlex
import subprocess
import sys
import time

import pytest

from fake_gcloud import REPO, FakeGcloud

PODS = REPO / "docs" / "pods.md"
# The harness's own flags, added after the documented ones (which they never repeat):
# where the launcher logs, and fast polls instead of a real slice's minutes.
HARNESS = ["--poll_s=0.05", "--retry_s=0.01", "--preemption_window_s=0", "--stale_after_s=30",
           "--start_timeout_s=20", "--nofollow_logs"]


def documented_launch() -> list[str]:
  """Step 4's command of the walkthrough, split as a shell would split it."""
  text = PODS.read_text()
  section = text[text.index("### BERT-Base on a v4-32, step by step"):]
  step = re.search(r"^4\. Launch: `([^`]+)`", section, re.M | re.S)
  return shlex.split(step.group(1))


@pytest.mark.slow  # the real preflight compiles BERT-Base for a v4-32: ~2 minutes here
def test_the_walkthrough_launch_runs_as_written_and_fits(tmp_path, installed_artifact):
  """Fails if step 4's command, as docs/pods.md writes it, is refused by the launcher or its
  preflight (which compiles both phases for the v4-32 and must say each fits), if the job
  is not started with --config.slice=v4-32 on that slice, or if the same command again
  (a new job: its record removed) compiles instead of answering from the remembered pass
  before it creates the slice."""
  argv = documented_launch()
  assert argv[:3] == ["python", "-m", "bert_jax.launch"], argv
  flags = dict(a.split("=", 1) for a in argv[3:] if "=" in a)
  assert flags["--accelerator_type"] == "v4-32"
  assert flags["--config"] == "experiments/configs/pretrain.py:base"
  assert not any(h.split("=")[0] in flags for h in HARNESS)
  fake = FakeGcloud(tmp_path, installed_artifact)
  name = flags["--name"]
  env = dict(fake.env, FAKE_NAME=name, JAX_PLATFORMS="cpu")
  command = [sys.executable, *argv[1:], f"--logdir={fake.logdir}", *HARNESS]
  try:
    first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=900)
    assert first.returncode == 0, first.stderr[-3000:] + first.stdout[-3000:]
    out = first.stdout
    assert "preflight: compiling experiments/configs/pretrain.py:base for v4-32" in out
    assert re.search(r"phase 1 \(128 tokens.*per device: fits", out), out[-3000:]
    assert re.search(r"phase 2 \(512 tokens.*per device: fits", out), out[-3000:]
    assert "DOES NOT FIT" not in out and "fsdp=-1" not in out
    starts = [c for c in fake.commands() if "ssh" in c and any(
        "bert_jax.main" in a for a in c)]
    assert starts and all("--config.slice=v4-32" in c[-1] for c in starts), starts
    # Launched again (its job record gone, so a new job on a new slice): the remembered pass
    # answers, and the slice is asked for at once. Seconds to that call: `pytest -rP`.
    for record in (fake.root / "gcs").rglob("job_state.json"):
      record.unlink()
    calls = len(fake.commands())
    creates = fake.log.read_text().count('"create"')
    started = time.monotonic()
    again = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    # The raw log, not fake.commands(): a line the fake is still writing would not parse.
    while again.poll() is None and fake.log.read_text().count('"create"') == creates:
      time.sleep(0.05)
    print(f"re-launch to the slice's create call: {time.monotonic() - started:.1f} s")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert "passed for v4-32 before" in out and "compiling" not in out
    assert any("create" in c for c in fake.commands()[calls:])
  finally:
    (tmp_path / "release").write_text("")  # no fake job outlives its test
  records = list((fake.root / "gcs").rglob("job_state.json"))
  assert [json.loads(r.read_text())["state"] for r in records] == ["done"], records
