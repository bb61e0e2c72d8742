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

import dataclasses
import difflib
import importlib.util
import math
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from raydra.errors import RaydraError
from raydra.run_record import claim_directory, name_in_directory
from raydra.wandb_run import problems as wandb_problems


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
    (raydra.resolve: bf16-mixed or 32-true; cuDNN autotuning on GPU workers) before any worker builds
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
    runtime_env: Dict[str, Any] = field(default_factory=lambda: DictConfig({}, flags={"struct": False}))


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
class TuneConfig:
    """A Ray Tune search over runs (src/raydra/sweep.py); null in the root config means no sweep."""

    # random: Tune's random/grid sampling. optuna: Optuna's TPE as Tune's search algorithm.
    search: str = "random"
    # asha: stop poor trials early. fifo: every trial runs to the end.
    scheduler: str = "asha"
    # {dotted config key: {distribution: [arguments]}}, e.g. {model.optimizer.lr: {loguniform: [1e-4, 1e-1]}}.
    # Open (struct off): Hydra would otherwise refuse a command-line distribution the YAML lacks.
    space: Dict[str, Any] = field(default_factory=lambda: DictConfig({}, flags={"struct": False}))
    num_samples: int = 4
    # null: checkpoint.monitor and checkpoint.mode.
    metric: Optional[str] = None
    mode: Optional[str] = None
    # Trials at once; null: as many as the cluster can place side by side.
    max_concurrent: Optional[int] = None
    # Seed of the search algorithm (the trials themselves use `seed`).
    seed: Optional[int] = 0
    asha: AshaConfig = field(default_factory=AshaConfig)
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
    # A run directory to continue in place (same run id, metrics.csv, W&B run, checkpoints), or
    # "latest": the newest run of this name under paths.outputs. A completed run is never retrained.
    resume: Optional[str] = None
    # A resumed run refuses a config that differs from the one it started with, unless this is true.
    resume_force: bool = False
    # resume= of a run this machine did not make (downloaded, copied): refused, naming the _target_s
    # it would import and run, unless this is true (raydra.trust; docs/compare.md).
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


def _check_num_workers(cfg: Any) -> Iterator[str]:
    """scale.num_workers is a count, or [min, max] with 1 <= min <= max."""
    value = cfg.scale.num_workers
    shown = f"scale.num_workers={_shown(value)}"
    if not is_worker_count(value):
        yield (f"{shown} is neither a count of workers nor [min, max]; use e.g. scale.num_workers=4 or scale.num_workers=[2,4].")
        return
    if isinstance(value, int):
        if value < 0:
            yield (f"{shown} is negative; ask for 1 or more workers, or 0 for local mode.")
        return
    low, high = worker_range(value)
    if low < 1:
        yield (f"{shown} must start at 1 or more workers (local mode, 0, cannot grow); use e.g. [1,{max(high, 1)}].")
    if low > high:
        yield (f"{shown} has min {low} above max {high}; write it as [min, max], e.g. [{high},{low}].")
    if cfg.get("tune") is not None:
        yield (
            f"{shown} (elastic) cannot run inside a Tune sweep, whose trials reserve a fixed share of the cluster; "
            f"give a plain count, e.g. scale.num_workers={high}, or drop tune."
        )
    if cfg.failure.max_failures == 0:
        yield (
            f"{shown} continues after losing a node by restarting its workers, which failure.max_failures=0 forbids; "
            "set failure.max_failures to the losses to survive (e.g. 3, or -1 for no limit)."
        )


def is_worker_count(num_workers: Any) -> bool:
    """scale.num_workers is a count or [min, max] of counts (what worker_range can read); validate
    says what is wrong with anything else."""
    return not isinstance(num_workers, bool) and (isinstance(num_workers, int) or _is_pair_of_ints(num_workers))


def _is_pair_of_ints(value: Any) -> bool:
    items = list(value) if OmegaConf.is_list(value) or isinstance(value, (list, tuple)) else None
    return items is not None and len(items) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in items)


