"""Stable Diffusion: captioned data, the tokenizer trained on captions, the pretrained-folder path,
the exported pipeline, and one real sd_tiny run (in local mode; on Ray workers in test_reliability).
Nothing downloads."""

import csv
import json
import os

import numpy as np
import pytest
import torch
from helpers import bare_trainer, run_dirs, summary_of
from PIL import Image

from raydra.data.image_captions import ImageCaptionsDataModule
from raydra.data.shapes_captions import ShapesCaptionsDataModule
from raydra.entry import CONF_DIR
from raydra.errors import RaydraError
from raydra.models.stable_diffusion import StableDiffusion, export
from raydra.models.stable_diffusion_parts import clip_tokenizer, train_caption_bpe

os.environ["HF_HUB_OFFLINE"] = "1"


def tiny_model_config():
    from omegaconf import OmegaConf

    model = OmegaConf.load(CONF_DIR / "model" / "sd_tiny.yaml")
    base = OmegaConf.load(CONF_DIR / "model" / "stable_diffusion.yaml")
    merged = OmegaConf.merge(base, model)
    merged.pop("defaults")
    merged.parts.vae.sample_size = merged.resolution
    merged.optimizer.fused = False
    merged.channels_last = False
    kwargs = OmegaConf.to_container(merged)
    kwargs.pop("_target_")
    kwargs.pop("_convert_")  # how Hydra builds the module, not an argument of it
    kwargs.pop("shard_blocks")  # the strategy's, not the module's: the worker pops it the same way
    return kwargs


def tiny_model(datamodule, **overrides):
    """An sd_tiny module built in-process, its tokenizer trained on the datamodule's captions."""
    kwargs = {**tiny_model_config(), **overrides}
    model = StableDiffusion(**kwargs)
    vocab, merges = train_caption_bpe(datamodule.train_captions, kwargs["parts"]["tokenizer"]["vocab_size"])
    model._build({"vocab": vocab, "merges": merges})
    return model


@pytest.fixture(scope="module")
def shapes():
    data = ShapesCaptionsDataModule(num_samples=32, val_samples=8, resolution=32, batch_size=4)
    data.setup()
    return data


def test_shapes_captions_batches_match_their_captions(shapes):
    batch = next(iter(shapes.train_dataloader()))
    assert batch["pixel_values"].shape == (4, 3, 32, 32)
    assert batch["pixel_values"].min() >= -1 and batch["pixel_values"].max() <= 1
    for caption, pixels in zip(batch["captions"], batch["pixel_values"]):
        words = caption.split()
        assert words[0] == "a" and words[3:] == ["on", "a", words[5], "background"]
        # The corner is background: its colour is the captioned background's.
        from raydra.data.shapes_captions import COLOURS

        corner = ((pixels[:, 0, 0] + 1) * 127.5).round().tolist()
        assert corner == list(COLOURS[words[5]])


def test_caption_tokenizer_encodes_any_text_without_unknowns(shapes):
    vocab, merges = train_caption_bpe(shapes.train_captions, 1000)
    tokenizer = clip_tokenizer(vocab, merges, max_length=16)
    ids = tokenizer("a red circle on a blue background").input_ids
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert len(ids) <= 9  # caption words are whole tokens after training on them
    unseen = tokenizer("zebra 42!").input_ids[1:-1]
    assert tokenizer.unk_token_id not in unseen
    assert tokenizer.decode(tokenizer("a zebra").input_ids, skip_special_tokens=True) == "a zebra"


