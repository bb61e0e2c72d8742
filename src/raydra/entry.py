"""The command: `python train.py` and `raydra train` both call `hydra_main`, which composes the config
from raydra's groups (the top-level conf/, shipped in the package as raydra.conf: CONF_DIR) and any `--config-dir` of the user's, and
hands it to `main`: a Tune sweep when `tune` is set, else one run.

The only place that reads Hydra's runtime state and turns errors into exit codes: everything
below it (raydra.run.driver, raydra.sweep, raydra.run.fit) takes plain arguments and raises.
"""

import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Iterator, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from raydra.cluster import batch_system
from raydra.config.project import shadowed_configs
from raydra.errors import RaydraError
from raydra.multirun.job import JobFailed
from raydra.records.layout import MULTIRUN_CONFIG
from raydra.redact import masked_stderr, redact, redact_yaml
from raydra.run.prepare import JobSettings

log = logging.getLogger("raydra")


def _config_groups() -> Path:
    """The directory of raydra's config groups (the top-level conf/ of raydra's repository, which
    pyproject.toml ships as the package `raydra.conf`).

    raydra imported from a source tree (an editable install, or PYTHONPATH=src with no install):
    that tree's conf/, beside its src/. Installed from a wheel: the package raydra.conf, where the
    import system finds it (found, not imported: nothing in it runs)."""
    here = Path(__file__).resolve().parent
    if here.parent.name == "src" and (here.parent.parent / "conf" / "train.yaml").is_file():
        return here.parent.parent / "conf"
    spec = importlib.util.find_spec("raydra.conf")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return here / "conf"  # where a wheel puts it; missing, the command says so


# raydra's own config groups (model, data, strategy, scale, trainer, logger, callbacks, tune, hydra,
# experiment), the one answer to where they are: a user's `--config-dir` adds groups and options
# beside them (Hydra searches it after this primary config's directory, so a file of the same group
# and name as raydra's is never read: project.shadowed_configs says so).
CONF_DIR = _config_groups()


# Hydra reports what goes wrong before the run starts (composing the config, claiming the run's
# directory, writing its .hydra record) with a traceback: 95 lines for a YAML error in a
# --config-dir's file, 105 for a read-only paths.outputs. Told to raise instead (Hydra reads this
# variable as it reports), it hands them to hydra_main, which says in one sentence those a user can
# fix and hands the rest back to Hydra's own report. main() clears it as the run starts: the run's
# own errors are reported as before, and nothing the run starts inherits it.
HYDRA_RAISES = "HYDRA_FULL_ERROR"
_raising_for_raydra = False


def hydra_main() -> None:
    """Compose the config from sys.argv as Hydra does (overrides, -m, --help, --cfg job,
    --config-dir) and run it."""
    import hydra

    from raydra.config.schema import register_schemas

    global _raising_for_raydra
    register_schemas()
    # A user who set HYDRA_FULL_ERROR asked for Hydra's whole traceback, and gets it.
    _raising_for_raydra = HYDRA_RAISES not in os.environ
    if _raising_for_raydra:
        os.environ[HYDRA_RAISES] = "1"
    # Hydra prints its own errors to stderr: a composition error quoting the override it could not
    # apply, "Error executing job with overrides: [...]" for a job that raised. Masked there too, as
    # are raydra's own sentences for what Hydra met.
    try:
        with masked_stderr():
            try:
                hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")(main)()
            except Exception as error:
                if not _raising_for_raydra:
                    raise
                os.environ.pop(HYDRA_RAISES, None)
                sentence = before_the_run(error)
                if sentence is None:
                    from raydra.private_apis.hydra import report_as_hydra_does

                    report_as_hydra_does(error)  # exits
                print(f"error: {sentence}", file=sys.stderr)
                raise SystemExit(1) from None
    finally:
        if _raising_for_raydra:
            os.environ.pop(HYDRA_RAISES, None)
            _raising_for_raydra = False


