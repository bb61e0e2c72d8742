"""Stable Diffusion training speed through raydra, per batch size: images/s, MFU and peak memory, as a markdown table.

    python benchmarks/sd.py                  # sd_tiny on CPU with 1 and 2 workers, 4 images per worker
    python benchmarks/sd.py --gpu            # a full-size SD 2 base UNet (random init) at 256 px, bf16-mixed,
                                             # on 1 GPU worker, the batch per GPU swept: 16, 64, 128 and the
                                             # largest that fits (--batches 16,64,128,max)
    python benchmarks/sd.py --gpu --latents cached --batches 64 --steps 20   # the GPU suite's step
    python benchmarks/sd.py --gpu --workers 1 2 4

--batches takes images per worker per step, comma-separated; `max` (GPU only) doubles the largest
that ran until a run fails with CUDA out of memory and keeps the last that fit: its row is the
largest batch per GPU, and a line under the table names it and the best images/s per GPU.

Latents: `encoded` (the default) runs the frozen VAE and text encoder on every batch, as a run
without model.cache_latents and model.cache_text does; `cached` keeps each image's latent
distribution and each caption's text embedding after the first epoch (model.cache_latents=true
model.cache_text=true, as the published reference precomputes both) and reports the last of 3
epochs, when every batch skips the VAE and the text encoder.

MFU: the UNet's forward and backward FLOPs per image, counted as raydra's Throughput callback counts
a step (torch.utils.flop_counter) on one image of the run's own UNet built on the meta device (shapes
only: no memory, no GPU), times images/s per GPU, over the GPU's dense bf16 peak as raydra's MFU
takes it (raydra.worker.throughput.PEAK_TFLOPS). A cached step is the UNet's alone; an encoded one
also runs the VAE encoder and the text encoder forward, which this count leaves out, as the
reference's does.

Each configuration is one `train.py` run (Ray's start included, which the figures leave out):
steady-state figures come from the run's summary.json (`throughput`, measured after 5 warm-up steps;
`peak_memory_bytes`: rank 0's resident set on CPU, its CUDA peak allocation on GPU). Samples and
the pipeline export are switched off so only training steps are timed.
"""

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Stable Diffusion 2 base's UNet, VAE and text encoder (OpenCLIP ViT-H text tower) sizes, built with
# random weights from model=sd_tiny's parts path: no download.
FULL_SIZE = [
    "model.resolution=256",
    "model.parts.unet.sample_size=32",
    "model.parts.unet.block_out_channels=[320,640,1280,1280]",
    "model.parts.unet.layers_per_block=2",
    "model.parts.unet.down_block_types=[CrossAttnDownBlock2D,CrossAttnDownBlock2D,CrossAttnDownBlock2D,DownBlock2D]",
    "model.parts.unet.up_block_types=[UpBlock2D,CrossAttnUpBlock2D,CrossAttnUpBlock2D,CrossAttnUpBlock2D]",
    "model.parts.unet.attention_head_dim=[5,10,20,20]",
    "+model.parts.unet.use_linear_projection=true",
    "model.parts.vae.block_out_channels=[128,256,512,512]",
    "model.parts.vae.down_block_types=[DownEncoderBlock2D,DownEncoderBlock2D,DownEncoderBlock2D,DownEncoderBlock2D]",
    "model.parts.vae.up_block_types=[UpDecoderBlock2D,UpDecoderBlock2D,UpDecoderBlock2D,UpDecoderBlock2D]",
    "model.parts.vae.layers_per_block=2",
    "model.parts.vae.norm_num_groups=32",
    "model.parts.vae.scaling_factor=0.18215",
    # Speed of UNet training is the question; fitting a full-size VAE first would only add start-up.
    "model.parts.vae_fit.steps=0",
    "model.parts.text_encoder.hidden_size=1024",
    "model.parts.text_encoder.intermediate_size=4096",
    "model.parts.text_encoder.num_hidden_layers=23",
    "model.parts.text_encoder.num_attention_heads=16",
    "model.parts.text_encoder.projection_dim=1024",
    "+model.parts.text_encoder.hidden_act=gelu",
    "model.parts.tokenizer.max_length=77",
    "model.optimizer.lr=1e-4",
    "scale=gpu",
    "trainer.precision=bf16-mixed",
]
DEFAULT_BATCHES = {"gpu": "16,64,128,max", "cpu": "4"}
DEFAULT_STEPS = {"gpu": 50, "cpu": 40}
# Where `--batches max` alone starts doubling.
MAX_FROM = 16


class OutOfMemory(Exception):
    """A run failed with CUDA out of memory at this batch."""


