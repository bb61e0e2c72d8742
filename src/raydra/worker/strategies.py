"""The Lightning strategy a worker trains with, built from the `strategy` group.

- ddp: Ray's RayDDPStrategy; a lone worker's module is left unwrapped (see RayDDP).
- fsdp: PyTorch's FSDP2 (`fully_shard`) through Lightning's ModelParallelStrategy, made Ray-aware
  the way Ray's own strategies are (device and sampler ranks from Ray's context). Ray's
  RayFSDPStrategy wraps FSDP1, which PyTorch has deprecated, refuses CPU devices and segfaults
  saving a full state dict on CPU; FSDP2 runs on CPU and GPU alike.
- deepspeed: Ray's RayDeepSpeedStrategy (CUDA only; `pip install raydra[deepspeed]`).

Never Lightning's own `ddp`: it would start its own processes and rendezvous beside Ray's.

Sharded checkpoints: every worker writes its own shards into its own directory and reports it to
Ray, which merges the workers' directories in storage. Lightning broadcasts rank 0's path instead,
which on a multi-node cluster would leave the other nodes' shards where Ray never looks.
"""

from pathlib import Path
from typing import Any, Dict, List, Optional

import ray.train
import ray.train.torch
import torch
from ray.train.lightning import RayDDPStrategy, RayDeepSpeedStrategy, RayLightningEnvironment

from raydra.errors import RaydraError
from raydra.lightning import pl
from raydra.private_apis.lightning import (
    distributed_checkpoint_metadata_file,
    materialize_distributed_module,
    optimizers_to_device,
    save_distributed_checkpoint,
)
from raydra.private_apis.torch import apply_activation_checkpointing

ModelParallelStrategy = pl.strategies.ModelParallelStrategy
TrainerFn = pl.trainer.states.TrainerFn


def build_strategy(settings: Any, shard_blocks: Optional[List[str]] = None) -> Any:
    """`settings`: the run's strategy (schema.DDPConfig, FSDPConfig or DeepSpeedConfig). `shard_blocks`:
    the class names of the model's repeated blocks (its config's `shard_blocks`)."""
    name = settings.name
    if name == "ddp":
        return RayDDP(
            find_unused_parameters=settings.find_unused_parameters,
            gradient_as_bucket_view=settings.gradient_as_bucket_view,
            static_graph=settings.static_graph,
            bucket_cap_mb=settings.bucket_cap_mb,
        )
    if name == "fsdp":
        return RayFSDP2Strategy(settings, shard_blocks or [])
    if name == "deepspeed":
        return ShardedRayDeepSpeedStrategy(
            stage=settings.stage,
            offload_optimizer=settings.offload_optimizer,
            offload_parameters=settings.offload_parameters,
            config=_deepspeed_config(settings),
        )
    raise ValueError(f"strategy.name={name} has no builder")


def check_ray_environment(trainer: Any) -> Any:
    """Ray's `prepare_trainer` for every strategy: it accepts only Ray's three strategy classes,
    so the FSDP2 strategy gets the same environment check here."""
    from ray.train.lightning import prepare_trainer

    if isinstance(trainer.strategy, RayFSDP2Strategy):
        if not isinstance(trainer.strategy.cluster_environment, RayLightningEnvironment):
            raise RuntimeError("the FSDP strategy needs plugins=[RayLightningEnvironment()]")
        return trainer
    return prepare_trainer(trainer)


class RayDDP(RayDDPStrategy):
    """RayDDPStrategy that leaves the module unwrapped when it is the only worker.

    With one replica DDP has nothing to average, yet every step still pays for its forward
    bookkeeping and its backward hooks copying gradients into buckets: about 5% of a small
    model's step on CPU (py-spy, digits ViT). Everything else stays DDP's: the distributed
    sampler (so the data order is the same function of seed and epoch at any scale, which exact
    resumption relies on), checkpoint format and metric reduction.
    """

    def configure_ddp(self) -> None:
        if self.world_size > 1:
            super().configure_ddp()