def before_the_run(error: BaseException) -> Optional[str]:
    """An error Hydra met before the run started, as one sentence, when a user can fix it: a
    RaydraError (the run's directory, claimed as hydra.run.dir resolves), a config file that is not
    YAML, an override its grammar cannot read, a value or key the schema refuses, a run directory that cannot be written. None for
    anything else."""
    from raydra.config.checks import composition_error
    from raydra.errors import override_error, unwritable, yaml_error

    for cause in _chain(error):
        if isinstance(cause, RaydraError):
            return str(cause)
        said = yaml_error(cause) or override_error(cause) or composition_error(cause)
        if said:
            return said
        if isinstance(cause, OSError):
            # Hydra's own writes into a run directory given as hydra.run.dir (raydra claims the rest).
            where = cause.filename or "the run's directory"
            refused = unwritable(cause, where, "the run's record (.hydra/)", "point hydra.run.dir at a directory you can write")
            if refused:
                return str(refused)
    return None


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def main(cfg: DictConfig) -> Optional[float]:
    """Run what `cfg` describes; returns the monitored metric (the best run's or best trial's), the
    value Hydra's sweeper plugins optimise.

    A multirun job (Hydra's MULTIRUN mode) that fails raises, so that Hydra records the job failed
    and the multirun goes on with the others; a single run exits with a code instead."""
    if _raising_for_raydra:
        os.environ.pop(HYDRA_RAISES, None)  # the run's own errors: Hydra reports them as it always has
    hydra = HydraConfig.get()
    output_dir = Path(hydra.runtime.output_dir).resolve()
    overrides = list(hydra.overrides.task)
    multirun = hydra.mode == RunMode.MULTIRUN
    # raydra's launcher's settings for this job, if it is one of its jobs: its process is its own.
    job = JobSettings.take() if multirun else None
    if multirun and job is None:
        # Another launcher's job (hydra/launcher=basic): Hydra's sweeper wrote the multirun's config
        # with the command's secrets in it, which raydra's launcher masks before its jobs start.
        redact_yaml(Path(hydra.sweep.dir) / MULTIRUN_CONFIG)
    allocation = batch_system.named(cfg.ray.address) or (batch_system.current() if job and job.time_limit_notice else None)
    if allocation:
        # SLURM's time-limit notice (SIGUSR1) from here on: noted and acted on, where by default it
        # would end this process.
        batch_system.watch(allocation)
    hidden = shadowed_configs([s["path"] for s in hydra.runtime.config_sources if s["schema"] == "file"], CONF_DIR)
    if hidden:
        log.warning(hidden)
    try:
        if cfg.get("tune") is not None:
            from raydra.sweep import run_sweep

            # The primary config's directory, so best_config.yaml can find the groups it composes from.
            config_dir = next((s["path"] for s in hydra.runtime.config_sources if s["provider"] == "main" and s["schema"] == "file"), None)
            # A multirun job's sweep runs on the multirun's cluster (raydra.run.prepare.Invocation).
            return run_sweep(cfg, output_dir, overrides, config_dir, job_ray_address=job.ray_address if job else None).best.metric
        from raydra.run.driver import train_run

        # A single run, or one job of raydra's launcher, has the process to itself; the jobs of Hydra's
        # basic launcher take turns in one.
        alone = not multirun or job is not None
        # A multirun job's W&B name says what sets it apart from the others: its overrides, as Hydra joins them.
        label = redact(hydra.job.override_dirname) or hydra.job.id if multirun else None
        record = train_run(cfg, output_dir, overrides, process_ends_with_run=alone, job=job, multirun_label=label)
        if alone:
            import ray

            # Leave Ray now rather than at exit, where Ray first sleeps 0.5 s for worker output still
            # on its way, which the run stopped taking as it ended (console.WorkerOutput.end_run).
            ray.shutdown()
        return record.best_value()
    except RaydraError as error:
        # Already recorded and logged as one sentence where it happened; no traceback for it.
        if multirun:
            raise JobFailed(str(error)) from None
        import ray

        # A run refused once Ray was up (a `_target_`'s arguments are checked alongside Ray's start):
        # leave it now, as a run that ends does, not at exit after Ray's 0.5 s wait for worker output.
        ray.shutdown()
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        # Recorded as interrupted, with how to continue, already; 130 is the shell's code for Ctrl-C.
        if multirun:
            raise
        raise SystemExit(130) from None