def overrides_for(workers: int, gpu: bool, epochs: int, latents: str, per_worker: int, steps: int) -> list:
    cached = latents == "cached"
    overrides = [
        "experiment=sd_tiny",
        "logger=csv",
        f"scale.num_workers={workers}",
        f"data.batch_size={per_worker * workers}",
        f"trainer.max_epochs={epochs}",
        "model.export_pipeline=false",
        "model.sample_prompts=[]",
        # `steps` steps per worker per epoch, whatever the worker count and the batch.
        f"data.num_samples={per_worker * workers * steps}",
        f"model.cache_latents={str(cached).lower()}",
        f"model.cache_text={str(cached).lower()}",
    ]
    if gpu:
        # One checkpoint, at the end: full-size SD's weights and AdamW state are ~12 GB a save,
        # which would cost disk and time the figures do not measure.
        overrides += FULL_SIZE + ["checkpoint.every_n_epochs=1000", "checkpoint.num_to_keep=1"]
    return overrides


def unet_flops_per_image(overrides: list) -> int:
    """FLOPs of the UNet's forward and backward for one image, as Throughput counts a training step:
    the run's config composed as train.py composes it, its UNet built on the meta device and counted
    by torch.utils.flop_counter on a batch of one (the count is linear in the batch)."""
    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from torch.utils.flop_counter import FlopCounterMode

    from raydra.config.schema import register_schemas
    from raydra.entry import CONF_DIR
    from raydra.models.stable_diffusion_parts import unet_from

    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        model = OmegaConf.to_container(compose(config_name="train", overrides=overrides).model, resolve=True)
    parts = model["parts"]
    latent_side = model["resolution"] // 2 ** (len(parts["vae"]["block_out_channels"]) - 1)
    with torch.device("meta"):
        unet = unet_from(parts)
        latents = torch.randn(1, unet.config.in_channels, latent_side, latent_side)
        text = torch.randn(1, parts["tokenizer"]["max_length"], unet.config.cross_attention_dim)
        timesteps = torch.randint(0, 1000, (1,))
    with FlopCounterMode(display=False) as counter:
        unet(latents, timesteps, text).sample.float().pow(2).mean().backward()
    return counter.get_total_flops()


def last_epoch_rate(metrics_csv: Path) -> dict:
    """The last epoch's train/samples_per_s and train/step_time_s from the run's metrics.csv."""
    with open(metrics_csv) as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/samples_per_s")]
    return {
        "samples_per_s": float(rows[-1]["train/samples_per_s"]),
        "step_time_s": float(rows[-1]["train/step_time_s"]),
        "epoch": rows[-1]["epoch"],
    }


def is_out_of_memory(text: str) -> bool:
    # torch's message ("CUDA out of memory. Tried to allocate ...") and its class, torch.OutOfMemoryError.
    return "out of memory" in text.lower() or "OutOfMemoryError" in text


def run(workers: int, gpu: bool, epochs: int, latents: str, per_worker: int, steps: int) -> dict:
    cached = latents == "cached"
    if cached:
        epochs = max(epochs, 3)  # the first epoch fills the cache; the last runs from it
    overrides = overrides_for(workers, gpu, epochs, latents, per_worker, steps)
    with tempfile.TemporaryDirectory() as outputs:
        done = subprocess.run(
            [sys.executable, "train.py", *overrides, f"paths.outputs={outputs}"], cwd=REPO, capture_output=True, text=True
        )
        summaries = list(Path(outputs).glob("runs/*/*/summary.json"))
        summary = json.loads(summaries[0].read_text()) if summaries else {}
        if done.returncode:
            said = f"{summary.get('error') or ''}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            if gpu and is_out_of_memory(said):
                raise OutOfMemory(per_worker)
            sys.exit(f"train.py {' '.join(overrides)} failed:\n{said}")
        throughput = dict(summary["throughput"])
        if cached:
            throughput = last_epoch_rate(summaries[0].parent / "metrics.csv")
            throughput["samples_per_s_per_worker"] = throughput["samples_per_s"] / workers
    return {
        "batch": per_worker,
        "workers": workers,
        "latents": f"latents and text cached (epoch {int(throughput['epoch']) + 1} of {epochs})" if cached else "encoded each step",
        "steps_per_s": 1 / throughput["step_time_s"],
        "images_per_s": throughput["samples_per_s"],
        "images_per_s_per_worker": throughput["samples_per_s_per_worker"],
        "peak_memory_gib": summary["peak_memory_bytes"] / 2**30,
        "steps": summary["global_step"],
    }


def sweep(batches: list, measure) -> tuple:
    """Rows of `measure(batch)` for each batch, smallest first, then for `max` the largest batch
    doubled until `measure` raises OutOfMemory. A batch that runs out of memory ends the sweep: a
    larger one would too. Returns (rows, the largest batch that ran or None, the batch that ran
    out of memory or None)."""
    rows, fitted, failed = [], None, None
    todo = sorted(b for b in batches if b != "max") or [MAX_FROM]
    while todo:
        batch = todo.pop(0)
        try:
            rows.append(measure(batch))
        except OutOfMemory:
            failed = batch
            break
        fitted = batch
        if not todo and "max" in batches:
            todo.append(batch * 2)
    return rows, fitted, failed