def write_captioned(root, count=6, size=(40, 24)):
    root.mkdir(parents=True)
    rows = []
    for i in range(count):
        Image.fromarray(np.full((size[1], size[0], 3), i * 40, dtype=np.uint8)).save(root / f"{i}.png")
        rows.append({"file_name": f"{i}.png", "text": f"grey level {i}"})
    (root / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


def test_image_captions_reads_metadata_and_crops_square(tmp_path):
    data = ImageCaptionsDataModule(root=str(write_captioned(tmp_path / "imgs")), resolution=16, batch_size=2, val_fraction=0.34)
    data.setup()
    assert len(data.train_captions) == 4 and all(c.startswith("grey level") for c in data.train_captions)
    batch = next(iter(data.train_dataloader()))
    assert batch["pixel_values"].shape == (2, 3, 16, 16)
    # Each image is one grey level, so its pixels identify its caption.
    for caption, pixels in zip(batch["captions"], batch["pixel_values"]):
        level = int(caption.split()[-1]) * 40
        assert torch.allclose((pixels + 1) * 127.5, torch.full_like(pixels, level), atol=1)


@pytest.mark.parametrize(
    "breakage, message",
    [("no_metadata", "metadata.jsonl does not exist"), ("no_text", "has no `text`"), ("missing_image", "which does not exist")],
)
def test_bad_caption_folders_are_named(tmp_path, breakage, message):
    root = write_captioned(tmp_path / "imgs")
    if breakage == "no_metadata":
        (root / "metadata.jsonl").unlink()
    elif breakage == "no_text":
        (root / "metadata.jsonl").write_text('{"file_name": "0.png", "caption": "x"}\n')
    else:
        (root / "3.png").unlink()
    with pytest.raises(RaydraError, match=message):
        ImageCaptionsDataModule(root=str(root), resolution=16).setup()


def test_pretrained_folder_trains_and_exports_a_loadable_pipeline(shapes, tmp_path):
    """A diffusers layout written with save_pretrained loads through model.pretrained=<folder>; the
    module trains on it, and its export reloads with StableDiffusionPipeline.from_pretrained."""
    from diffusers import StableDiffusionPipeline

    layout = tmp_path / "layout"
    export(tiny_model(shapes).pipeline(), layout)
    config = {
        **tiny_model_config(),
        "parts": None,
        "pretrained": str(layout),
        "ema_decay": 0.99,
        "prediction_type": "v_prediction",
        "snr_gamma": 5.0,
        "cond_dropout": 0.5,
    }
    model = StableDiffusion(**config)
    model.configure_model()
    assert model.noise_scheduler.config.prediction_type == "v_prediction"
    before = [p.clone() for p in model.unet.parameters()]
    optimizer = torch.optim.AdamW(model.unet.parameters(), lr=1e-3)
    loss = model._loss(next(iter(shapes.train_dataloader())))
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.unet.parameters()))
    assert all(p.grad is None for p in model.vae.parameters()) and all(p.grad is None for p in model.text_encoder.parameters())

    exported = tmp_path / "exported"
    export(model.pipeline(), exported)
    assert not list(tmp_path.glob(".exported*"))  # nothing half-written left beside it
    pipe = StableDiffusionPipeline.from_pretrained(exported)
    image = pipe("a red circle on a blue background", num_inference_steps=2, output_type="pil").images[0]
    assert image.size == (32, 32)


def test_cache_latents_runs_the_vae_once_per_image(shapes):
    model = tiny_model(shapes, cache_latents=True)
    calls = []
    encode = model.vae.encode
    model.vae.encode = lambda x: (calls.append(len(x)), encode(x))[1]
    batches = list(shapes.train_dataloader())
    for _ in range(2):  # two epochs
        for batch in batches:
            model._loss(batch)
    assert sum(calls) == len(shapes.train_captions)  # every image encoded in the first epoch only
    assert len(model._latent_cache) == len(shapes.train_captions)