def _shown(value: Any) -> str:
    """A list as it is typed on the command line ([1,2]), anything else as it is."""
    if OmegaConf.is_list(value) or isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def validate(cfg: Any) -> None:
    """Checks that need more than one key or a value range. Raises one RaydraError that names every
    problem of the config, one sentence each (each naming its key), so that one attempt shows them all."""
    problems = list(problems_of(cfg))
    if problems:
        raise RaydraError(" ".join(problems))


def problems_of(cfg: Any) -> Iterator[str]:
    """Each problem validate() finds in `cfg`, as a sentence that names its key, in a fixed order.
    A number that is not finite is said once, as that: the range checks after it would call
    `nan` in range or not as their comparisons fall, and say it again."""
    unfinite = list(_non_finite(cfg))
    said = tuple(f"{key}=" for key, _ in unfinite for key in _and_parents(key))
    yield from _check_unknown_keys(cfg)
    for key, value in unfinite:
        default = _default_of(cfg, key)
        yield f"{key}={value} is not a finite number; give it one{f', e.g. {key}={default}' if default is not None else ''}."
    yield from (problem for problem in _range_problems(cfg) if not problem.startswith(said))


def _non_finite(cfg: Any) -> Iterator[Tuple[str, float]]:
    """(key, value) of every number that is not finite (nan, inf, -inf: Hydra's grammar reads
    them as floats) under the sections the schema types: `failure.step_timeout_min_s=nan` would
    turn the watchdog's deadlines into NaN, and `inf` reach summary.json as a number JSON has not.
    The user's groups (model, data, logger, callbacks) are their classes' arguments."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    yield from _numbers_not_finite({key: value for key, value in plain.items() if key not in OPEN_GROUPS})


def _numbers_not_finite(node: Any, where: str = "") -> Iterator[Tuple[str, float]]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        path = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key)
        if isinstance(value, float) and not math.isfinite(value):
            yield path, value
        else:
            yield from _numbers_not_finite(value, path)


def _default_of(cfg: Any, key: str) -> Optional[float]:
    """The schema's default number for `key`, if its section is a schema and the default is a number."""
    parent, _, leaf = key.rpartition(".")
    schema = OmegaConf.get_type(OmegaConf.select(cfg, parent) if parent else cfg)
    if not dataclasses.is_dataclass(schema):
        return None
    found = {f.name: f.default for f in dataclasses.fields(schema)}.get(leaf)
    return found if isinstance(found, (int, float)) and not isinstance(found, bool) else None


# The root keys that are a user's classes' arguments (raydra.arguments checks those), and Hydra's own node.
OPEN_GROUPS = ("model", "data", "logger", "callbacks", "hydra")


def _and_parents(key: str) -> List[str]:
    """`key` and the keys it is inside of below its section: trainer.max_time.hours, trainer.max_time;
    scale.num_workers[1], scale.num_workers."""
    parts = re.sub(r"\[\d+\]", "", key).split(".")
    return [key, *(".".join(parts[:n]) for n in range(2, len(parts) + 1))]


