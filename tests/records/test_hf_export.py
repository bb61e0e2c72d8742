"""A ViT run's Hugging Face export (`<run dir>/hf/`, raydra.records.hf_export): what the module describes and
the driver writes from a checkpoint loads with transformers' Auto classes, and predicts what the
module predicts on the same images; the real run's export against raydra.load is
test_local_mode's."""

import json

import numpy as np
import pytest
import torch
from helpers import digits_test_images, hf_loaded, tiny_vit

from raydra import storage
from raydra.data.digits import DigitsDataModule
from raydra.records import hf_export

DIGITS = [str(digit) for digit in range(10)]


@pytest.mark.parametrize("conv_stem", [[8, 8], []], ids=["conv_stem", "plain"])
def test_a_vit_export_loads_with_transformers_and_predicts_what_the_module_predicts(tmp_path, conv_stem):
    torch.manual_seed(0)
    module = tiny_vit(conv_stem=conv_stem, hidden_size=16, num_layers=1, num_heads=2, mlp_size=32).eval()
    # As a run's checkpoint holds the weights (a Lightning checkpoint's state_dict).
    checkpoint = tmp_path / "checkpoint.ckpt"
    torch.save({"state_dict": module.state_dict()}, checkpoint)
    folder = hf_export.write(module.hf_export(DigitsDataModule.image_inputs({})), str(checkpoint), tmp_path)

    assert folder == tmp_path / "hf" and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    code = {"configuration_raydra_vit.py", "modeling_raydra_vit.py"} if conv_stem else set()
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors", "preprocessor_config.json"} | code
    # A plain ViT is Hugging Face's own class and needs no code of the export's; a conv stem is
    # raydra's, which loads only when trusted.
    if conv_stem:
        with pytest.raises(ValueError, match="trust_remote_code"):
            hf_loaded(folder, trust_remote_code=False)
    model, processor = hf_loaded(folder, trust_remote_code=bool(conv_stem))
    assert type(model).__name__ == ("RaydraViTForImageClassification" if conv_stem else "ViTForImageClassification")
    assert model.config.id2label == dict(enumerate(DIGITS)) and model.config.label2id == {name: i for i, name in enumerate(DIGITS)}

    # scikit-learn's own images through the exported processor are the batch the module saw.
    seen, raw = digits_test_images()
    pixels = processor(images=raw[:, None], return_tensors="pt")["pixel_values"]
    assert torch.equal(pixels, seen)
    with torch.no_grad():
        theirs, ours = model(pixel_values=pixels).logits, module(seen)
    assert torch.allclose(theirs, ours, atol=1e-5) and torch.equal(theirs.argmax(-1), ours.argmax(-1))


def test_the_export_reads_a_sharded_checkpoint_replaces_an_earlier_one_and_reaches_storage(tmp_path):
    """FSDP's layout (shards beside Lightning's meta.pt) read without building the module; a second
    export replaces the first whole; the storage copy loads as the run directory's does."""
    from raydra.private_apis.lightning import save_distributed_checkpoint

    torch.manual_seed(0)
    module = tiny_vit(conv_stem=[4], hidden_size=16, num_layers=1, num_heads=2, mlp_size=32).eval()
    sharded = tmp_path / "checkpoint.ckpt"
    sharded.mkdir()
    save_distributed_checkpoint({"state_dict": module.state_dict()}, sharded)
    torch.save({"epoch": 0}, sharded / "meta.pt")
    described = module.hf_export(DigitsDataModule.image_inputs({}))
    run_dir, home = tmp_path / "run", tmp_path / "storage" / "runs" / "r"
    run_dir.mkdir()
    (run_dir / "hf").mkdir()
    (run_dir / "hf" / "stale.txt").write_text("an earlier export's")
    hf_export.write(described, str(sharded), run_dir, str(home))

    assert not (run_dir / "hf" / "stale.txt").exists() and sorted(p.name for p in run_dir.iterdir()) == ["hf"]
    assert storage.list_files(storage.join(str(home), "hf")) == sorted(p.name for p in (run_dir / "hf").iterdir())
    seen, _ = digits_test_images()
    for folder in (run_dir / "hf", home / "hf"):
        model, _ = hf_loaded(folder, trust_remote_code=True)
        with torch.no_grad():
            assert torch.allclose(model(pixel_values=seen).logits, module(seen), atol=1e-5)
    assert json.loads((home / "hf" / "config.json").read_text())["conv_stem"] == [4]


def test_export_hf_false_exports_nothing_and_a_data_module_that_says_nothing_leaves_the_processor_out(tmp_path, caplog):
    assert tiny_vit(export_hf=False).hf_export(DigitsDataModule.image_inputs({})) is None
    module = tiny_vit(conv_stem=[], hidden_size=16, num_layers=1, num_heads=2, mlp_size=32).eval()
    checkpoint = tmp_path / "checkpoint.ckpt"
    torch.save({"state_dict": module.state_dict()}, checkpoint)
    with caplog.at_level("INFO", logger="raydra"):
        folder = hf_export.write(module.hf_export(None), str(checkpoint), tmp_path)
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors"}
    assert "has no preprocessor_config.json: the run's data module does not say how it prepares its images" in caplog.text
    from transformers import AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(folder).eval()
    assert model.config.id2label[0] == "LABEL_0"  # no class names: Hugging Face's own
    images = torch.from_numpy(np.random.default_rng(0).normal(size=(4, 1, 8, 8)).astype(np.float32))
    with torch.no_grad():
        assert torch.allclose(model(pixel_values=images).logits, module(images), atol=1e-5)