def test_cache_text_runs_the_text_encoder_once_per_caption_and_changes_no_loss(shapes):
    """With cond_dropout too: dropped captions take the embedding of "", encoded once."""
    model = tiny_model(shapes, cond_dropout=0.5)
    calls = []
    encode = model.text_encoder.forward
    model.text_encoder.forward = lambda ids, *args, **kwargs: (calls.append(len(ids)), encode(ids, *args, **kwargs))[1]
    batches = list(shapes.train_dataloader())
    losses = {}
    for cache_text in (False, True):
        model.hparams.cache_text = cache_text
        calls.clear()
        torch.manual_seed(0)  # the same latent samples, dropped captions, noise and timesteps
        with torch.no_grad():
            losses[cache_text] = [float(model._loss(batch)) for _ in range(2) for batch in batches]  # two epochs
        if cache_text:
            assert calls == [4] * len(batches)  # each caption once, in the first epoch
        else:
            assert sum(calls) == 2 * len(shapes.train_captions) + 1  # "" once, then kept
    assert len(model._text_cache) == len(shapes.train_captions)
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)


def test_under_bf16_mixed_the_frozen_parts_run_as_bf16_copies_while_checkpoints_and_the_export_keep_fp32(shapes, tmp_path):
    """Under autocast, the frozen VAE's and text encoder's fp32 weights were cast again at every
    step; bf16 copies of them run outside autocast instead, and nothing saved changes."""
    from safetensors.torch import load_file

    model = tiny_model(shapes, sample_prompts=[], cache_latents=True, cache_text=True)
    frozen = ("vae.", "text_encoder.")
    before = {k: v.clone() for k, v in model.state_dict().items() if k.startswith(frozen)}
    seen = set()
    model.vae.encoder.register_forward_pre_hook(
        lambda m, args: seen.add(("vae", m.conv_in.weight.dtype, args[0].dtype, torch.is_autocast_enabled("cpu")))
    )
    model.text_encoder.embeddings.register_forward_pre_hook(
        lambda m, args: seen.add(("text encoder", m.token_embedding.weight.dtype, torch.is_autocast_enabled("cpu")))
    )
    trainer = bare_trainer(precision="bf16-mixed", max_steps=3, limit_val_batches=0, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=shapes)
    assert seen == {("vae", torch.bfloat16, torch.bfloat16, False), ("text encoder", torch.bfloat16, False)}
    assert model._text_cache.values.dtype == torch.bfloat16  # half the memory a cached caption took

    # The module's state, a checkpoint and the exported pipeline: the fp32 weights it was given.
    state = model.state_dict()
    assert {k for k in state if k.startswith(frozen)} == set(before) and len(state) == len(model.state_dict(keep_vars=True))
    assert all(state[k].dtype == torch.float32 and torch.equal(state[k], v) for k, v in before.items())
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["state_dict"].keys() == state.keys()
    for part, weights in (("vae", "diffusion_pytorch_model.safetensors"), ("text_encoder", "model.safetensors")):
        exported = load_file(tmp_path / "pipeline" / part / weights)
        same = [key for key in exported if f"{part}.{key}" in before]
        assert len(same) == len(exported) > 0
        assert all(exported[key].dtype == torch.float32 and torch.equal(exported[key], before[f"{part}.{key}"]) for key in same)


@pytest.mark.gpu
def test_a_training_step_from_cached_latents_and_text_never_waits_for_the_gpu(shapes):
    """Each wait (an index read back, a blocking copy) leaves the GPU idle while the host catches up."""
    model = tiny_model(shapes, cache_latents=True, cache_text=True, cond_dropout=0.5).cuda()
    # As a GPU worker's batches arrive: images and index on the device, the indices on the host.
    batches = [{**b, "pixel_values": b["pixel_values"].cuda(), "index": b["index"].cuda()} for b in shapes.train_dataloader()]
    for batch in batches:  # the first epoch fills the caches
        model._loss(batch).backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in batches:
            model._loss(batch).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_channels_last_changes_the_layout_not_the_loss(shapes, tmp_path):
    layout = tmp_path / "layout"
    export(tiny_model(shapes).pipeline(), layout)
    batch = next(iter(shapes.val_dataloader()))
    losses = {}
    for channels_last in (False, True):
        model = StableDiffusion(**{**tiny_model_config(), "parts": None, "pretrained": str(layout), "channels_last": channels_last})
        model.configure_model()
        conv = model.unet.conv_in.weight
        assert conv.is_contiguous(memory_format=torch.channels_last) == channels_last
        losses[channels_last] = model._loss(batch, torch.Generator().manual_seed(0))
        losses[channels_last].backward()
        assert torch.isfinite(conv.grad).all()
    assert torch.allclose(losses[False], losses[True], rtol=1e-4)


