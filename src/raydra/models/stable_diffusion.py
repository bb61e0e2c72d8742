"""Stable Diffusion: a text-to-image UNet trained on noise prediction, VAE and text encoder frozen.

The parts come from a diffusers layout (`pretrained`, optionally with a fresh UNet: `from_scratch`)
or from small configs (`parts`, what model=sd_tiny uses). They are built in `configure_model`, once
the data module is set up, because a tokenizer built from configs is trained on the run's captions.
Rank 0 writes a grid of fixed prompts to <run dir>/samples/ at every validation and exports the
final weights (EMA weights when EMA is on) as a diffusers pipeline folder <run dir>/pipeline/.
"""

import contextlib
import copy
import inspect
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import DDIMScheduler, StableDiffusionPipeline
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
from diffusers.training_utils import compute_snr
from omegaconf import OmegaConf
from torch.optim.swa_utils import get_ema_multi_avg_fn

from raydra.errors import RaydraError
from raydra.lightning import pl
from raydra.models import partial_of
from raydra.models.stable_diffusion_parts import build_parts, clip_tokenizer, fit_vae, load_parts, train_caption_bpe
from raydra.records.layout import PIPELINE, SAMPLES
from raydra.storage import replacing, replacing_tree


class StableDiffusion(pl.LightningModule):
    """optimizer/scheduler arrive as partials (Hydra builds the `_partial_` nodes of
    model/stable_diffusion.yaml), or as those configs themselves (a checkpoint written before);
    `parts` as plain data (the YAML's `_convert_: all`)."""

    def __init__(
        self,
        resolution: int,
        optimizer: Any,
        scheduler: Optional[Any] = None,
        pretrained: Optional[str] = None,
        from_scratch: bool = False,
        parts: Optional[Dict[str, Any]] = None,
        prediction_type: Optional[str] = None,
        snr_gamma: Optional[float] = None,
        cond_dropout: float = 0.0,
        ema_decay: Optional[float] = None,
        gradient_checkpointing: bool = False,
        channels_last: bool = False,
        cache_latents: bool = False,
        cache_text: bool = False,
        sample_prompts: Sequence[str] = (),
        sample_steps: int = 25,
        guidance_scale: float = 7.5,
        sample_seed: int = 0,
        export_pipeline: bool = True,
    ) -> None:
        super().__init__()
        # Into every checkpoint (raydra.load builds the module again from them), not to the loggers:
        # they get the run's whole config from raydra, and a partial is no value to log.
        self.save_hyperparameters(logger=False)
        if bool(pretrained) == bool(parts):
            raise RaydraError(
                "set exactly one of model.pretrained (a diffusers folder or cached hub id) and model.parts "
                "(configs to build from, as model=sd_tiny does)."
            )
        if prediction_type not in (None, "epsilon", "v_prediction"):
            raise RaydraError(f"model.prediction_type={prediction_type} must be epsilon, v_prediction or null (the scheduler's).")
        self.bpe: Optional[Dict[str, Any]] = None  # the trained tokenizer's vocab and merges, when built from parts
        self._latent_cache = SampleCache()
        self._text_cache = SampleCache()
        self._empty_text: Optional[torch.Tensor] = None  # the embedding of "", for dropped captions
        self.ema_unet: Optional[torch.nn.Module] = None
        self._ema_step = 0
        # bf16 copies of the frozen parts a bf16-mixed step runs (_frozen): a plain dict, so no
        # submodule, nothing of them in a checkpoint or the exported pipeline.
        self._bf16_parts: Dict[str, torch.nn.Module] = {}

    # -- building -----------------------------------------------------------------------------

    def configure_model(self) -> None:
        if hasattr(self, "unet"):
            return
        bpe = None
        if self.hparams.parts:
            if self._trainer is None:
                return  # load_from_checkpoint: on_load_checkpoint builds with the checkpoint's tokenizer
            # Every worker must hold the identical tokenizer (BPE training breaks ties differently from
            # one process to the next), so rank 0 trains it and the others receive it.
            if self.trainer.global_rank == 0:
                bpe = self._train_tokenizer()
            bpe = self.trainer.strategy.broadcast(bpe, src=0)
        self._build(bpe)
        fit = (self.hparams.parts or {}).get("vae_fit")
        if fit and fit["steps"] and self.trainer.global_rank == 0:
            # Rank 0 alone: DDP copies every parameter, frozen ones included, from rank 0 when it wraps the module.
            fit_vae(self.vae, self.trainer.datamodule.train_images, fit["steps"], fit["batch_size"], fit["lr"])
            self.vae.requires_grad_(False)

    def _train_tokenizer(self) -> Dict[str, Any]:
        captions = getattr(self.trainer.datamodule, "train_captions", None)
        if not captions:
            raise RaydraError(
                "model.parts trains the tokenizer on the data's captions, but the data module has no train_captions; "
                "use data=shapes_captions or data=image_captions."
            )
        vocab, merges = train_caption_bpe(list(captions) + list(self.hparams.sample_prompts), self.hparams.parts["tokenizer"]["vocab_size"])
        return {"vocab": vocab, "merges": merges}

    def _build(self, bpe: Optional[Dict[str, Any]]) -> None:
        hp = self.hparams
        if hp.parts:
            tokenizer = clip_tokenizer(bpe["vocab"], bpe["merges"], hp.parts["tokenizer"]["max_length"])
            # Plain lists and dicts: diffusers writes the parts' configs to JSON (export_pipeline), which
            # an OmegaConf node (a run recorded without the YAML's `_convert_: all`) is not.
            parts = build_parts(OmegaConf.to_container(hp.parts) if OmegaConf.is_config(hp.parts) else hp.parts, tokenizer)
            self.bpe = bpe
        else:
            parts = load_parts(hp.pretrained, hp.from_scratch)
        self.tokenizer, self.noise_scheduler = parts["tokenizer"], parts["scheduler"]
        self.text_encoder = parts["text_encoder"].requires_grad_(False).eval()
        self.vae = parts["vae"].requires_grad_(False).eval()
        self.unet = parts["unet"]
        vae_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        unet_factor = 2 ** (len(self.unet.config.block_out_channels) - 1)
        if hp.resolution % (vae_factor * unet_factor):
            raise RaydraError(
                f"model.resolution={hp.resolution} is not divisible by {vae_factor * unet_factor} (the VAE downsamples "
                f"{vae_factor}x, the UNet {unet_factor}x more); pick a multiple of {vae_factor * unet_factor}."
            )
        if hp.prediction_type:
            self.noise_scheduler.register_to_config(prediction_type=hp.prediction_type)
        if hp.gradient_checkpointing:
            self.unet.enable_gradient_checkpointing()
        if hp.channels_last:
            # cuDNN's convolutions run NHWC natively; NCHW weights and activations cost a transpose
            # around every conv of the UNet and VAE.
            self.unet.to(memory_format=torch.channels_last)
            self.vae.to(memory_format=torch.channels_last)
        if hp.ema_decay:
            self.ema_unet = copy.deepcopy(self.unet).requires_grad_(False)

    # -- training -----------------------------------------------------------------------------

    @property
    def _memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.hparams.channels_last else torch.contiguous_format

    def _frozen(self, name: str) -> torch.nn.Module:
        """The frozen part (`vae`, `text_encoder`) a step runs. Under bf16-mixed, a bf16 copy of it,
        which runs outside autocast: autocast would cast each of its fp32 weights again every step
        and run its norms in fp32. The copy is no submodule, so checkpoints, the exported pipeline
        and the samples keep the fp32 weights. Where the strategy holds the weights in a form of its
        own (fsdp's sharded DTensors, DeepSpeed's partitions or bf16 weights), the part itself."""
        part = getattr(self, name)
        if self._trainer is None or self.trainer.precision != "bf16-mixed":
            return part
        weights = list(part.parameters())
        copy_ = self._bf16_parts.get(name)
        if copy_ is not None and next(copy_.parameters()).device == weights[0].device:
            return copy_
        if not all(type(w.data) is torch.Tensor and w.numel() and w.dtype == torch.float32 for w in weights):
            return part
        # deepcopy takes a tensor already in its memo as the copy of it: each floating-point weight
        # and buffer goes straight to bf16, without a second fp32 copy of the part on the device.
        memo = {
            id(t): torch.nn.Parameter(t.detach().to(torch.bfloat16), requires_grad=False)
            if isinstance(t, torch.nn.Parameter)
            else t.detach().to(torch.bfloat16)
            for t in [*weights, *part.buffers()]
            if t.is_floating_point()
        }
        self._bf16_parts[name] = copy_ = copy.deepcopy(part, memo)
        return copy_

    def _outside_autocast(self, copy_: bool) -> Any:
        return torch.autocast(self.device.type, enabled=False) if copy_ else contextlib.nullcontext()

    def _latents(self, batch: Dict[str, Any], sample: bool) -> torch.Tensor:
        """VAE latents of the batch's images; with cache_latents the VAE runs once per image."""
        cache = self._latent_cache if self.hparams.cache_latents and sample else None
        params = cache.get(batch) if cache is not None else None
        if params is None:
            vae = self._frozen("vae")
            with torch.no_grad(), self._outside_autocast(vae is not self.vae):
                pixels = batch["pixel_values"].to(vae.dtype, memory_format=self._memory_format)
                params = vae.encode(pixels).latent_dist.parameters
            if cache is not None:
                cache.put(batch, params)
        dist = DiagonalGaussianDistribution(params)
        return (dist.sample() if sample else dist.mode()) * self.vae.config.scaling_factor

    def _text(self, batch: Dict[str, Any], training: bool) -> torch.Tensor:
        """The text encoder's output for the batch's captions; in training, cond_dropout's share of
        them replaced by the embedding of "". With cache_text the encoder runs once per training
        caption (and once for "")."""
        drop = None
        if training and self.hparams.cond_dropout:
            # Captions dropped to the empty prompt teach the unconditional prediction that
            # classifier-free guidance contrasts against. Drawn on the host, as the captions are.
            drop = torch.rand(len(batch["captions"])) < self.hparams.cond_dropout
        cache = self._text_cache if self.hparams.cache_text and training else None
        embeddings = cache.get(batch) if cache is not None else None
        if embeddings is None:
            embeddings = self._encode_text(list(batch["captions"]))
            if cache is not None:
                cache.put(batch, embeddings)
        if drop is None:
            return embeddings
        if self._empty_text is None or self._empty_text.device != embeddings.device:
            self._empty_text = self._encode_text([""])
        return torch.where(self._to_device(drop).view(-1, 1, 1), self._empty_text.to(embeddings.dtype), embeddings)

    def _encode_text(self, captions: List[str]) -> torch.Tensor:
        ids = self.tokenizer(
            captions, padding="max_length", max_length=self.tokenizer.model_max_length, truncation=True, return_tensors="pt"
        ).input_ids
        text_encoder = self._frozen("text_encoder")
        with torch.no_grad(), self._outside_autocast(text_encoder is not self.text_encoder):
            return text_encoder(self._to_device(ids))[0]

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor on this module's device. To a GPU from pinned memory, without blocking: a
        blocking copy waits for every kernel queued before it (torch synchronises the stream)."""
        if self.device.type != "cuda":
            return tensor.to(self.device)
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _loss(self, batch: Dict[str, Any], generator: Optional[torch.Generator] = None) -> torch.Tensor:
        training = generator is None
        latents = self._latents(batch, sample=training)
        text = self._text(batch, training)
        n = latents.shape[0]
        steps = self.noise_scheduler.config.num_train_timesteps
        if training:
            noise = torch.randn_like(latents)
            timesteps = torch.randint(0, steps, (n,), device=latents.device)
        else:  # validation draws from its own seeded CPU generator, the same every epoch
            noise = torch.randn(latents.shape, generator=generator).to(latents)
            timesteps = torch.randint(0, steps, (n,), generator=generator).to(latents.device)
        noisy = self.noise_scheduler.add_noise(latents, noise, timesteps).contiguous(memory_format=self._memory_format)
        if self.noise_scheduler.config.prediction_type == "v_prediction":
            target = self.noise_scheduler.get_velocity(latents, noise, timesteps)
        else:
            target = noise
        prediction = self.unet(noisy, timesteps, text).sample
        if not self.hparams.snr_gamma:
            return F.mse_loss(prediction.float(), target.float())
        # Min-SNR weighting (Hang et al. 2023): easy low-noise steps stop dominating the loss.
        snr = compute_snr(self.noise_scheduler, timesteps)
        weight = torch.clamp(snr, max=self.hparams.snr_gamma)
        weight = weight / snr if self.noise_scheduler.config.prediction_type == "epsilon" else weight / (snr + 1)
        per_sample = F.mse_loss(prediction.float(), target.float(), reduction="none").mean(dim=(1, 2, 3))
        return (per_sample * weight).mean()

    def training_step(self, batch: Dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        # Rank 0's own loss: syncing it would add an all-reduce to every training step.
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Dict[str, Any], batch_idx: int) -> None:
        # The same noise and timesteps every epoch, so val/loss moves only with the weights.
        generator = torch.Generator().manual_seed(10_000 * self.global_rank + batch_idx)
        self.log("val/loss", self._loss(batch, generator), sync_dist=True)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # global_step counts optimizer steps: under gradient accumulation most batches take none.
        if self.ema_unet is None or self.trainer.global_step == self._ema_step:
            return
        self._ema_step = self.trainer.global_step
        # diffusers' EMAModel schedule: the average forgets its random start quickly, then settles.
        step = self.trainer.global_step - 1
        decay = min(self.hparams.ema_decay, (1 + step) / (10 + step))
        # One foreach lerp over all the weights (torch's own EMA update), not a kernel launch per weight.
        get_ema_multi_avg_fn(decay)(list(self.ema_unet.parameters()), list(self.unet.parameters()), None)

    def configure_optimizers(self) -> Any:
        optimizer = partial_of(self.hparams.optimizer)(params=[p for p in self.unet.parameters() if p.requires_grad])
        if not self.hparams.scheduler:
            return optimizer
        build = partial_of(self.hparams.scheduler)
        # Constant-after-warm-up schedules take no run length; decaying ones need it.
        accepts_length = "num_training_steps" in inspect.signature(build.func).parameters
        kwargs = {"num_training_steps": self.trainer.estimated_stepping_batches} if accepts_length else {}
        scheduler = build(optimizer=optimizer, **kwargs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # -- checkpoints --------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        if self.bpe is not None:
            checkpoint["caption_bpe"] = self.bpe  # plain dict/list/str: still loads with weights_only=True

    def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        self._bf16_parts.clear()  # made again from the weights the checkpoint brings
        bpe = checkpoint.get("caption_bpe")
        if not hasattr(self, "unet"):  # load_from_checkpoint: nothing built yet
            self._build(bpe)
        elif bpe is not None and bpe != self.bpe:
            # A resumed run keeps the tokenizer its text encoder was trained with.
            if len(bpe["vocab"]) != len(self.bpe["vocab"]):
                raise RaydraError(
                    "the checkpoint's tokenizer has a different vocabulary size than model.parts.tokenizer.vocab_size "
                    "gives; resume with the run's original config."
                )
            self.bpe = bpe
            self.tokenizer = clip_tokenizer(bpe["vocab"], bpe["merges"], self.tokenizer.model_max_length)

    # -- samples and export -------------------------------------------------------------------

    def pipeline(self) -> StableDiffusionPipeline:
        """A diffusers pipeline around the current weights (the EMA UNet when EMA is on)."""
        pipe = StableDiffusionPipeline(
            vae=self.vae,
            text_encoder=self.text_encoder,
            tokenizer=self.tokenizer,
            unet=self.ema_unet if self.ema_unet is not None else self.unet,
            # DDIM samples well in a few dozen steps and reads the training schedule's prediction type.
            scheduler=DDIMScheduler.from_config(self.noise_scheduler.config),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def generate(self, prompts: Sequence[str]) -> np.ndarray:
        """Images for `prompts` from the fixed sample seed, as uint8 (n, H, W, 3)."""
        hp = self.hparams
        generator = torch.Generator().manual_seed(hp.sample_seed)
        context = self.trainer.precision_plugin.forward_context() if self._trainer is not None else torch.no_grad()
        with context:
            images = self.pipeline()(
                list(prompts),
                height=hp.resolution,
                width=hp.resolution,
                num_inference_steps=hp.sample_steps,
                guidance_scale=hp.guidance_scale,
                generator=generator,
                output_type="np",
            ).images
        return (np.clip(images, 0, 1) * 255).round().astype(np.uint8)

    def on_validation_epoch_end(self) -> None:
        # Rank 0 alone, with no collectives inside, so the other ranks never wait on it.
        if self.trainer.sanity_checking or self.global_rank != 0 or not self.hparams.sample_prompts:
            return
        from PIL import Image

        grid = Image.fromarray(_grid(self.generate(self.hparams.sample_prompts)))
        name = f"epoch_{self.current_epoch:03d}"
        if self.trainer.val_check_interval != 1.0:  # several validations per epoch: one file each
            name += f"_step_{self.global_step:07d}"
        path = Path(self.trainer.default_root_dir) / SAMPLES / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as partial:
            grid.save(partial, format="PNG")
        for logger in self.trainer.loggers:
            if type(logger).__name__ == "WandbLogger":
                caption = " | ".join(self.hparams.sample_prompts)
                logger.log_image("samples", [grid], step=self.global_step, caption=[caption])

    def on_fit_end(self) -> None:
        if self.global_rank == 0 and self.hparams.export_pipeline:
            export(self.pipeline(), Path(self.trainer.default_root_dir) / PIPELINE)


class SampleCache:
    """A tensor per training sample (a VAE latent distribution, a text embedding), kept on the
    device in one tensor and gathered a batch at a time with the batch's device-side index: no
    per-sample views joined by torch.stack, nothing read back to the host. Which samples it holds
    is kept on the host, from the batch's host-side indices. Not part of the module's state: a
    resumed run fills it again."""

    def __init__(self) -> None:
        self.values: Optional[torch.Tensor] = None
        self.held: set = set()

    def __len__(self) -> int:
        return len(self.held)

    def get(self, batch: Dict[str, Any]) -> Optional[torch.Tensor]:
        """The batch's values, or None unless every sample of it is held."""
        if self.values is None or not self.held.issuperset(_host_indices(batch)):
            return None
        return self.values[batch["index"]]

    def put(self, batch: Dict[str, Any], values: torch.Tensor) -> None:
        indices = _host_indices(batch)
        rows = max(indices) + 1
        if self.values is None or len(self.values) < rows:
            # Rows up to the largest index seen: the split's size once a shuffled epoch has passed,
            # reached in a few steps of growth.
            grown = values.new_empty((rows, *values.shape[1:]))
            if self.values is not None:
                grown[: len(self.values)] = self.values
            self.values = grown
        self.values[batch["index"]] = values.detach()
        self.held.update(indices)


def _host_indices(batch: Dict[str, Any]) -> List[int]:
    # raydra's captioned data hands them over on the host; other data only as a tensor, which read
    # from a GPU waits for it.
    return batch["indices"] if "indices" in batch else batch["index"].tolist()


def export(pipe: StableDiffusionPipeline, target: Path) -> None:
    """save_pretrained into a hidden sibling, then renamed: a crashed export never looks complete."""
    with replacing_tree(target) as partial:
        pipe.save_pretrained(partial)


def _grid(images: np.ndarray, columns: int = 4) -> np.ndarray:
    n, h, w, c = images.shape
    columns = min(columns, n)
    rows = -(-n // columns)
    grid = np.full((rows * h, columns * w, c), 255, dtype=np.uint8)
    for i, image in enumerate(images):
        r, col = divmod(i, columns)
        grid[r * h : (r + 1) * h, col * w : (col + 1) * w] = image
    return grid