def _range_problems(cfg: Any) -> Iterator[str]:
    """problems_of's checks of values, ranges and keys together."""
    scale, trainer, ckpt = cfg.scale, cfg.trainer, cfg.checkpoint
    yield from _check_template_keys(cfg)
    yield from _check_num_workers(cfg)
    countable = is_worker_count(scale.num_workers)
    if scale.num_workers == 0:
        yield from _validate_local_mode(cfg)
    if countable and is_elastic(scale.num_workers):
        yield from _positive("scale.resize_check_s", scale.resize_check_s)
    yield from _positive("scale.cpus_per_worker", scale.cpus_per_worker)
    if scale.use_gpu:
        yield from _positive("scale.gpus_per_worker", scale.gpus_per_worker)
    for key, value in scale.resources_per_worker.items():
        if value < 0:
            yield f"scale.resources_per_worker.{key}={value} is negative; ask for 0 or more."
    if scale.placement_strategy not in {"PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"}:
        yield (
            f"scale.placement_strategy={scale.placement_strategy} is not a Ray placement strategy; "
            "use PACK, SPREAD, STRICT_PACK or STRICT_SPREAD."
        )
    if trainer.max_epochs < 1 and trainer.max_steps < 1:
        yield "trainer.max_epochs and trainer.max_steps are both below 1; set one of them to a positive count."
    yield from _positive("trainer.accumulate_grad_batches", trainer.accumulate_grad_batches)
    yield from _positive("trainer.check_val_every_n_epoch", trainer.check_val_every_n_epoch)
    yield from _positive("trainer.log_every_n_steps", trainer.log_every_n_steps)
    if not 0 < trainer.val_check_interval <= 1:
        yield f"trainer.val_check_interval={trainer.val_check_interval} must be a fraction of an epoch in (0, 1]."
    precision = str(trainer.precision)
    if precision not in PRECISIONS:
        yield f"trainer.precision={precision} is not a Lightning precision; use one of 32, bf16-mixed, 16-mixed, bf16-true."
    if precision in GPU_ONLY_PRECISIONS and not scale.use_gpu:
        yield (
            f"trainer.precision={precision} needs GPU workers; on CPU use trainer.precision=bf16-mixed or 32, or set scale.use_gpu=true."
        )
    if trainer.benchmark not in ("auto", True, False, None):
        yield f"trainer.benchmark={trainer.benchmark} must be auto, true, false or null."
    yield from _validate_strategy(cfg.strategy, scale, precision)
    if ckpt.num_to_keep is not None and ckpt.num_to_keep < 1:
        yield f"checkpoint.num_to_keep={ckpt.num_to_keep} must be at least 1, or null to keep all."
    if ckpt.upload not in {"auto", "background", "wait"}:
        yield f"checkpoint.upload={ckpt.upload} must be auto, background or wait."
    if ckpt.mode not in {"min", "max"}:
        yield f"checkpoint.mode={ckpt.mode} must be min or max."
    if ckpt.every_n_epochs is not None and ckpt.every_n_steps is not None:
        yield (
            f"checkpoint.every_n_epochs={ckpt.every_n_epochs} and checkpoint.every_n_steps={ckpt.every_n_steps} are both set; "
            "keep one and set the other to null."
        )
    for key in ("every_n_epochs", "every_n_steps"):
        if ckpt[key] is not None:
            yield from _positive(f"checkpoint.{key}", ckpt[key])
    yield from _check_lightning_unions(trainer)
    for key, node in (("ray.runtime_env", cfg.ray.runtime_env), ("strategy.config", cfg.strategy.get("config"))):
        if node is not None and not OmegaConf.is_dict(node):
            yield f"{key}={_shown(node)} is not a dict; give it one, e.g. {key}={{name: value}} (or leave it out)."
    if cfg.failure.max_failures < -1:
        yield f"failure.max_failures={cfg.failure.max_failures} must be -1 (no limit) or a count from 0."
    for key in ("startup_timeout_s", "step_timeout_factor", "step_timeout_min_s", "checkpoint_timeout_s", "straggler_window"):
        yield from _positive(f"failure.{key}", cfg.failure[key])
    if cfg.failure.straggler_threshold < 0:
        yield f"failure.straggler_threshold={cfg.failure.straggler_threshold} must be a share of a step from 0 (0: never name stragglers), e.g. 0.2."
    yield from _validate_slurm(cfg.slurm)
    yield from _validate_wandb(cfg)
    if cfg.get("tune") is not None:
        yield from _validate_tune(cfg.tune)
    loader = cfg.data.get("loader")
    if loader is not None:
        if loader not in LOADERS:
            yield f"data.loader={loader} is not a loader raydra knows; use one of {', '.join(LOADERS)}."
        if loader == "ray_data" and trainer.num_sanity_val_steps != 0:
            # A sanity pass reads part of a split validation shard; Ray's split coordinator then
            # waits for the rest of that epoch, and the first real validation never starts.
            yield (
                f"trainer.num_sanity_val_steps={trainer.num_sanity_val_steps} with data.loader=ray_data would stall on "
                "the split validation shard; set trainer.num_sanity_val_steps=0."
            )
    batch_size = cfg.data.get("batch_size")
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            yield f"data.batch_size={batch_size} must be a whole number of samples (the global batch), e.g. data.batch_size=32."
        elif batch_size <= 0:
            yield from _positive("data.batch_size", batch_size)
        elif countable:
            yield from _check_batch_splits(batch_size, scale.num_workers)