def cell_flops(row: dict, flops_per_image: int, peak: float) -> tuple:
    """(UNet TFLOP/s per worker, MFU or None) of a row: images/s per worker x FLOPs per image, over the peak."""
    achieved = row["images_per_s_per_worker"] * flops_per_image
    return achieved / 1e12, (achieved / peak if peak else None)


def table_row(row: dict, flops_per_image: int, peak: float) -> str:
    tflops, mfu = cell_flops(row, flops_per_image, peak)
    return (
        f"| {row['batch']} | {row['workers']} | {row['latents']} | {row['steps_per_s']:.2f} | {row['images_per_s']:.1f} "
        f"| {row['images_per_s_per_worker']:.1f} | {tflops:.3g} | {f'{mfu:.1%}' if mfu is not None else '-'} | {row['peak_memory_gib']:.2f} |"
    )


def batch_list(text: str) -> list:
    """--batches: positive counts and `max`, comma-separated, checked as the flag is read."""
    out = []
    for word in text.split(","):
        if word == "max":
            out.append("max")
        elif word.isdigit() and int(word) > 0:
            out.append(int(word))
        else:
            raise argparse.ArgumentTypeError(f"takes images per worker (positive counts) and max, comma-separated, not {word!r}")
    return out


def latents_kinds(text: str) -> str:
    """--latents: checked as the flag is read."""
    if not text or set(text.split(",")) - {"encoded", "cached"}:
        raise argparse.ArgumentTypeError(f"takes encoded and/or cached, not {text!r}")
    return text


def parse(argv: list = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="full-size SD 2 base at 256 px, bf16-mixed, on GPU workers")
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="worker counts (CPU: 1 2; GPU: 1)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--batches",
        type=batch_list,
        default=None,
        help=f"images per worker per step, comma-separated; max: the largest that fits on the GPU (GPU: {DEFAULT_BATCHES['gpu']}; CPU: {DEFAULT_BATCHES['cpu']})",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help=f"steps per worker per epoch (GPU: {DEFAULT_STEPS['gpu']}; CPU: {DEFAULT_STEPS['cpu']})"
    )
    parser.add_argument(
        "--latents",
        default="encoded",
        type=latents_kinds,
        help="comma-separated: encoded (the VAE and text encoder on every batch), cached (model.cache_latents=true "
        "model.cache_text=true, the last of 3 epochs)",
    )
    args = parser.parse_args(argv)
    device = "gpu" if args.gpu else "cpu"
    args.batches = args.batches or batch_list(DEFAULT_BATCHES[device])
    args.steps = args.steps or DEFAULT_STEPS[device]
    args.workers = args.workers or ([1] if args.gpu else [1, 2])
    if "max" in args.batches and not args.gpu:
        parser.error("--batches max looks for the largest batch that fits in GPU memory: add --gpu, or give counts only")
    return args


def main() -> None:
    args = parse()
    kinds = args.latents.split(",")
    flops_per_image = unet_flops_per_image(overrides_for(1, args.gpu, args.epochs, "encoded", 1, args.steps))
    peak = None
    if args.gpu:
        import torch

        from raydra.worker.throughput import peak_flops

        peak = peak_flops(torch.device("cuda"), "bf16-mixed") if torch.cuda.is_available() else None
    what = "SD 2 base sizes, 256 px, bf16-mixed" if args.gpu else "sd_tiny, 32 px, 1 CPU thread per worker"
    memory = "peak CUDA GiB (rank 0)" if args.gpu else "peak RSS GiB (rank 0)"
    peak_said = f"{peak / 1e12:.0f} TFLOP/s dense bf16 peak" if peak else "no known peak: no MFU"
    print(
        f"{what}; {args.steps} steps per worker per epoch; the UNet's forward and backward {flops_per_image / 1e9:.1f} GFLOP per image; {peak_said}\n"
    )
    print(f"| batch per worker | workers | latents | steps/s | images/s | images/s per worker | UNet TFLOP/s per worker | MFU | {memory} |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|", flush=True)
    notes = []
    for count in args.workers:
        for kind in kinds:

            def measure(batch: int, count: int = count, kind: str = kind) -> dict:
                row = run(count, args.gpu, args.epochs, kind, batch, args.steps)
                print(table_row(row, flops_per_image, peak), flush=True)  # as each run ends: a cut-off sweep keeps its rows
                return row

            rows, fitted, failed = sweep(args.batches, measure)
            if failed is not None:
                print(f"| {failed} | {count} | {kind} | out of CUDA memory | | | | | |", flush=True)
            where = f"{count} worker{'s' * (count > 1)}, {kind}"
            if "max" in args.batches and fitted is not None:
                notes.append(f"largest batch per GPU that fits ({where}): {fitted}" + (f" ({failed} ran out of memory)" if failed else ""))
            if rows:
                best = max(rows, key=lambda r: r["images_per_s_per_worker"])
                notes.append(f"best images/s per worker ({where}): {best['images_per_s_per_worker']:.1f} at batch {best['batch']}")
    print("\n" + "\n".join(notes))


if __name__ == "__main__":
    main()
