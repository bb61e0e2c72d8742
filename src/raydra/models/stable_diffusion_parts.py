"""The parts of a Stable Diffusion model (tokenizer, text encoder, VAE, UNet, noise scheduler),
either loaded from a diffusers layout folder or built from small configs with nothing downloaded.

Building from configs is what `model=sd_tiny` does (a CPU-sized model) and what the GPU benchmark
does with full-size configs: the CLIP tokenizer's byte-level BPE vocabulary is trained on the
run's own captions with the `tokenizers` library.
"""

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

from raydra.errors import RaydraError

COMPONENTS = ("unet", "vae", "text_encoder", "tokenizer", "scheduler")
BOS, EOS = "<|startoftext|>", "<|endoftext|>"
# CLIPTokenizer's own split: special tokens, contractions, letter runs, single digits, punctuation runs.
CLIP_SPLIT = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


def train_caption_bpe(captions: Sequence[str], vocab_size: int) -> Tuple[Dict[str, int], List[List[str]]]:
    """A CLIP-compatible byte-level BPE (vocab, merges) learned from `captions`.

    Its pre-processing matches CLIPTokenizer's, so CLIPTokenizer(vocab, merges) tokenizes exactly
    as training saw. Every byte and every byte ending a word is in the vocabulary, so a prompt
    with words the captions never had still encodes without unknown tokens.
    """
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(end_of_word_suffix="</w>", continuing_subword_prefix="", unk_token=EOS))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(CLIP_SPLIT), behavior="removed", invert=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=alphabet,
        end_of_word_suffix="</w>",
        min_frequency=1,
        show_progress=False,
    )
    tokenizer.train_from_iterator(sorted(set(captions)), trainer)
    model = json.loads(tokenizer.to_str())["model"]
    vocab: Dict[str, int] = dict(model["vocab"])
    for token in [c for c in alphabet] + [c + "</w>" for c in alphabet]:
        vocab.setdefault(token, len(vocab))
    return vocab, [list(pair) for pair in model["merges"]]


def clip_tokenizer(vocab: Dict[str, int], merges: Sequence[Sequence[str]], max_length: int) -> CLIPTokenizer:
    # transformers 5 takes merges as pairs; "a b" strings are rejected.
    tokenizer = CLIPTokenizer(vocab=dict(vocab), merges=[tuple(pair) for pair in merges])
    tokenizer.model_max_length = max_length
    return tokenizer


def build_parts(configs: Dict[str, Any], tokenizer: CLIPTokenizer) -> Dict[str, Any]:
    """Text encoder, VAE, UNet and DDPM scheduler from the `model.parts` configs (random weights)."""
    text = dict(configs["text_encoder"])
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            max_position_embeddings=tokenizer.model_max_length,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **text,
        )
    )
    vae = AutoencoderKL(**configs["vae"])
    unet = unet_from(configs)
    scheduler = DDPMScheduler(**configs["scheduler"])
    return {"tokenizer": tokenizer, "text_encoder": text_encoder, "vae": vae, "unet": unet, "scheduler": scheduler}


def unet_from(configs: Dict[str, Any]) -> UNet2DConditionModel:
    """The UNet of the `model.parts` configs (random weights), attending to the text encoder's
    hidden states. Built under `torch.device("meta")` it holds shapes only: benchmarks/sd.py counts
    its FLOPs that way."""
    text_width = CLIPTextConfig(**configs["text_encoder"]).hidden_size  # CLIP's default where the config has none
    return UNet2DConditionModel(cross_attention_dim=text_width, **configs["unet"])


def fit_vae(vae: AutoencoderKL, images: torch.Tensor, steps: int, batch_size: int, lr: float, seed: int = 0) -> None:
    """Fit a VAE built from configs as an autoencoder on uint8 `images` before it is frozen.

    A random VAE is a fixed random code: the UNet's loss still falls, but decoded samples are noise.
    A few hundred steps on the training images make samples pictures one can judge (reconstruction
    MSE plus Stable Diffusion's tiny KL weight, 1e-6).
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(vae.parameters(), lr=lr)
    vae.train().requires_grad_(True)
    with torch.enable_grad():
        for _ in range(steps):
            index = torch.randint(0, len(images), (batch_size,), generator=generator).to(images.device)
            pixels = images[index].float() / 127.5 - 1
            posterior = vae.encode(pixels).latent_dist
            loss = F.mse_loss(vae.decode(posterior.sample()).sample, pixels) + 1e-6 * posterior.kl().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    vae.eval()


def load_parts(pretrained: str, from_scratch: bool) -> Dict[str, Any]:
    """The five parts of a diffusers Stable Diffusion layout (a local folder, or a hub id already in
    the local cache); with `from_scratch` the UNet keeps only its config and starts from random weights."""
    folder = Path(pretrained).expanduser()
    if folder.is_dir():
        missing = [name for name in COMPONENTS if not (folder / name).is_dir()]
        if missing:
            raise RaydraError(
                f"model.pretrained={pretrained} lacks the subfolder(s) {', '.join(missing)}; point it at a diffusers "
                "Stable Diffusion folder (unet/ vae/ text_encoder/ tokenizer/ scheduler/), e.g. one written by "
                "save_pretrained."
            )
        source = str(folder)
    elif pretrained.startswith((".", "/", "~")):
        raise RaydraError(f"model.pretrained={pretrained} is not a folder; point it at a diffusers Stable Diffusion folder.")
    else:
        source = pretrained
    try:
        parts = {
            "tokenizer": CLIPTokenizer.from_pretrained(source, subfolder="tokenizer"),
            "text_encoder": CLIPTextModel.from_pretrained(source, subfolder="text_encoder"),
            "vae": AutoencoderKL.from_pretrained(source, subfolder="vae"),
            "scheduler": DDPMScheduler.from_pretrained(source, subfolder="scheduler"),
        }
        if from_scratch:
            parts["unet"] = UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(source, subfolder="unet"))
        else:
            parts["unet"] = UNet2DConditionModel.from_pretrained(source, subfolder="unet")
    except OSError as error:
        raise RaydraError(
            f"model.pretrained={pretrained} could not be loaded ({str(error).splitlines()[0]}); give a local diffusers "
            "folder, or a hub id already in the local Hugging Face cache (raydra never downloads)."
        ) from None
    return parts
