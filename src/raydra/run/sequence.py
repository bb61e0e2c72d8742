"""The stages every run goes through, in one place: a single run or a multirun's job (raydra.run.driver)
and a Tune trial (raydra.sweep.trial) each walk them inside a Lifecycle of its own, so a check or a
record added to a stage holds for both, and a new kind of work adds what sets it apart, never a
third copy of the stages.

    RunSequence(cfg, ...)      the opening record, from the composed config (recording.new_summary):
                               what a refusal is written in
    .prepare(invocation)       the config final and checked (raydra.run.prepare)
    .start(prepared)           resolved into the spec (raydra.run.resolve), with where the record is
                               written; summary.json "running" (recording.record_start)
    .fit(spec)                 the fit, its outcome recorded (raydra.run.fit)
    .failed(error)             the record of a run an error ended, written where the run is

What only one of them does stays with it, between the stages. The driver: resume= and a requeued
job's take-over, the run's lock, the storage check, connecting to Ray with the `_target_`s' check
alongside, the cluster checks, the console report, and completing the run's W&B run (a trial's is
completed by its sweep's driver, raydra.sweep.report, however the trial ended). A trial: its scratch
place with storage, its sampled values and Tune's report callback, and leaving a trial Tune stopped
to the sweep's driver.
"""

import logging
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from omegaconf import DictConfig

from raydra.config.spec import Place, RunSpec
from raydra.records import summary, sync
from raydra.records.summary import RunRecord, Trial
from raydra.run import fit, recording, resolve
from raydra.run.prepare import Invocation, Prepared, prepare

log = logging.getLogger("raydra")


class RunSequence:
    """One run's way from its composed config to its record. `record` is the run's record as it
    stands and `place` where it is written; each stage replaces them with the next. A caller that
    continues an earlier run replaces `record` with the continued one (RunRecord.resumed_from)
    before the run starts, and one that has no run of its own yet sets `place` to None."""

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        run_id: str,
        overrides: Sequence[str],
        started: float,
        place: Optional[Place],
        trial: Optional[Trial] = None,
    ) -> None:
        """`cfg`: the composed config; `run_dir`: where the run's record is kept (a trial's on its
        sweep driver's disk); `started`: when the run began, for its wall time. `place`: where a
        refusal before the spec exists is recorded (no storage yet), or None: nowhere, only said (an
        invocation that continues another run leaves that run's record as it was until it has the
        run running again). `trial`: a sweep's trial, in its record (its sweep, id and samples)."""
        self._composed = cfg
        self.started = started
        self.record = recording.new_summary(cfg, run_dir, run_id, list(overrides))
        if trial is not None:
            self.record = self.record.with_start(trial=trial)
        self.place = place

    def prepare(self, invocation: Invocation) -> Prepared:
        """The composed config made final and checked for this invocation (raydra.run.prepare)."""
        return prepare(self._composed, invocation)

    def start(
        self,
        prepared: Prepared,
        *,
        wandb_group: Optional[str] = None,
        kind: str = "run",
        label: Optional[str] = None,
        at: Optional[Place] = None,
    ) -> RunSpec:
        """The run's spec, resolved from its prepared config into the directory and id its record
        names (a continued run's, once taken over), and its record saying it runs, written before any
        worker starts. `wandb_group`, `kind`, `label`: as resolve.resolve takes them. `at`: where the
        record is written when the caller decides it (a trial's scratch directory and storage), not
        the run directory and paths.storage."""
        spec = resolve.resolve(
            prepared.config,
            # Optional in a record, named in a run's from its opening record (recording.new_summary) on.
            Path(self.record.run_dir),  # pyright: ignore[reportArgumentType]
            self.record.run_id,  # pyright: ignore[reportArgumentType]
            wandb_group=wandb_group,
            kind=kind,
            label=label,
        )
        if at is not None:
            # Named by the caller, not recomputed from paths.outputs: a trial's working directory is Ray's.
            spec = spec.with_place(dir=at.dir, storage=at.storage)
        self.place = spec.place
        self.record = recording.record_start(spec, self.record)
        return spec

    def fit(
        self,
        spec: RunSpec,
        *,
        tune_trial: bool = False,
        callbacks: Sequence[Any] = (),
        marks: Optional[Dict[str, float]] = None,
        process_ends_with_run: bool = False,
    ) -> RunRecord:
        """The fit, and its outcome recorded: the completed record (fit.fit_and_record, whose keywords these are)."""
        try:
            self.record = fit.fit_and_record(
                spec,
                self.record,
                self.started,
                tune_trial=tune_trial,
                callbacks=callbacks,
                marks=marks,
                process_ends_with_run=process_ends_with_run,
            )
        except BaseException as error:
            # Failed or interrupted, what the run cost goes into the record its ending writes.
            spent = fit.ledger_of(error)
            if spent is not None:
                self.record = self.record.with_start(ledger=spent)
            raise
        return self.record

    def failed(self, error: Optional[BaseException], say: bool = False) -> RunRecord:
        """The record of the run `error` ended (failed with its sentence, or hung), written where the
        run is: at the place the run had reached. `say`: log its sentence first (a driver's console)."""
        self.record = recording.failure(self.record, error, self.started)
        record_ended(self.record, self.place, say=say)
        return self.record


def record_ended(ended: RunRecord, place: Optional[Place], say: bool = True) -> None:
    """Write the record of a run that ended without completing, after saying why when `say` (a
    trial's failure is said by its sweep's report, from this record). No `place`: a continuation
    refused or stopped before it took its run over, whose record stays as it was."""
    if say:
        log.error(f"error: {ended.error}")
    if place is not None and Path(place.dir).exists():
        summary.write(Path(place.dir), ended)
        try:
            sync.push_driver_files(place)
        except Exception as error:  # bad or unreachable storage: the local record stands all the same
            log.warning(f"could not copy the record to {place.storage}: {error}")
