"""The run as one typed value: what the driver resolved, handed whole to the fit and to every worker.

    RunSpec   the composed config validated and resolved once (raydra.run.resolve): the schema's
              dataclasses for the groups raydra owns, plain dicts for the user's `_target_`
              constructor arguments (model, data, logger, callbacks), and the run's Place
    Place     where and as what the run trains: its directory, id, storage, what it starts from
    WorkerOutcome   what rank 0 learnt as the run went, returned to the driver (Result.return_value)

Nothing writes into a spec after it is made: a later stage that knows more (the restore point, the
data's row counts, a worker's scratch directory) makes a new one with dataclasses.replace. The
schema's dataclasses are the one home of defaults; the spec and the place are frozen here, not the
schema's classes, which Hydra composes into. A spec pickles, so Ray carries it to the workers, which
import nothing of Hydra's to read it.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from raydra.config.schema import (
    CheckpointConfig,
    FailureConfig,
    LedgerConfig,
    PathsConfig,
    RayConfig,
    ScaleConfig,
    TrainerConfig,
    TuneConfig,
    data_loader,
)
from raydra.records.hf_export import HFExport


@dataclass(frozen=True)
class Place:
    """Where and as what the run trains, fixed on the driver before any worker starts."""

    # The run directory as this process writes it (a worker with paths.storage: its scratch copy).
    dir: str
    # The run id: Ray Train's run name (resume= reuses it), the W&B and MLflow run's id.
    id: str
    # The run's share of paths.storage (run_record.location), or None: the run directory itself.
    storage: Optional[str]
    # The resolved config as loggers record it (W&B's config, MLflow's params): secrets masked,
    # "auto" values as the user left them.
    logged_config: Dict[str, Any]
    # ckpt_path=: the checkpoint whose weights the run starts from, found and made absolute.
    init_weights: Optional[str] = None
    # Local mode: the run's own last checkpoint to continue from (resume=); under Ray, Ray Train
    # hands the workers the run's checkpoint itself, and this is where a run that Ray Train has no
    # checkpoint of yet starts from (a PBT trial continuing another trial's checkpoint).
    restore: Optional[str] = None
    # data.loader=ray_data: each split's row count, from the datasets the driver built.
    data_rows: Optional[Dict[str, int]] = None

    def as_config(self) -> Dict[str, Any]:
        """The place as the run's resolved config recorded it (config_hash): what was known before
        the fit started."""
        run = {"dir": self.dir, "id": self.id, "logged_config": self.logged_config, "storage": self.storage}
        if self.init_weights:
            run["init_weights"] = self.init_weights
        return run


@dataclass(frozen=True)
class RunSpec:
    """The resolved run: the root config's keys (schema.RaydraConfig), typed, and its Place."""

    name: str
    seed: int
    tags: List[str]
    verbose: bool
    paths: PathsConfig
    # The user's classes' constructor arguments, each `_target_` included, as plain dicts.
    model: Dict[str, Any]
    data: Dict[str, Any]
    # schema.DDPConfig, FSDPConfig or DeepSpeedConfig, as strategy= chose.
    strategy: Any
    scale: ScaleConfig
    trainer: TrainerConfig
    logger: Dict[str, Any]
    callbacks: Dict[str, Any]
    checkpoint: CheckpointConfig
    ray: RayConfig
    failure: FailureConfig
    ledger: LedgerConfig
    resume: Optional[str]
    resume_force: bool
    ckpt_path: Optional[str]
    tune: Optional[TuneConfig]
    place: Place

    @property
    def loader(self) -> str:
        """data.loader, resolved: dataloader or ray_data."""
        return data_loader(self.data)

    @property
    def local(self) -> bool:
        """scale.num_workers=0: the training function runs in the driver's process, without Ray."""
        return self.scale.num_workers == 0

    def with_place(self, **changes: Any) -> "RunSpec":
        """A new spec whose place has `changes` (what a later stage learnt before the workers start)."""
        return dataclasses.replace(self, place=dataclasses.replace(self.place, **changes))

    def resolved_config(self) -> Dict[str, Any]:
        """The run's resolved config as plain data, its place under `run`: what config_hash hashes,
        the same dict the run recorded before the config became typed, so hashes stay comparable."""
        config = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "place"}
        config["run"] = self.place.as_config()
        return config


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


@dataclass
class WorkerOutcome:
    """What rank 0 returns to the driver when the fit ends: the figures summary.json records."""

    test_metrics: Dict[str, float] = field(default_factory=dict)
    # Why final metrics hold no test/* (trainer.test=false, no test split); None when tested.
    test_skipped: Optional[str] = None
    throughput: Dict[str, Any] = field(default_factory=dict)
    # Every worker's peak and model-state bytes, in rank order.
    memory_per_worker: List[Dict[str, int]] = field(default_factory=list)
    checkpoint_save_s: List[float] = field(default_factory=list)
    checkpoint_upload_s: List[float] = field(default_factory=list)
    global_step: Optional[int] = None
    epochs_completed: Optional[int] = None
    # Which callback stopped training before trainer.max_epochs, and why.
    stopped_early: Optional[Dict[str, Any]] = None
    # The last worker group's size, and an elastic group's resizes.
    world_size: Optional[int] = None
    resizes: List[Dict[str, Any]] = field(default_factory=list)
    # Local mode: the reports and checkpoints the training function kept itself (Ray Train keeps none).
    local_record: Optional[Dict[str, Any]] = None
    # raydra.run.startup's marks as the worker saw them.
    startup_marks: Dict[str, Any] = field(default_factory=dict)
    # What the run's Hugging Face export holds but its weights, as the module says (raydra.records.hf_export);
    # None for a module that exports nothing.
    hf_export: Optional[HFExport] = None