class RayFSDP2Strategy(ModelParallelStrategy):
    """FSDP2 over all of Ray's workers: each of the model's blocks, then the whole model, is
    `fully_shard`ed, so a worker holds 1/N of the parameters, gradients and optimizer state.

    Lightning's ModelParallelStrategy asks the LightningModule to shard itself in configure_model;
    here the sharding comes from config, so research modules stay plain LightningModules.
    """

    def __init__(self, settings: Any, shard_blocks: List[str]) -> None:
        world_size = ray.train.get_context().get_world_size()
        super().__init__(
            data_parallel_size=world_size, tensor_parallel_size=1, save_distributed_checkpoint=settings.checkpoint_layout == "sharded"
        )
        self.settings = settings
        self.shard_blocks = shard_blocks

    @property
    def root_device(self) -> torch.device:
        return ray.train.torch.get_device()

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        return dict(num_replicas=self.world_size, rank=self.global_rank)

    def setup(self, trainer: Any) -> None:
        # ModelParallelStrategy.setup, with the module sharded here instead of in configure_model.
        self.accelerator.setup(trainer)
        self._shard(self.lightning_module)
        materialize_distributed_module(self.model, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            optimizers_to_device(self.optimizers, self.root_device)

    def _shard(self, module: torch.nn.Module) -> None:
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

        if isinstance(module, FSDPModule):
            return  # trainer.test after fit sets the strategy up again on the already-sharded module
        blocks = [m for m in module.modules() if type(m).__name__ in set(self.shard_blocks)]
        if self.shard_blocks and not blocks:
            raise RaydraError(
                f"model.shard_blocks={self.shard_blocks} names no module class of {type(module).__name__}; "
                "name the class of its repeated blocks (e.g. ViTLayer), or [] to shard the model as one unit."
            )
        if self.settings.activation_checkpointing:
            # Recompute each block's activations in backward instead of keeping them.
            apply_activation_checkpointing(module, check_fn=lambda m: type(m).__name__ in set(self.shard_blocks))
        options: Dict[str, Any] = {"mesh": self._mesh()}
        # grad_op keeps gathered parameters between forward and backward (ZeRO-2): less communication,
        # more memory. full frees them after each block's forward (ZeRO-3).
        options["reshard_after_forward"] = self.settings.sharding != "grad_op"
        if self.settings.mixed_precision:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[self.settings.mixed_precision]
            # Gather and compute in the low dtype; reduce gradients in fp32 so small updates survive.
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if self.settings.cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy()
        for param in module.parameters():
            # FSDP2 refuses non-contiguous parameters (a channels_last UNet's conv weights); back in
            # NCHW they shard, and convolutions still run NHWC on channels_last activations.
            if not param.is_contiguous():
                param.data = param.data.contiguous()
        for block in blocks:
            fully_shard(block, **options)
        fully_shard(module, **options)

    def _mesh(self) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        context = ray.train.get_context()
        world, per_node = context.get_world_size(), context.get_local_world_size()
        if self.settings.sharding == "hybrid" and world > per_node:
            # Shard within a node (fast links), replicate across nodes (slow links).
            return init_device_mesh(self.root_device.type, (world // per_node, per_node), mesh_dim_names=("replicate", "shard"))
        return init_device_mesh(self.root_device.type, (world,), mesh_dim_names=("shard",))

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(filepath)  # this worker's own directory: see the module docstring
        path.mkdir(parents=True, exist_ok=True)
        shards = {"state_dict": checkpoint.pop("state_dict")}
        shards.update({f"optimizer_{i}": state for i, state in enumerate(checkpoint.pop("optimizer_states", []))})
        save_distributed_checkpoint(shards, path)
        if self.global_rank == 0:
            torch.save(checkpoint, path / distributed_checkpoint_metadata_file())


class ShardedRayDeepSpeedStrategy(RayDeepSpeedStrategy):
    """RayDeepSpeedStrategy whose checkpoint shards go to each worker's own directory."""

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        # DeepSpeedStrategy.save_checkpoint without its broadcast of rank 0's path: see the module docstring.
        client_state = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        self.deepspeed_engine.save_checkpoint(
            filepath, client_state=client_state, tag="checkpoint", exclude_frozen_parameters=self.exclude_frozen_parameters
        )


def _deepspeed_config(settings: Any) -> Dict[str, Any]:
    """ZeRO settings from the named knobs, with `strategy.config` merged over them for anything else."""
    zero: Dict[str, Any] = {"stage": settings.stage}
    if settings.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if settings.offload_parameters:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return _merge({"zero_optimization": zero, "zero_allow_untested_optimizer": True}, settings.config or {})


def _merge(base: Dict[str, Any], extra: Dict[str, Any]) -> Dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged
