"""Typed schemas for the fixed config groups, and the checks Hydra's types cannot express.

The root config is a dataclass stored in Hydra's ConfigStore (`raydra_schema`), typed for the groups
whose shape raydra owns (scale, trainer, checkpoint, failure, ray, paths); each strategy option
extends its own schema (`strategy_<name>_schema`), each tune option `tune_schema`. A misspelt key or
a wrong type fails while Hydra composes, before Ray starts.
`model` and `data` stay open: they are `_target_` + constructor arguments of the user's classes.

These dataclasses are the one home of the fixed groups' defaults and of what each key means: a
YAML option under conf/ selects its schema and sets only what that option changes, and
`python train.py --cfg job` prints every key with the value it ends up with.
"""

import os
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from raydra.records.layout import name_in_directory
from raydra.records.lock import claim_directory


def _open_dict() -> Dict[str, Any]:
    """The default of an open dict field (ray.runtime_env, tune.space): empty, taking keys its YAML
    lacks (struct off). A DictConfig, which OmegaConf keeps with its flag, typed as the field is."""
    return typing.cast(Dict[str, Any], DictConfig({}, flags={"struct": False}))


@dataclass
class ScaleConfig:
    # Ray Train workers, one process each; data.batch_size (the global batch) is split over them.
    # 0 is local mode: the same training function in this process, without Ray (breakpoints work).
    # [min, max] is an elastic group: it starts once `min` workers fit, grows to `max` as nodes
    # come, and continues on fewer after losing a node (docs/reliability.md). Any: int or a list.
    num_workers: Any = 2
    # Elastic groups only: how often (seconds) Ray checks whether more workers would fit now; growing
    # restarts the workers from the last checkpoint.
    resize_check_s: float = 30.0
    use_gpu: bool = False
    # What Ray reserves for each worker; the worker also caps torch's threads at its CPUs.
    cpus_per_worker: float = 1.0
    # Read only with use_gpu=true.
    gpus_per_worker: float = 1.0
    # Any other Ray resource each worker must hold, e.g. {memory: 4e9} or a custom label.
    resources_per_worker: Dict[str, float] = field(default_factory=dict)
    # How Ray places the workers on nodes: PACK (fewest nodes, the default), SPREAD, STRICT_PACK, STRICT_SPREAD.
    placement_strategy: str = "PACK"

    # num_workers read once, for every reader of the resolved run (RunSpec.scale) or of a group
    # turned into this class (OmegaConf.to_object): not fields, so Hydra never sees them.
    @property
    def min_workers(self) -> int:
        return worker_range(self.num_workers)[0]

    @property
    def max_workers(self) -> int:
        return worker_range(self.num_workers)[1]

    @property
    def elastic(self) -> bool:
        """num_workers=[min, max]: Ray sizes the group between the two as nodes come and go."""
        return is_elastic(self.num_workers)


@dataclass
class ProcessGroupConfig:
    """What every strategy sets of torch.distributed's process group (through Ray's TorchConfig)."""

    # torch.distributed backend; null picks nccl on GPU and gloo on CPU.
    backend: Optional[str] = None
    timeout_s: int = 1800


@dataclass
class DDPConfig(ProcessGroupConfig):
    name: str = "ddp"
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    # MiB of gradients all-reduced together (DDP's bucket_cap_mb); null: DDP's 25. A compiled model
    # (trainer.compile=true) on two or more workers is split into one graph per bucket, so backward
    # overlaps the all-reduces: ~140 graphs for SD's UNet at 25. Larger buckets, fewer and larger
    # graphs, less overlap.
    bucket_cap_mb: Optional[int] = None


