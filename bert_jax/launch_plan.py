"""What bert_jax.launch runs: the gcloud command lines for one Cloud TPU slice, as argv lists.

Pure functions, nothing runs here, so `--dry_run` and the tests see exactly the
commands a real launch would run. A slice is one TPU VM queued resource whose
single node has the same name:

  create    gcloud compute tpus queued-resources create NAME --node-id=NAME ...
  describe  gcloud compute tpus queued-resources describe NAME ... --format=value(state.state)
  upload    gcloud compute tpus tpu-vm scp --recurse STAGING/bert_jax_upload NAME: --worker=all
  install   gcloud compute tpus tpu-vm ssh NAME --worker=all --command='... pip install -e .[tpu]'
  run       gcloud compute tpus tpu-vm ssh NAME --worker=i
              --command='cd bert_jax && python3 -m bert_jax.main ...'   (one per worker, at once)
  delete    gcloud compute tpus queued-resources delete NAME ... --force --async --quiet
"""

import dataclasses
import re
import shlex

# Queued-resource states (TPU API QueuedResourceState.State).
ACTIVE = "ACTIVE"
PROVISIONING_STATES = ("CREATING", "ACCEPTED", "PROVISIONING", "WAITING_FOR_RESOURCES")
FAILED_STATES = ("FAILED",)
# Spot/preemptible capacity taken back: the slice must be deleted and created again.
PREEMPTED_STATES = ("SUSPENDING", "SUSPENDED", "PREEMPTED")

# Exit status of bert_jax.main when SIGTERM (a preemption) stopped it after saving.
PREEMPTED_EXIT_CODE = 143

# Name of the source tree on the workers (under the login user's home directory),
# and of the directory it is uploaded as before the install swaps it in.
REMOTE_DIR = "bert_jax"
UPLOAD_DIR = "bert_jax_upload"
# What the workers need to `pip install` the project: the packages and the
# packaging files (setup.cfg reads README.md for the long description).
SOURCE_ENTRIES = ("setup.cfg", "setup.py", "pyproject.toml", "README.md",
                  "bert_jax", "data_pipeline", "experiments")


@dataclasses.dataclass(frozen=True)
class Generation:
  """How one TPU generation names its slices and lays them out over VMs (workers)."""
  count_unit: int         # accelerator-type number per worker on multi-host slices
  single_host_max: int    # the largest number that still fits on one VM
  runtime_version: str    # default TPU VM software image


# The number in an accelerator type counts TensorCores for v2/v3/v4/v5p (a VM
# holds 4 chips x 2 cores = 8) and chips for v5e/v6e, whose multi-host slices
# use 4-chip VMs while v5litepod-8 / v6e-8 are one 8-chip VM.
# (cloud.google.com/tpu/docs: "TPU versions", v5e and v6e "Supported configurations".)
GENERATIONS = {
    "v2": Generation(count_unit=8, single_host_max=8, runtime_version="tpu-ubuntu2204-base"),
    "v3": Generation(count_unit=8, single_host_max=8, runtime_version="tpu-ubuntu2204-base"),
    "v4": Generation(count_unit=8, single_host_max=8, runtime_version="tpu-ubuntu2204-base"),
    "v5litepod": Generation(count_unit=4, single_host_max=8, runtime_version="v2-alpha-tpuv5-lite"),
    "v5p": Generation(count_unit=8, single_host_max=8, runtime_version="v2-alpha-tpuv5"),
    "v6e": Generation(count_unit=4, single_host_max=8, runtime_version="v2-alpha-tpuv6e"),
}
# Names people use for the same hardware; gcloud itself wants the key of GENERATIONS.
ALIASES = {"v5e": "v5litepod"}


def _generation(accelerator_type: str) -> tuple[Generation, int]:
  match = re.fullmatch(r"(v\w+?)-(\d+)", accelerator_type)
  name = ALIASES.get(match.group(1), match.group(1)) if match else None
  if name not in GENERATIONS:
    raise ValueError(
        f"unknown accelerator type {accelerator_type!r} (known generations: "
        f"{', '.join(GENERATIONS)}): pass --num_workers (and --runtime_version) explicitly")
  return GENERATIONS[name], int(match.group(2))


def num_workers(accelerator_type: str) -> int:
  """Number of TPU VMs (hosts, `--worker` indices) of a slice, e.g. v4-32 -> 4.

  Raises:
    ValueError: for a type the table does not know or a count it cannot split.
  """
  generation, count = _generation(accelerator_type)
  if count <= generation.single_host_max:
    return 1
  if count % generation.count_unit:
    raise ValueError(f"accelerator type {accelerator_type!r}: {count} is not a multiple of "
                     f"{generation.count_unit}; pass --num_workers explicitly")
  return count // generation.count_unit


def default_runtime_version(accelerator_type: str) -> str:
  """The TPU VM image this generation's JAX guides use."""
  return _generation(accelerator_type)[0].runtime_version


@dataclasses.dataclass(frozen=True)
class Slice:
  """One TPU VM slice provisioned as a queued resource (node id = name)."""
  name: str
  project: str
  zone: str
  accelerator_type: str
  runtime_version: str
  num_workers: int
  spot: bool = False

  @property
  def where(self) -> list[str]:
    return [f"--project={self.project}", f"--zone={self.zone}"]


_QR = ["gcloud", "compute", "tpus", "queued-resources"]
_VM = ["gcloud", "compute", "tpus", "tpu-vm"]
# A worker that vanishes (preempted VM, dropped network) makes ssh fail within
# about two minutes instead of hanging on a dead TCP connection for hours.
_KEEPALIVE = ["--ssh-flag=-oServerAliveInterval=30", "--ssh-flag=-oServerAliveCountMax=4"]


def create_command(s: Slice) -> list[str]:
  """Queues the slice's creation (returns once the request is accepted)."""
  return (_QR + ["create", s.name, f"--node-id={s.name}"] + s.where
          + [f"--accelerator-type={s.accelerator_type}", f"--runtime-version={s.runtime_version}"]
          + (["--spot"] if s.spot else []))


def describe_command(s: Slice) -> list[str]:
  """Prints the queued resource's state (ACTIVE, WAITING_FOR_RESOURCES, SUSPENDED, ...)."""
  return _QR + ["describe", s.name] + s.where + ["--format=value(state.state)"]


def delete_command(s: Slice) -> list[str]:
  """Deletes the queued resource and its node; --async returns before it is gone."""
  return _QR + ["delete", s.name] + s.where + ["--force", "--async", "--quiet"]


def upload_command(s: Slice, staging_dir: str) -> list[str]:
  """Copies the staged source tree (STAGING/bert_jax_upload) to every worker's home."""
  return (_VM + ["scp", "--recurse", f"{staging_dir.rstrip('/')}/{UPLOAD_DIR}", f"{s.name}:",
                 "--worker=all"] + s.where)


def install_script() -> str:
  """The shell line every worker runs to put the upload in place and install it."""
  # Swapping a fresh upload in keeps files deleted locally from lingering on a reused slice.
  return (f"rm -rf {REMOTE_DIR} && mv {UPLOAD_DIR} {REMOTE_DIR} && cd {REMOTE_DIR} && "
          "python3 -m pip install --quiet --upgrade pip && "
          "python3 -m pip install --quiet -e '.[tpu]'")


def install_command(s: Slice) -> list[str]:
  """Installs the uploaded project (with jax[tpu]) on all workers at once."""
  return _VM + ["ssh", s.name, "--worker=all"] + s.where + [f"--command={install_script()}"]


def main_args(config: str, workdir: str, extra: list[str]) -> list[str]:
  """bert_jax.main's argv on every worker; the same gs:// workdir makes a relaunch resume."""
  return ([f"--config={config}", f"--workdir={workdir}", "--config.distributed.enabled=True"]
          + list(extra))


def run_command(s: Slice, worker: int, args: list[str]) -> list[str]:
  """Runs bert_jax.main on one worker; ssh's exit status is the job's (143 = preempted)."""
  script = f"cd {REMOTE_DIR} && " + shlex.join(["python3", "-m", "bert_jax.main"] + args)
  return (_VM + ["ssh", s.name, f"--worker={worker}"] + s.where + _KEEPALIVE
          + [f"--command={script}"])


def run_plan(s: Slice, staging_dir: str, args: list[str], keep: bool) -> list[list[str]]:
  """The commands of `--action=run` on a slice that does not exist yet and comes up at once."""
  return ([describe_command(s), create_command(s), describe_command(s),
           upload_command(s, staging_dir), install_command(s)]
          + [run_command(s, w, args) for w in range(s.num_workers)]
          + ([] if keep else [delete_command(s)]))
