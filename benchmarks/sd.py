"""Stable Diffusion training speed through raydra: steps/s, images/s and peak memory, as a markdown table.

    python benchmarks/sd.py                  # sd_tiny on CPU with 1 and 2 workers
    python benchmarks/sd.py --gpu            # a full-size SD 2 base UNet (random init) at 256 px,
                                             # bf16-mixed, 8 images per GPU, on 1 GPU worker
    python benchmarks/sd.py --gpu --workers 1 2 4
    python benchmarks/sd.py --gpu --latents cached   # latents and text cached, 3 epochs, the last epoch's rate

Latents: `encoded` (the default) runs the frozen VAE and text encoder on every batch, as a run
without model.cache_latents and model.cache_text does; `cached` keeps each image's latent
distribution and each caption's text embedding after the first epoch (model.cache_latents=true
model.cache_text=true, as the published reference precomputes both) and reports the last of 3
epochs, when every batch skips the VAE and the text encoder.

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


def last_epoch_rate(metrics_csv: Path) -> dict:
    """The last epoch's train/samples_per_s and train/step_time_s from the run's metrics.csv."""
    with open(metrics_csv) as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/samples_per_s")]
    return {
        "samples_per_s": float(rows[-1]["train/samples_per_s"]),
        "step_time_s": float(rows[-1]["train/step_time_s"]),
        "epoch": rows[-1]["epoch"],
    }


def run(workers: int, gpu: bool, epochs: int, latents: str = "encoded") -> dict:
    per_worker = 8 if gpu else 4
    cached = latents == "cached"
    if cached:
        epochs = max(epochs, 3)  # the first epoch fills the cache; the last runs from it
    overrides = [
        "experiment=sd_tiny",
        "logger=csv",
        f"scale.num_workers={workers}",
        f"data.batch_size={per_worker * workers}",
        f"trainer.max_epochs={epochs}",
        "model.export_pipeline=false",
        "model.sample_prompts=[]",
        # One step per worker per batch: a fixed number of steps whatever the worker count.
        f"data.num_samples={per_worker * workers * (50 if gpu else 40)}",
        f"model.cache_latents={str(cached).lower()}",
        f"model.cache_text={str(cached).lower()}",
    ]
    if gpu:
        # One checkpoint, at the end: full-size SD's weights and AdamW state are ~12 GB a save,
        # which would cost disk and time the figures do not measure.
        overrides += FULL_SIZE + ["checkpoint.every_n_epochs=1000", "checkpoint.num_to_keep=1"]
    with tempfile.TemporaryDirectory() as outputs:
        done = subprocess.run(
            [sys.executable, "train.py", *overrides, f"paths.outputs={outputs}"], cwd=REPO, capture_output=True, text=True
        )
        if done.returncode:
            sys.exit(f"train.py {' '.join(overrides)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        (summary_file,) = Path(outputs).glob("runs/*/*/summary.json")
        summary = json.loads(summary_file.read_text())
        throughput = dict(summary["throughput"])
        if cached:
            throughput = last_epoch_rate(summary_file.parent / "metrics.csv")
            throughput["samples_per_s_per_worker"] = throughput["samples_per_s"] / workers
    return {
        "workers": workers,
        "latents": f"latents and text cached (epoch {int(throughput['epoch']) + 1} of {epochs})" if cached else "encoded each step",
        "steps_per_s": 1 / throughput["step_time_s"],
        "images_per_s": throughput["samples_per_s"],
        "images_per_s_per_worker": throughput["samples_per_s_per_worker"],
        "peak_memory_gib": summary["peak_memory_bytes"] / 2**30,
        "steps": summary["global_step"],
    }


def latents_kinds(text: str) -> str:
    """--latents: checked as the flag is read."""
    if not text or set(text.split(",")) - {"encoded", "cached"}:
        raise argparse.ArgumentTypeError(f"takes encoded and/or cached, not {text!r}")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="full-size SD 2 base at 256 px, bf16-mixed, on GPU workers")
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="worker counts (CPU: 1 2; GPU: 1)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--latents",
        default="encoded",
        type=latents_kinds,
        help="comma-separated: encoded (the VAE and text encoder on every batch), cached (model.cache_latents=true "
        "model.cache_text=true, the last of 3 epochs)",
    )
    args = parser.parse_args()
    kinds = args.latents.split(",")
    workers = args.workers or ([1] if args.gpu else [1, 2])
    what = "SD 2 base sizes, 256 px, bf16-mixed, 8 images/GPU" if args.gpu else "sd_tiny, 32 px, 4 images/worker, 1 CPU thread each"
    memory = "peak CUDA GiB (rank 0)" if args.gpu else "peak RSS GiB (rank 0)"
    print(f"{what}\n")
    print(f"| workers | latents | steps/s | images/s | images/s per worker | {memory} |")
    print("|---:|---|---:|---:|---:|---:|")
    for count in workers:
        for kind in kinds:
            r = run(count, args.gpu, args.epochs, kind)
            print(
                f"| {count} | {r['latents']} | {r['steps_per_s']:.2f} | {r['images_per_s']:.1f} | {r['images_per_s_per_worker']:.1f} "
                f"| {r['peak_memory_gib']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