@dataclass
class FSDPConfig(ProcessGroupConfig):
    name: str = "fsdp"
    # full: parameters, gradients and optimizer state sharded, gathered per block (ZeRO-3).
    # grad_op: parameters stay gathered from forward to backward (ZeRO-2). hybrid: full within a
    # node, replicated across nodes.
    sharding: str = "full"
    # Recompute each block's activations in backward instead of storing them.
    activation_checkpointing: bool = False
    # Keep parameters and optimizer state in host memory between uses (GPU workers only).
    cpu_offload: bool = False
    # null: compute in the dtype trainer.precision gives. bf16/fp16: FSDP gathers and computes the
    # parameters in that dtype and reduces gradients in fp32.
    mixed_precision: Optional[str] = None
    # sharded: each worker writes its shard (fast, no gather). full: rank 0 gathers one file.
    checkpoint_layout: str = "sharded"


@dataclass
class DeepSpeedConfig(ProcessGroupConfig):
    name: str = "deepspeed"
    # ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters.
    stage: int = 2
    offload_optimizer: bool = False
    # Needs stage 3.
    offload_parameters: bool = False
    # Anything else DeepSpeed's config JSON takes, merged over what the keys above set.
    config: Dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainerConfig:
    """`trainer.*`: Lightning Trainer arguments, and raydra's own keys (RAYDRA_TRAINER_KEYS).

    Every field not named in RAYDRA_TRAINER_KEYS is a `pl.Trainer` keyword argument with Lightning's
    meaning, handed to it unchanged (lightning_trainer_arguments, in worker/loop.py): exposing another
    Trainer argument is one field here, and a test checks each field is one. The worker acts on
    raydra's keys itself. They stay flat under `trainer.` rather than in a nested section, so the
    command line reads `trainer.compile=true` beside `trainer.max_epochs=5`, as it always has.
    `precision` and `benchmark` are Lightning's except for their value `auto`, which raydra replaces
    (raydra.run.resolve: bf16-mixed or 32-true; cuDNN autotuning on GPU workers) before any worker builds
    its Trainer. The arguments the worker sets from
    other groups or owns (accelerator, devices, strategy, plugins, callbacks, logger, checkpointing,
    progress bar, model summary, default_root_dir, hyperparameter logging) are not fields: pl.Trainer would refuse the
    duplicate keyword with a TypeError.
    """

    max_epochs: int = 30
    max_steps: int = -1
    # auto: bf16-mixed on GPU workers, 32-true on CPU workers.
    precision: str = "auto"
    check_val_every_n_epoch: int = 1
    val_check_interval: float = 1.0
    gradient_clip_val: Optional[float] = None
    accumulate_grad_batches: int = 1
    log_every_n_steps: int = 10
    num_sanity_val_steps: int = 0
    # Lightning's smoke test of the code: true (1) or N batches of train, val and test, then stop;
    # no real training, and Lightning logs no metrics. Quickest with scale.num_workers=0.
    fast_dev_run: Any = False
    deterministic: bool = False
    # Lightning's own meaning, as lightning-hydra-template's trainer/ and debug/ configs use them.
    # At least this many epochs (steps) even if a callback asks to stop earlier (EarlyStopping).
    min_epochs: Optional[int] = None
    min_steps: Optional[int] = None
    # Stop after this long of training, "DD:HH:MM:SS" or {hours: 1}; the end still gets its checkpoint.
    max_time: Any = None
    # Batches per epoch of each split: an int counts batches, a float is a fraction (null: all).
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    # Train (and validate) on this many batches again and again: an int counts, a float is a fraction.
    overfit_batches: Any = 0.0
    # BatchNorm statistics over every worker's batch instead of each worker's own.
    sync_batchnorm: bool = False
    detect_anomaly: bool = False
    # cuDNN autotuning (torch.backends.cudnn.benchmark): each convolution's fastest kernel is timed
    # once per input shape. auto: on for GPU workers unless trainer.deterministic (raydra's data
    # arrive in batches of one shape); true/false/null as Lightning takes them.
    benchmark: Any = "auto"
    gradient_clip_algorithm: Optional[str] = None
    reload_dataloaders_every_n_epochs: int = 0
    # simple or advanced: Lightning's profiler report in each worker's log.
    profiler: Optional[str] = None
    # raydra's own keys from here on.
    # Run the test split after fit with the final weights.
    test: bool = True
    # torch.compile the model on every worker: its forward as one graph, and each network with trainable
    # weights for steps that call one directly (first steps pay for compilation; docs/performance.md).
    compile: bool = False
    # TensorFloat-32 matmuls on GPU for fp32 work: ~8x the fp32 peak on Ampere and newer.
    tf32: bool = True
    # lightning-hydra-template's trainer/ files set these, which raydra sets from other groups (the
    # accelerator from scale, the strategy from strategy=, the loggers from logger=, ...). Fields only
    # so that a copied file reaches validate(), which names raydra's key for each one, instead of
    # Hydra's "Key not in TrainerConfig"; any value but null is refused (TEMPLATE_TRAINER_KEYS).
    _target_: Optional[str] = None
    accelerator: Any = None
    devices: Any = None
    num_nodes: Any = None
    strategy: Any = None
    default_root_dir: Any = None
    callbacks: Any = None
    logger: Any = None
    plugins: Any = None
    enable_checkpointing: Any = None
    enable_progress_bar: Any = None
    enable_model_summary: Any = None


# The keys under trainer. that raydra reads itself; every other one is a pl.Trainer argument.
RAYDRA_TRAINER_KEYS = frozenset({"test", "compile", "tf32"})


# lightning-hydra-template's trainer keys that raydra sets itself, and what to use instead.
TEMPLATE_TRAINER_KEYS = {
    "_target_": "drop it: raydra builds Lightning's Trainer itself, on every worker",
    "accelerator": "set scale.use_gpu=true for GPU workers (false: CPU)",
    "devices": "set scale.num_workers (one device per worker; scale.gpus_per_worker is each one's share of a GPU)",
    "num_nodes": "set scale.num_workers, the workers over all nodes (Ray places them)",
    "strategy": "pick strategy=ddp, strategy=fsdp or strategy=deepspeed",
    "default_root_dir": "choose where runs go with paths.outputs (the run's own directory is ${paths.output_dir})",
    "callbacks": "name them under the root key callbacks (the callbacks group: callbacks=early_stopping)",
    "logger": "pick loggers with the logger group (logger=[csv,tensorboard])",
    "plugins": "drop it: raydra sets Ray's cluster environment as the Trainer's plugin",
    "enable_checkpointing": "drop it: raydra always checkpoints, as checkpoint.* says (a ModelCheckpoint in callbacks sets those)",
    "enable_progress_bar": "drop it: raydra prints its own progress lines",
    "enable_model_summary": "add callbacks=model_summary (or set verbose=true)",
}


def lightning_trainer_arguments(trainer: Mapping[str, Any]) -> Dict[str, Any]:
    """The trainer group's `pl.Trainer` keyword arguments: every key but raydra's own and the
    template's placeholders (refused by validate unless null)."""
    return {key: value for key, value in trainer.items() if key not in RAYDRA_TRAINER_KEYS and key not in TEMPLATE_TRAINER_KEYS}


@dataclass
class CheckpointConfig:
    # Ray keeps the best num_to_keep checkpoints by `monitor` (a logged metric, ordered by `mode`),
    # and the latest; null keeps them all.
    num_to_keep: Optional[int] = 2
    monitor: str = "val/acc"
    mode: str = "max"
    # How often a checkpoint is saved, which is what a failure can cost: every N epochs, or every N
    # optimizer steps for long epochs (a restart then continues inside the epoch). Set at most one;
    # neither means every epoch. The end of training always gets one.
    every_n_epochs: Optional[int] = None
    every_n_steps: Optional[int] = None
    # How a checkpoint reaches storage. background: Ray uploads it from a thread while training
    # goes on; wait: training waits for the upload. auto: background with paths.storage (object
    # storage is slow to write), wait without (a copy on the local disk).
    upload: str = "auto"