# A duration as Lightning's Timer (trainer.max_time) reads one: "DD:HH:MM:SS", or a dict of timedelta's arguments.
DURATION = re.compile(r"\d+:\d\d:\d\d:\d\d")
TIMEDELTA_KEYS = ("weeks", "days", "hours", "minutes", "seconds", "milliseconds", "microseconds")


def _check_lightning_unions(trainer: Any) -> Iterator[str]:
    """The trainer keys that Lightning takes in more than one type (typed Any here), read as
    Lightning reads them, so that a wrong one is named now rather than by every worker's Trainer."""
    runs = trainer.fast_dev_run
    if not (isinstance(runs, bool) or isinstance(runs, int) and runs >= 0):
        yield f"trainer.fast_dev_run={_shown(runs)} must be true, false or a number of batches from 0, e.g. trainer.fast_dev_run=5."
    limit = trainer.max_time
    if limit is not None and not (
        isinstance(limit, str)
        and DURATION.fullmatch(limit.strip())
        or OmegaConf.is_dict(limit)
        and all(k in TIMEDELTA_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in limit.items())
    ):
        yield (
            f"trainer.max_time={_shown(limit)} is not a duration; give DD:HH:MM:SS (e.g. trainer.max_time=00:12:00:00) "
            "or a dict of timedelta's arguments (e.g. 'trainer.max_time={hours: 12}')."
        )
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "overfit_batches"):
        value = trainer[key]
        if value is None and key != "overfit_batches":
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number and (0 <= value <= 1 or value > 1 and value % 1 == 0)):
            yield f"trainer.{key}={_shown(value)} must be a fraction in [0, 1] or a whole number of batches, e.g. trainer.{key}=0.25 or trainer.{key}=10."


def _check_unknown_keys(cfg: Any, where: str = "") -> Iterator[str]:
    """A key that no schema field names, under the root or a section the schema types (scale,
    trainer, checkpoint, ...): Hydra refuses `scale.num_workerz=2` itself, but `+scale.num_workerz=2`
    adds the key, which nothing would ever read. The open groups (model, data, logger, callbacks)
    are the user's classes' arguments, which project.check_classes checks against their signatures."""
    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return
    fields = [f.name for f in dataclasses.fields(schema)]
    for key in cfg.keys():
        path = f"{where}{key}"
        if not where and key == "hydra":
            continue  # Hydra's own node, in the config a launcher composes for each job
        if key not in fields:
            yield _unknown_key(path, fields, "a `+` adds it, but nothing reads it")
        elif OmegaConf.is_dict(cfg._get_node(key)):
            yield from _check_unknown_keys(cfg[key], f"{path}.")


def _unknown_key(path: str, fields: List[str], why: str) -> str:
    """`path` names no field of its section (whose fields are `fields`), as one sentence."""
    where, _, key = path.rpartition(".")
    close = difflib.get_close_matches(key, fields, n=1)
    hint = f"did you mean {where + '.' if where else ''}{close[0]}? " if close else ""
    return f"{path} is not a key raydra knows ({why}); {hint}python train.py --cfg job lists the keys{' of ' + where if where else ''}."


