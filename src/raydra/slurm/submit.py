"""`raydra submit [overrides] [-m] [--config-dir DIR]`: a run (or a whole multirun) as one SLURM
batch job, sent with sbatch; the command returns once SLURM has the job.

    compose      the config as `raydra train` would (sweeps at their first value), checked as a
                 run is, against the allocation slurm.* asks for instead of one that exists
    directory    the run's (hydra.run.dir) or multirun's (hydra.sweep.dir) directory, claimed now,
                 so the job's output and its requeued attempts land where this command says
    script       <dir>/slurm.sh: #SBATCH lines from slurm.*, the time-limit notice and --requeue,
                 slurm.setup's lines, Ray's token for the job's cluster, then
                 `exec python -m raydra train ... ray.address=slurm hydra.run.dir=<dir>`
                 (exec: raydra's process is the batch shell, which SLURM's notice reaches)
    sbatch       the job id, the directory, the output file, and how to follow or cancel it

A requeued job runs the script again: the run continues in its directory (raydra.run.driver), the
multirun in its (raydra.multirun.admission).
"""

import os
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf, open_dict

from raydra.config.schema import ScaleConfig, SlurmConfig
from raydra.errors import RaydraError
from raydra.records.layout import SLURM_OUTPUT, SLURM_SCRIPT
from raydra.records.lock import claim_directory
from raydra.slurm.allocation import Allocation, asked_for, too_small

USAGE = "usage: raydra submit [-m] [--config-dir DIR] [override ...]   (docs/slurm.md)"


def main(argv: List[str]) -> int:
    try:
        multirun, config_dir, overrides = _parse(argv)
        cfg = _compose(overrides, config_dir, multirun)
        directory, script = write_script(cfg, overrides, config_dir, multirun, " ".join(["raydra", "submit", *argv]))
        job = _sbatch(script)
    except RaydraError as error:
        print(f"raydra submit: {error}", file=sys.stderr)
        return 1
    slurm = OmegaConf.to_object(cfg.slurm)
    cpus, gpus = asked_for(slurm, OmegaConf.to_object(cfg.scale))
    output = directory / SLURM_OUTPUT.replace("%j", job)
    what = "multirun" if multirun else "run"
    print(
        f"submitted SLURM job {job}: the {what} {cfg.name} on {slurm.nodes} node(s) x {cpus} CPUs"
        + (f", {gpus} GPUs" if gpus else "")
        + (f", time limit {slurm.time}" if slurm.time else "")
        + f"\n  dir      {directory}\n  script   {script}\n  output   {output}"
        + f"\n  follow   squeue -j {job}; tail -f {output}"
        + f"\n  cancel   scancel {job}   (the {what} is then interrupted; submitting the same command again with "
        + (f"hydra.sweep.dir={directory} hydra.launcher.resume=true continues it)" if multirun else f"resume={directory} continues it)")
    )
    return 0


def _parse(argv: List[str]) -> Tuple[bool, Optional[str], List[str]]:
    multirun, config_dir, overrides = False, None, []
    args = iter(argv)
    for arg in args:
        if arg in ("-m", "--multirun"):
            multirun = True
        elif arg in ("-cd", "--config-dir"):
            config_dir = next(args, None)
            if config_dir is None:
                raise RaydraError(f"{arg} needs a directory. {USAGE}")
        elif arg.startswith("--config-dir="):
            config_dir = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            raise RaydraError(f"{arg} is not an option of raydra submit (see what a run composes to with `raydra train {arg}`). {USAGE}")
        else:
            overrides.append(arg)
    return multirun, str(Path(config_dir).resolve()) if config_dir else None, overrides