@dataclass
class LedgerConfig:
    # What a worker-hour costs, in any currency: recorded with the run's compute ledger, so that
    # `raydra compare --cost` shows its money (its --price-* flags win). A GPU run takes
    # price_per_gpu_hour, a CPU run price_per_cpu_hour, where set; else price_per_hour. null: none.
    price_per_hour: Optional[float] = None
    price_per_gpu_hour: Optional[float] = None
    price_per_cpu_hour: Optional[float] = None


@dataclass
class FailureConfig:
    # How many times Ray restarts the worker group after a worker or node dies; each restart
    # continues from the last reported checkpoint. -1: without limit.
    max_failures: int = 0
    # SIGTERM to a worker (a spot node's shutdown, a pod eviction) saves a checkpoint within ~0.2 s of
    # training before the worker stops (docs/reliability.md); the workers exchange a small
    # all-reduce about every 0.2 s of training to agree on it.
    # false: Ray's own handling (the worker exits at once).
    preemption_notice: bool = True
    # The hang watchdog (docs/reliability.md, "Hangs and stragglers"): a worker that stops making
    # progress for longer than its phase's deadline has every worker's stacks kept in
    # <run>/diagnostics/, the run recorded as hung, and then max_failures applies (a restart from
    # the last checkpoint, or the run ends). Without it a hang holds the run, and its GPUs, until
    # a collective times out (strategy.timeout_s, 30 min) with nothing said about which rank stopped.
    watchdog: bool = True
    # Start-up (from a worker's start to the end of its first training step: data set-up, the
    # first compile) may take this long.
    startup_timeout_s: float = 900.0
    # A training, validation or test batch may take this many times the run's own median batch of
    # that kind, and never less than step_timeout_min_s (which covers an epoch's turn: a loader's
    # workers starting, metrics gathered).
    step_timeout_factor: float = 20.0
    step_timeout_min_s: float = 90.0
    # A checkpoint save may take this long, or 5 times the run's longest save so far if longer.
    checkpoint_timeout_s: float = 600.0
    # A rank whose steps start later than the first rank's by more than this share of a step,
    # over a window of straggler_window steps, is named a straggler (the run goes on). 0: never.
    straggler_threshold: float = 0.2
    straggler_window: int = 50


@dataclass
class RayConfig:
    # null starts a local Ray inside this process; "auto" (the cluster of `ray start`) or
    # "ray://host:10001" joins a cluster; "slurm" starts Ray across the SLURM allocation this runs
    # in (sbatch, salloc; docs/slurm.md) and stops it when the command ends.
    address: Optional[str] = None
    # Only for a local start: cap the CPUs Ray may use (null = all of this machine's).
    num_cpus: Optional[int] = None
    # Your project's code for the workers (docs/own-project.md). auto: when joining a cluster
    # (ray.address set), ship the current directory as Ray's working_dir if a `_target_` of the run
    # is defined in it (never raydra's own code, which every node has installed); a local Ray's
    # workers import it from this directory as the driver does. A path: ship that directory, on any
    # Ray. null: ship nothing. Shipped, the workers run inside the copy, so a relative path in the
    # config means the same file on every node only if that file was shipped.
    working_dir: Optional[str] = "auto"
    # The rest of Ray's runtime_env for the run's processes, handed to ray.init as it is: env_vars,
    # py_modules, pip, excludes (added to raydra's: .git, .venv, caches, checkpoints, paths.outputs).
    runtime_env: Dict[str, Any] = field(default_factory=_open_dict)


@dataclass
class SlurmConfig:
    """`slurm.*`: what `raydra submit` asks SLURM for, and how a run inside an allocation
    (ray.address=slurm) starts its Ray cluster and meets the time limit (docs/slurm.md)."""

    # Nodes of the allocation: one Ray node on each; the first also runs the driver.
    nodes: int = 1
    # CPUs and GPUs asked for on each node. null: what the run's workers need there,
    # ceil(workers / nodes) x scale.cpus_per_worker (and x scale.gpus_per_worker with scale.use_gpu).
    cpus_per_node: Optional[int] = None
    gpus_per_node: Optional[int] = None
    # The job's time limit as sbatch takes it ("04:00:00", "2-00:00:00"); null: the partition's default.
    time: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    # The job's name in squeue; null: the run's name.
    job_name: Optional[str] = None
    # More sbatch options, one #SBATCH line each: ["--mem=0", "--constraint=a100", "--qos=high"].
    sbatch: List[str] = field(default_factory=list)
    # Shell lines the batch script runs before raydra: ["module load cuda/12.4", "source ~/env/bin/activate"].
    setup: List[str] = field(default_factory=list)
    # The Python the job runs raydra with; null: the one that ran `raydra submit` (a shared disk's path).
    python: Optional[str] = None
    # Seconds before the time limit that SLURM warns the job (SIGUSR1 to the batch shell): every
    # worker checkpoints at the step in flight, the run stops as interrupted and, with requeue, the
    # job goes back to the queue and continues the run. null: no warning; the limit ends the job.
    notice_before_s: Optional[int] = 120
    requeue: bool = True
    # ray.address=slurm: how long the allocation's other nodes get to join the Ray cluster.
    join_timeout_s: float = 180.0


@dataclass
class AshaConfig:
    # Epochs every trial trains before it can be stopped, and the fraction (1/reduction_factor)
    # kept at each rung. max_t null: trainer.max_epochs.
    grace_period: int = 1
    reduction_factor: float = 2.0
    max_t: Optional[int] = None
    brackets: int = 1


@dataclass
class PbtConfig:
    # Population Based Training (tune.scheduler=pbt): every perturbation_interval epochs a trial in
    # the bottom quantile_fraction continues from the checkpoint of one in the top quantile_fraction,
    # with that trial's values perturbed (x0.8 or x1.2, the next value of a choice), or with
    # probability resample_probability drawn again. The interval must be a multiple of
    # checkpoint.every_n_epochs: a trial can only be copied at an epoch it checkpointed.
    perturbation_interval: int = 1
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25
    # {dotted config key: {distribution: [arguments]}}, as tune.space: the keys PBT perturbs and
    # within what. Empty: every key of tune.space, within its own distribution.
    mutations: Dict[str, Any] = field(default_factory=_open_dict)
    # true: every trial waits at each interval until all have reached it, then the bottom quantile
    # copies the top one together (one copy per bottom trial, each time). false: each trial is
    # compared with the others' latest results as it reaches the interval, and waits for nothing.
    synch: bool = False


@dataclass
class TuneConfig:
    """A Ray Tune search over runs (src/raydra/sweep.py); null in the root config means no sweep."""

    # random: Tune's random/grid sampling. optuna: Optuna's TPE as Tune's search algorithm.
    search: str = "random"
    # asha: stop poor trials early. fifo: every trial runs to the end. pbt: Population Based
    # Training, poor trials continue from good ones' checkpoints with perturbed values (tune.pbt).
    scheduler: str = "asha"
    # {dotted config key: {distribution: [arguments]}}, e.g. {model.optimizer.lr: {loguniform: [1e-4, 1e-1]}}.
    # Open (struct off): Hydra would otherwise refuse a command-line distribution the YAML lacks.
    space: Dict[str, Any] = field(default_factory=_open_dict)
    num_samples: int = 4
    # null: checkpoint.monitor and checkpoint.mode.
    metric: Optional[str] = None
    mode: Optional[str] = None
    # Trials at once; null: as many as the cluster can place side by side.
    max_concurrent: Optional[int] = None
    # Seed of the search algorithm (the trials themselves use `seed`).
    seed: Optional[int] = 0
    asha: AshaConfig = field(default_factory=AshaConfig)
    pbt: PbtConfig = field(default_factory=PbtConfig)
    # A sweep directory to continue: finished trials are kept, unfinished ones run again.
    resume: Optional[str] = None