def composition_error(error: BaseException) -> Optional[str]:
    """What OmegaConf refused while Hydra composed the config (a command-line override or a config
    file), for a key of the schema's sections: a value of the wrong type, or a key the section does
    not have, said in one sentence naming the full key and what it takes. None for anything else."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ConfigTypeError, ValidationError

    from raydra.arguments import UNKNOWN, checkable, phrase, shown

    path = getattr(error, "full_key", None)
    owner = getattr(error, "object_type", None)
    if not path:
        return None
    if isinstance(error, (ConfigAttributeError, ConfigKeyError)) and dataclasses.is_dataclass(owner):
        return _unknown_key(
            path, [f.name for f in dataclasses.fields(owner)], f"{path.rpartition('.')[0] or 'the root'} has a fixed set of keys"
        )
    if isinstance(error, ConfigTypeError) and owner is dict:
        # Something else merged into a dict (a list for scale.resources_per_worker): the value is not kept.
        expected = checkable(getattr(error, "ref_type", None))
        said = phrase(expected if expected is not UNKNOWN else dict)
        reason = str(error).splitlines()[0].rstrip(".")
        return f"{path} takes {said} ({reason[:1].lower()}{reason[1:]}); give it one, e.g. {path}={{name: value}}."
    if not isinstance(error, ValidationError):
        return None
    expected, example = UNKNOWN, None
    if dataclasses.is_dataclass(owner):
        found = {f.name: f for f in dataclasses.fields(owner)}.get(str(error.key))
        if found is not None:
            expected = checkable(found.type)
            default = found.default_factory() if found.default_factory is not dataclasses.MISSING else found.default
            example = default if isinstance(default, (bool, int, float, str)) else None
    elif typing.get_args(getattr(error, "ref_type", None)):  # an item of a typed dict or list
        expected = checkable(typing.get_args(error.ref_type)[-1])
    value = shown(error.value)
    if expected is UNKNOWN:
        reason = str(error).splitlines()[0].rstrip(".")
        return f"{path}={value}: {reason}; python train.py --cfg job shows what {path} holds."
    said = phrase(expected)
    return f"{path}={value} is not {said}; give it {said}{f', e.g. {path}={shown(example)}' if example is not None else ''}."


def _check_template_keys(cfg: Any) -> Iterator[str]:
    """lightning-hydra-template's trainer keys whose job raydra does through its own keys: one
    sentence naming raydra's key for each. Read unresolved: `default_root_dir: ${paths.output_dir}`
    resolves to null until the run starts."""
    trainer = OmegaConf.to_container(cfg.trainer, resolve=False)
    found = [(key, trainer[key]) for key in TEMPLATE_TRAINER_KEYS if trainer.get(key) is not None]
    if found:
        named = ", ".join(f"trainer.{key}={_shown(value)}" for key, value in found)
        instead = "; ".join(f"for trainer.{key}, {TEMPLATE_TRAINER_KEYS[key]}" for key, _ in found)
        yield (f"{named}: raydra sets {'these' if len(found) > 1 else 'this'} itself; {instead} (docs/from-lightning-hydra-template.md).")
    if cfg.paths.output_dir is not None:
        yield (
            f"paths.output_dir={cfg.paths.output_dir} is the run's own directory, which raydra fills in; choose where runs go "
            "with paths.outputs (or hydra.run.dir) and leave paths.output_dir unset."
        )


def _check_batch_splits(batch_size: int, num_workers: Any) -> Iterator[str]:
    """The global batch must split evenly over every size the group can take, so an elastic run is
    refused here, before it starts, rather than at a resize."""
    low, high = worker_range(num_workers)
    sizes = range(max(1, low), max(1, high) + 1)
    uneven = [n for n in sizes if batch_size % n]
    if not uneven:
        return
    if not is_elastic(num_workers):
        yield (
            f"data.batch_size={batch_size} (the global batch) does not split evenly over "
            f"scale.num_workers={num_workers}; pick a multiple of {num_workers}."
        )
        return
    every = math.lcm(*sizes)
    yield (
        f"data.batch_size={batch_size} (the global batch) does not split evenly over {', '.join(map(str, uneven))} "
        f"worker(s), sizes scale.num_workers={_shown(num_workers)} may take; pick a multiple of {every}, or narrow the range."
    )


def _validate_local_mode(cfg: Any) -> Iterator[str]:
    """scale.num_workers=0 trains in the driver's process on one device, without Ray: what needs
    workers, a cluster or storage for them is refused by name."""
    why = "scale.num_workers=0 (local mode) trains in this process on one device"
    if cfg.strategy.name != "ddp":
        yield (f"{why}; strategy={cfg.strategy.name} shards over workers: keep strategy=ddp or set scale.num_workers to 1 or more.")
    if cfg.get("tune") is not None:
        yield (f"{why}; a Tune sweep runs its trials on Ray workers: set scale.num_workers to 1 or more, or drop tune.")
    if cfg.paths.storage:
        yield (f"{why} and writes its record into its run directory; drop paths.storage or set scale.num_workers to 1 or more.")
    if data_loader(cfg.data) == "ray_data":
        yield (f"{why}; data.loader=ray_data streams from Ray Data tasks: use data.loader=dataloader or scale.num_workers>=1.")


def _validate_strategy(strategy: Any, scale: Any, precision: str) -> Iterator[str]:
    if strategy.name == "ddp" and strategy.bucket_cap_mb is not None:
        yield from _positive("strategy.bucket_cap_mb", strategy.bucket_cap_mb)
    if strategy.name == "fsdp":
        if strategy.sharding not in {"full", "grad_op", "hybrid"}:
            yield (f"strategy.sharding={strategy.sharding} is not an FSDP sharding; use full, grad_op or hybrid.")
        if strategy.checkpoint_layout not in {"sharded", "full"}:
            yield (f"strategy.checkpoint_layout={strategy.checkpoint_layout} must be sharded or full.")
        if strategy.mixed_precision not in {None, "bf16", "fp16"}:
            yield (f"strategy.mixed_precision={strategy.mixed_precision} must be null, bf16 or fp16.")
        if strategy.cpu_offload and not scale.use_gpu:
            yield (
                "strategy.cpu_offload=true moves GPU memory to the host, but these workers are CPU workers; "
                "drop it, or set scale.use_gpu=true."
            )
        if precision in {"16-mixed", "16-true"}:
            # Lightning's fp16 loss scaler checks only this worker's gradient shard for overflow, so the
            # workers would disagree on which steps to skip.
            yield (
                f"trainer.precision={precision} is not supported with strategy=fsdp; use trainer.precision=bf16-mixed, "
                "or strategy.mixed_precision=fp16 with trainer.precision=32."
            )
    if strategy.name == "deepspeed":
        if strategy.stage not in {1, 2, 3}:
            yield (f"strategy.stage={strategy.stage} is not a ZeRO stage; use 1, 2 or 3.")
        if strategy.offload_parameters and strategy.stage != 3:
            yield ("strategy.offload_parameters=true needs strategy.stage=3 (only stage 3 shards parameters).")
        if not scale.use_gpu:
            yield (
                "strategy=deepspeed runs on CUDA GPUs only (Lightning's DeepSpeed integration refuses CPU devices); "
                "use strategy=fsdp for sharded training on CPU workers, or scale=gpu."
            )
        if importlib.util.find_spec("deepspeed") is None:
            yield ("strategy=deepspeed needs the deepspeed package; install it with `pip install raydra[deepspeed]`.")


def _validate_wandb(cfg: Any) -> Iterator[str]:
    """logger.wandb's keys, as W&B's logger takes them (raydra.wandb_run.problems), and a
    log_model=all that would log one worker's shard of a sharded checkpoint as the model."""
    logger = cfg.get("logger")
    wandb = logger.get("wandb") if OmegaConf.is_dict(logger) else None
    if not OmegaConf.is_dict(wandb):
        return
    yield from wandb_problems(OmegaConf.to_container(wandb, resolve=False))
    sharded = cfg.strategy.name == "deepspeed" or (cfg.strategy.name == "fsdp" and cfg.strategy.checkpoint_layout == "sharded")
    several = is_worker_count(cfg.scale.num_workers) and worker_range(cfg.scale.num_workers)[1] > 1
    if wandb.get("log_model") == "all" and sharded and several:
        yield (
            f"logger.wandb.log_model=all logs each checkpoint as rank 0 saves it, but strategy={cfg.strategy.name} saves one shard "
            "per worker; set strategy.checkpoint_layout=full (fsdp), or logger.wandb.log_model=true (the best and last, whole, at the end)."
        )