def _compose(overrides: List[str], config_dir: Optional[str], multirun: bool) -> DictConfig:
    """The config as `raydra train` composes it, Hydra's keys included; a multirun's sweeps at their
    first value (each job is checked again by the launcher before any starts)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from raydra.config.schema import register_schemas
    from raydra.entry import CONF_DIR

    register_schemas()
    fixed = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if not override.is_sweep_override():
            fixed.append(override.input_line)
        elif not multirun:
            raise RaydraError(f"{override.input_line} sweeps over values; add -m to submit a multirun, or give one value.")
        elif override.is_discrete_sweep():
            first = next(iter(override.sweep_string_iterator()), None)
            if first is not None:
                fixed.append(f"{override.get_key_element()}={first}")
    if config_dir:
        fixed.append(f"hydra.searchpath=[file://{config_dir}]")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train"):
            return compose(config_name="train", overrides=fixed, return_hydra_config=True)
    except HydraException as error:
        raise RaydraError(str(error).splitlines()[0]) from None


def write_script(cfg: DictConfig, overrides: List[str], config_dir: Optional[str], multirun: bool, typed: str) -> Tuple[Path, Path]:
    """Check the run against what it asks SLURM for, claim its directory and write its batch script
    there; returns both."""
    address = cfg.ray.address
    if address not in (None, "slurm"):
        raise RaydraError(f"ray.address={address}: a submitted job runs on Ray across its own allocation (ray.address=slurm); drop it.")
    slurm: SlurmConfig = OmegaConf.to_object(cfg.slurm)
    scale: ScaleConfig = OmegaConf.to_object(cfg.scale)
    _check(cfg, overrides, slurm, scale)
    hydra = cfg.hydra
    # A run's directory is claimed as Hydra's run.dir resolves (raydra.unclaimed); a multirun's here.
    directory = Path(claim_directory(str(Path(hydra.sweep.dir).resolve()))) if multirun else Path(hydra.run.dir).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / SLURM_SCRIPT
    script.write_text(batch_script(cfg, slurm, scale, overrides, config_dir, multirun, directory, typed))
    return directory, script


def _check(cfg: DictConfig, overrides: List[str], slurm: SlurmConfig, scale: ScaleConfig) -> None:
    from raydra.config.user_callbacks import resolve_and_validate

    run = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    with open_dict(run):
        run.ray.address = None  # checked against the allocation asked for, below, not one this runs in
    # A multirun's first job (its sweeps at their first value); the launcher checks every job again.
    # raydra's own model and data classes too: a mistake found on a worker would come after the queue.
    resolve_and_validate(run, overrides, own_classes=True)
    cpus, gpus = asked_for(slurm, scale)
    asked = Allocation(
        job_id="", nodes=tuple(f"node{i}" for i in range(slurm.nodes)), cpus=(cpus,) * slurm.nodes, gpus_per_node=gpus, here=None
    )
    problems = list(too_small(asked, scale))
    if problems:
        raise RaydraError(" ".join(problems))


def batch_script(
    cfg: DictConfig,
    slurm: SlurmConfig,
    scale: ScaleConfig,
    overrides: List[str],
    config_dir: Optional[str],
    multirun: bool,
    directory: Path,
    typed: str,
) -> str:
    cpus, gpus = asked_for(slurm, scale)
    options = [
        f"--job-name={slurm.job_name or cfg.name}",
        f"--nodes={slurm.nodes}",
        # One task per node, holding its CPUs: the batch shell is raydra's driver on the first node,
        # and Ray's node on each other one runs as a job step (raydra.slurm.cluster).
        "--ntasks-per-node=1",
        f"--cpus-per-task={cpus}",
        *([f"--gpus-per-node={gpus}"] if gpus else []),
        *([f"--time={slurm.time}"] if slurm.time else []),
        *([f"--partition={slurm.partition}"] if slurm.partition else []),
        *([f"--account={slurm.account}"] if slurm.account else []),
        # B: the batch shell alone, which is raydra's process (exec below).
        *([f"--signal=B:USR1@{slurm.notice_before_s}"] if slurm.notice_before_s else []),
        "--requeue" if slurm.requeue and slurm.notice_before_s else "--no-requeue",
        # Every attempt of a requeued job in one file.
        "--open-mode=append",
        f"--output={directory / SLURM_OUTPUT}",
        *slurm.sbatch,
    ]
    python = slurm.python or sys.executable
    where = f"hydra.sweep.dir={directory}" if multirun else f"hydra.run.dir={directory}"
    command = [python, "-m", "raydra", "train", *(["-m"] if multirun else []), *(["--config-dir", config_dir] if config_dir else [])]
    command += [*overrides, "ray.address=slurm", where]
    lines = [
        "#!/bin/bash",
        f"# {typed}",
        f"# written by raydra submit at {datetime.now().astimezone().isoformat(timespec='seconds')}; docs/slurm.md",
        *(f"#SBATCH {option}" for option in options),
        "",
        *slurm.setup,
        "# Ray's token authentication for this job's cluster: a token of the job's own unless one is set.",
        'export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"',
        'if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_TOKEN_PATH:-}" ]; then',
        "  export RAY_AUTH_TOKEN=\"$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')\"",
        "fi",
        f"cd {shlex.quote(os.getcwd())}",
        "exec " + " ".join(shlex.quote(str(part)) for part in command),
        "",
    ]
    return "\n".join(lines)


def _sbatch(script: Path) -> str:
    try:
        done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise RaydraError(
            f"sbatch is not on PATH: run raydra submit where SLURM's commands are (a login node); the script is {script}."
        ) from None
    if done.returncode != 0:
        said = " ".join(done.stderr.split()) or f"exit code {done.returncode}"
        raise RaydraError(f"sbatch refused the job ({said}); the script is {script}.")
    return done.stdout.strip().split(";")[0]