@dataclass
class PathsConfig:
    # Runs land in <outputs>/runs/<date>/<time>_<name>, multiruns and tune= sweeps in
    # <outputs>/sweeps/<date>/<time>_<name>/<job> (conf/hydra/default.yaml).
    outputs: str = "outputs"
    # Where checkpoints, Tune's state and every file a worker writes go, for clusters whose nodes
    # share no disk: s3://bucket/prefix, gs://bucket/prefix, an NFS path every node mounts. A run's
    # share is <storage>/<its directory relative to outputs>; the driver's run directory still ends
    # complete. A URI's query sets pyarrow options, e.g. s3://b/p?endpoint_override=host:9000&scheme=http
    # (quote it on the command line: 'paths.storage="s3://b/p?endpoint_override=host:9000&scheme=http"').
    # null: the run directory itself, which every worker must reach (one machine, or a shared disk).
    storage: Optional[str] = None
    # lightning-hydra-template's paths, for configs written against them (data_dir: ${paths.data_dir}).
    # The directory the command runs from (resolved on the driver: workers run elsewhere).
    root_dir: str = "${raydra.cwd:}"
    work_dir: str = "${paths.root_dir}"
    # Where data modules keep their files.
    data_dir: str = "${paths.root_dir}/data"
    # The run's own directory, filled in by raydra as the run starts (a Tune trial's, a resumed run's
    # first one): interpolate ${paths.output_dir} to write into the run's record; never set it. With
    # paths.storage, a worker's files under it reach storage and the run directory as metrics.csv does.
    output_dir: Optional[str] = None
    # The run's logs/ directory, beside its worker logs: the template's TensorBoard/MLflow files
    # land in the run's record (the template's log_dir holds every run: that is paths.outputs here).
    log_dir: str = "${paths.output_dir}/logs"


@dataclass
class RaydraConfig:
    """The root: typed where raydra owns the shape, open (Any) where the user's classes do."""

    name: str = "run"
    seed: int = 42
    # Words to find the run by, recorded in summary.json (and sent to W&B and MLflow).
    tags: List[str] = field(default_factory=list)
    # true: Ray's, Lightning's and W&B's own notices reach the console too (they always go to the log files).
    verbose: bool = False
    paths: PathsConfig = field(default_factory=PathsConfig)
    model: Any = MISSING
    data: Any = MISSING
    # Each strategy option extends its own schema (strategy_<name>_schema) from its YAML file.
    strategy: Any = MISSING
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # Lightning loggers on rank 0 by name: csv and wandb are raydra's own; any other is a `_target_`
    # (logger=tensorboard, logger=mlflow, or yours).
    logger: Any = field(default_factory=dict)
    # Lightning callbacks by name, each a `_target_` with its arguments, built on every worker after
    # raydra's own (the callbacks group: callbacks=early_stopping, callbacks=[early_stopping,lr_monitor]).
    # null or {}: none of yours. A ModelCheckpoint here sets checkpoint.* instead of running.
    callbacks: Any = field(default_factory=dict)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    # A SLURM job: what `raydra submit` asks for, and ray.address=slurm's time-limit handling.
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    failure: FailureConfig = field(default_factory=FailureConfig)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    # A run directory to continue in place (same run id, metrics.csv, W&B run, checkpoints), or
    # "latest": the newest run of this name under paths.outputs. A completed run is never retrained.
    resume: Optional[str] = None
    # A resumed run refuses a config that differs from the one it started with, unless this is true.
    resume_force: bool = False
    # resume= of a run this machine did not make (downloaded, copied): refused, naming the _target_s
    # it would import and run, unless this is true (raydra.records.trust; docs/compare.md).
    resume_trusted: bool = False
    # A new run (its own record) that starts from another run's trained weights: a checkpoint.ckpt
    # (any of raydra's layouts), a run directory (its best checkpoint) or a storage URI of either.
    # Optimizer, schedule and epochs start afresh; to continue a run where it stopped, use resume=.
    ckpt_path: Optional[str] = None
    # A Ray Tune sweep over this run (tune=asha, tune=random, tune=optuna); null: one run. Each
    # tune option extends tune_schema from its YAML file.
    tune: Any = None