@pytest.mark.parametrize(
    "breakage, message", [("missing_part", "lacks the subfolder"), ("resolution", "model.resolution=34 is not divisible by 4")]
)
def test_bad_pretrained_config_is_named(shapes, tmp_path, breakage, message):
    layout = tmp_path / "layout"
    export(tiny_model(shapes).pipeline(), layout)
    resolution = 32
    if breakage == "missing_part":
        import shutil

        shutil.rmtree(layout / "vae")
    else:
        resolution = 34
    model = StableDiffusion(**{**tiny_model_config(), "parts": None, "pretrained": str(layout), "resolution": resolution})
    with pytest.raises(RaydraError, match=message):
        model.configure_model()


@pytest.mark.e2e
def test_sd_tiny_trains_samples_and_exports(train_here, tmp_path):
    """In local mode, in this process: what is Stable Diffusion's here is the model, its samples and
    its export; sd_tiny on 2 Ray workers is test_reliability's (stopped, resumed, its files read)."""
    from diffusers import StableDiffusionPipeline

    done = train_here(
        "experiment=sd_tiny",
        "scale.num_workers=0",
        "scale.cpus_per_worker=2",  # both of the machine's cores, as two workers had
        "data.num_samples=256",
        "data.batch_size=4",
        "trainer.max_epochs=4",
        "model.ema_decay=0.99",
        # A quarter of sd_tiny's VAE fit (~55 s of the run's 165 s here): the fit still runs, and
        # nothing below asks more of the VAE than a decodable latent.
        "model.parts.vae_fit.steps=50",
        "logger=csv",
        outputs=tmp_path / "out",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = run_dirs(tmp_path / "out")[0]
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 0
    assert summary["global_step"] == 4 * 64  # 256 images, 4 a step
    # Captioned shapes have train and val only: no test, and no figure of another split under test/.
    assert summary["test_skipped"] == "the data has no test split"
    assert not [key for key in summary["metrics"]["final"] if key.startswith("test/")]
    assert "no test: the data has no test split" in done.stdout + done.stderr
    epoch_losses = [float(r["train/loss_epoch"]) for r in csv.DictReader(open(run_dir / "metrics.csv")) if r.get("train/loss_epoch")]
    assert len(epoch_losses) == 4 and epoch_losses[-1] < 0.85 * epoch_losses[0], epoch_losses

    samples = sorted((run_dir / "samples").glob("epoch_*.png"))
    assert [p.name for p in samples] == [f"epoch_{e:03d}.png" for e in range(4)]
    assert Image.open(samples[-1]).size == (4 * 32, 32)  # the four sd_tiny prompts side by side

    pipe = StableDiffusionPipeline.from_pretrained(run_dir / "pipeline")
    image = pipe("a red circle on a blue background", num_inference_steps=3).images[0]
    assert image.size == (32, 32)

    # A checkpoint is plain data: it rebuilds the module, tokenizer included, with weights_only.
    model = StableDiffusion.load_from_checkpoint(run_dir / summary["checkpoints"]["last"], map_location="cpu", weights_only=True)
    assert model.generate(["a red circle on a blue background"]).shape == (1, 32, 32, 3)
    # With EMA on, the export carries the averaged weights, not the last step's.
    exported = dict(pipe.unet.named_parameters())
    assert all(torch.equal(p, exported[n]) for n, p in model.ema_unet.named_parameters())
    assert not all(torch.equal(p, exported[n]) for n, p in model.unet.named_parameters())