def _validate_slurm(slurm: Any) -> Iterator[str]:
    yield from _positive("slurm.nodes", slurm.nodes)
    if slurm.cpus_per_node is not None:
        yield from _positive("slurm.cpus_per_node", slurm.cpus_per_node)
    if slurm.gpus_per_node is not None and slurm.gpus_per_node < 0:
        yield f"slurm.gpus_per_node={slurm.gpus_per_node} is negative; ask for 0 or more, or null for what the workers need."
    if slurm.notice_before_s is not None:
        yield from _positive("slurm.notice_before_s", slurm.notice_before_s)
    yield from _positive("slurm.join_timeout_s", slurm.join_timeout_s)


SEARCHES = ("random", "optuna")
SCHEDULERS = ("asha", "fifo")


def _validate_tune(tune: Any) -> Iterator[str]:
    if tune.num_samples < 1:
        yield (f"tune.num_samples={tune.num_samples} must be at least 1.")
    if tune.search not in SEARCHES:
        yield (f"tune.search={tune.search} is not a search raydra knows; use one of {', '.join(SEARCHES)}.")
    if tune.scheduler == "pbt":
        # Measured on Ray 2.60: TuneReportCallback hands Tune metrics and a checkpoint *path*, never
        # a Tune checkpoint, so PBT's exploit step would restart a trial from scratch.
        yield (
            "tune.scheduler=pbt is not supported: under Ray Train V2 a trial reports no Tune checkpoint for PBT "
            "to clone; use tune.scheduler=asha or fifo."
        )
    elif tune.scheduler not in SCHEDULERS:
        yield (f"tune.scheduler={tune.scheduler} is not a scheduler raydra knows; use one of {', '.join(SCHEDULERS)}.")
    if tune.mode is not None and tune.mode not in {"min", "max"}:
        yield (f"tune.mode={tune.mode} must be min or max (or null for checkpoint.mode).")
    if tune.max_concurrent is not None:
        yield from _positive("tune.max_concurrent", tune.max_concurrent)
    yield from _positive("tune.asha.grace_period", tune.asha.grace_period)
    if tune.asha.reduction_factor <= 1:
        yield (f"tune.asha.reduction_factor={tune.asha.reduction_factor} must be above 1.")
    if tune.asha.max_t is not None and tune.asha.max_t < tune.asha.grace_period:
        yield (f"tune.asha.max_t={tune.asha.max_t} is below tune.asha.grace_period={tune.asha.grace_period}.")
    if not OmegaConf.is_dict(tune.space):
        yield f"tune.space={_shown(tune.space)} is not a dict; give it one, e.g. 'tune.space={{model.optimizer.lr: {{loguniform: [1e-4, 1e-1]}}}}'."
    elif not tune.space and not tune.resume:
        yield (
            "tune.space is empty, so there is nothing to search; add keys, e.g. "
            "'tune.space={model.optimizer.lr: {loguniform: [1e-4, 1e-1]}}'."
        )


def _positive(key: str, value: float) -> Iterator[str]:
    if value <= 0:
        yield (f"{key}={value} must be positive.")