# Each strategy option's schema by strategy.name (its YAML extends strategy_<name>_schema).
STRATEGY_SCHEMAS = {"ddp": DDPConfig, "fsdp": FSDPConfig, "deepspeed": DeepSpeedConfig}


def register_schemas() -> None:
    cs = ConfigStore.instance()
    cs.store(name="raydra_schema", node=RaydraConfig)
    # Stored at the top level, beside raydra_schema, not in a group: --help lists every config
    # group as one the user can pick, and these are only what the options' YAML files extend.
    for name, node in STRATEGY_SCHEMAS.items():
        cs.store(name=f"strategy_{name}_schema", node=node)
    cs.store(name="tune_schema", node=TuneConfig)
    # conf/hydra/default.yaml puts a tune= sweep under sweeps/, next to -m multiruns.
    OmegaConf.register_new_resolver("raydra.runs_or_sweeps", lambda tune: "runs" if tune is None else "sweeps", replace=True)
    # Cached so the run directory resolves once per invocation, as Hydra's own ${now:} does.
    OmegaConf.register_new_resolver("raydra.unclaimed", claim_directory, use_cache=True, replace=True)
    # The run's name as its directory ends, refused with a '/' before the directory is made.
    OmegaConf.register_new_resolver("raydra.name_in_directory", name_in_directory, replace=True)
    # paths.root_dir: the directory the command runs from, where the driver resolves the config.
    OmegaConf.register_new_resolver("raydra.cwd", os.getcwd, replace=True)


# dataloader: each worker reads and holds its data itself. ray_data: the driver builds Ray Data
# datasets, preprocessing runs as Ray Data tasks and workers stream their shards (data/ray_data.py).
LOADERS = ("dataloader", "ray_data")


# data.loader when the data's config names none or null (digits, synthetic, a user's module). The
# data options that offer ray_data name the key, so that the command line can set it.
DEFAULT_LOADER = "dataloader"


def data_loader(data: Mapping[str, Any]) -> str:
    """data.loader as the run uses it: the data config's, or DEFAULT_LOADER."""
    return data.get("loader") or DEFAULT_LOADER


PRECISIONS = {"auto", "64", "64-true", "32", "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "transformer-engine"}


GPU_ONLY_PRECISIONS = {"16-mixed", "16-true", "transformer-engine"}


def worker_range(num_workers: Any) -> Tuple[int, int]:
    """(min, max) workers of scale.num_workers: a plain count N is (N, N), [min, max] itself.
    A resolved run reads ScaleConfig.min_workers/max_workers; validate reads raw values here."""
    if isinstance(num_workers, int):
        return num_workers, num_workers
    low, high = num_workers
    return int(low), int(high)


def is_elastic(num_workers: Any) -> bool:
    """scale.num_workers=[min, max]: Ray sizes the group between the two as nodes come and go."""
    return not isinstance(num_workers, int)


def is_worker_count(num_workers: Any) -> bool:
    """scale.num_workers is a count or [min, max] of counts (what worker_range can read); validate
    says what is wrong with anything else."""
    return not isinstance(num_workers, bool) and (isinstance(num_workers, int) or _is_pair_of_ints(num_workers))


def _is_pair_of_ints(value: Any) -> bool:
    items = list(value) if OmegaConf.is_list(value) or isinstance(value, (list, tuple)) else None
    return items is not None and len(items) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in items)


SEARCHES = ("random", "optuna")


SCHEDULERS = ("asha", "fifo", "pbt")
