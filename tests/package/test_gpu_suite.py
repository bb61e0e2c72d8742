"""The GPU suite (benchmarks/gpu_suite.py) and its wheel preparation (benchmarks/gpu_wheels.py),
checked without a GPU, so the suite cannot rot between GPU loans: the dry run lists every step with
its command and resolves its flags and imports; a missing flag or script fails it; the suite runs
steps in order within a call's time, kills a step at its budget, resumes in the next call and keeps
what it brings back within the device tool's 8 files; the call planner refuses what does not fit."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import gpu  # noqa: E402
import gpu_suite  # noqa: E402
import gpu_wheels  # noqa: E402

MIB = 2**20


def test_dry_run_lists_every_step_with_its_command_and_its_imports_resolve():
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_suite.py", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**gpu_suite.os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # What the issue asks of the plan: the most valuable first, the gpu tests before any figure.
    assert [s.name for s in gpu_suite.STEPS if s.planned] == ["tests", "vit-seed002", "sd-cached"]
    for step in gpu_suite.STEPS:
        assert f"{step.name} ({step.budget_s} s): python3 {gpu_suite.shlex.join(step.argv)}" in out
        for module in step.imports:
            assert f"import {module}: here" in out or f"import {module}: in the wheel set" in out
    assert "MISSING" not in out and "PROBLEM" not in out and out.rstrip().endswith("dry run: ok")
    assert "collects 0 " not in out
    assert gpu_suite.STEPS[0].argv[:4] == ["-m", "pytest", "-m", "gpu"]
    # A 15-minute loan leaves 12 of them for commands once the machine has started: the whole plan,
    # the wheels' staging and install included, fits them in at most 3 calls of the default budget,
    # and the dry run prints it as the calls will run it.
    commands = gpu_suite.plan(gpu_suite.STEPS, 570, wheel_calls=2)
    assert len(commands) <= 3 and sum(c.seconds for c in commands) <= 12 * 60
    assert [c.carry for c in commands[:2]] == [[".gpu_wheels/call1"], [".gpu_wheels/call2"]] and not commands[0].steps
    assert [s.name for c in commands for s in c.steps] == [s.name for s in gpu_suite.STEPS if s.planned]
    assert all(c.seconds <= 570 for c in commands)
    assert "\n".join(gpu_suite.describe(gpu_suite.plan(gpu_suite.STEPS, 570, gpu_suite.wheel_calls()))) in out


def test_the_plan_lays_steps_out_as_the_calls_run_them_and_refuses_a_step_no_call_holds():
    Step = gpu_suite.Step
    steps = [Step("a", "", 300, []), Step("b", "", 300, []), Step("c", "", 200, []), Step("later", "", 50, [], planned=False)]
    commands = gpu_suite.plan(steps, 570, wheel_calls=2)
    # a and c fill the second call (c leapfrogs b, which no longer fits), b goes to the third; the
    # step outside the plan is in none.
    assert [[s.name for s in c.steps] for c in commands] == [[], ["a", "c"], ["b"]]
    assert [c.seconds for c in commands] == [gpu_suite.STAGE_S, gpu_suite.INSTALL_S + 500, 300]
    # One call carries every wheel: it stages them all and installs.
    assert gpu_suite.plan(steps[:1], 570, wheel_calls=1)[0].seconds == gpu_suite.STAGE_S + gpu_suite.INSTALL_S + 300
    with pytest.raises(ValueError, match="step a's budget of 300 s is more than a call's 250 s"):
        gpu_suite.plan(steps, 250, wheel_calls=2)


def test_dry_run_fails_when_a_flag_a_value_or_a_script_goes(monkeypatch, capsys):
    Step = gpu_suite.Step
    monkeypatch.setattr(
        gpu_suite,
        "STEPS",
        [
            Step("gone-flag", "", 1, ["benchmarks/sd.py", "--gpu", "--no-such-flag"]),
            Step("bad-value", "", 1, ["benchmarks/strategies.py", "--only", "zero4"]),
            Step("gone-script", "", 1, ["benchmarks/no_such_benchmark.py"]),
            Step("gone-import", "", 1, ["benchmarks/sd.py"], ["no_such_module_here"]),
            Step("over-the-loan", "", 560, ["benchmarks/sd.py"]),
            Step("more", "", 300, ["benchmarks/sd.py"]),
        ],
    )
    assert gpu_suite.dry_run() == 1
    problems = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("PROBLEM")]
    assert len(problems) == 5, problems
    assert "--no-such-flag" in problems[0]
    assert "zero4" in problems[1]
    assert "does not exist" in problems[2]
    assert "no_such_module_here" in problems[3]
    assert "a loan leaves 3 commands and 720 s" in problems[4]


def test_run_keeps_order_kills_at_the_budget_resumes_and_brings_back_at_most_8_files(tmp_path, monkeypatch):
    Step = gpu_suite.Step
    table = "print('what ran'); print(); print('| a | b |'); print('|---|---|'); print('| 1 | 2 |')"
    steps = [
        Step("first", "a table", 20, ["-c", table]),
        Step("slow", "killed at its budget", 2, ["-c", "import time; print('| partial |', flush=True); time.sleep(60)"]),
        Step("big", "does not fit this call", 1000, ["-c", table]),
        Step("fails", "exits 3", 20, ["-c", "import sys; sys.exit(3)"]),
        Step("extra", "outside the plan", 20, ["-c", table], planned=False),
    ]
    monkeypatch.setattr(gpu_suite, "STEPS", steps)
    monkeypatch.setattr(gpu_suite, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(gpu_suite, "SITE", tmp_path / "site")
    monkeypatch.setattr(gpu_suite, "versions", lambda: "device: none (a test)")
    monkeypatch.setattr(gpu_suite, "RUNS_TEMP", tmp_path / "temp")
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.md").write_text("from the call before")
    monkeypatch.setenv("OUT", str(out))
    started = gpu_suite.time.time()
    gpu_suite.run([], call_budget=200, started=started)
    results = {s.name: json.loads((tmp_path / "results" / f"{s.name}.json").read_text()) for s in steps if s.name not in ("big", "extra")}
    assert results["first"]["status"] == "done"
    assert results["slow"]["status"] == "killed at its budget of 2 s" and results["slow"]["wall_s"] < 30
    assert results["fails"]["status"].startswith("failed (exit 3)")
    assert not (tmp_path / "results" / "big.json").exists()  # left for the next call
    assert not (tmp_path / "results" / "extra.json").exists()  # outside the plan: only when named
    suite = (out / "suite.md").read_text()
    assert "device: none (a test)" in suite and "| big | pending |" in suite and "extra" not in suite
    assert "| 1 | 2 |" in suite and "| partial |" in suite  # the killed step's rows so far
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["suite.md", *(f"{n}.{e}" for n in ("first", "slow", "fails") for e in ("md", "log"))]
    )

    # The next call: only what is pending runs, and the index keeps every table.
    monkeypatch.setattr(steps[2], "budget_s", 20)
    gpu_suite.run([], call_budget=200, started=gpu_suite.time.time())
    assert json.loads((tmp_path / "results" / "big.json").read_text())["status"] == "done"
    assert sorted(p.name for p in out.iterdir()) == ["big.log", "big.md", "suite.md"]
    suite = (out / "suite.md").read_text()
    assert "pending" not in suite and suite.splitlines().count("| 1 | 2 |") == 2
    assert not (tmp_path / "results" / "extra.json").exists()

    # At most 8 files come back, whatever one call ran: suite.md and the newest steps first.
    gpu_suite.run(["first", "big", "fails", "slow", "extra"], call_budget=200, started=gpu_suite.time.time())
    names = {p.name for p in out.iterdir()}
    assert len(names) <= gpu_suite.OUT_FILES and "suite.md" in names and "extra.md" in names
    assert "| extra | done |" in (out / "suite.md").read_text()


def test_a_step_ended_unfinished_says_what_its_newest_train_run_had_reached(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_suite, "RUNS_TEMP", tmp_path)
    started = gpu_suite.time.time()
    assert "No train.py run" in gpu_suite.where_it_stopped(started)
    runs = []
    for name, status in (("tmpold/runs/d/earlier", "completed"), ("tmpnew/runs/d/killed", "interrupted")):
        run = tmp_path / name
        run.mkdir(parents=True)
        record = {"status": status, "startup": {"phases": {"ray_init_s": 41.5}}, "global_step": 7, "metrics": {"x": 1}}
        (run / "summary.json").write_text(json.dumps(record))
        (run / "driver.log").write_text("".join(f"line {i}\n" for i in range(30)))
        runs.append(run)
    gpu_suite.os.utime(runs[0] / "summary.json", (started - 60, started - 60))  # a run of an earlier step
    said = gpu_suite.where_it_stopped(started)
    assert "killed, 1 run(s) in this step" in said and '"interrupted"' in said and '"ray_init_s": 41.5' in said
    assert '"global_step": 7' in said and "metrics" not in said
    assert "line 29" in said and "line 19" not in said  # driver.log's last 10 lines


def test_the_call_planner_fits_splits_and_refuses():
    # Everything in one call where it fits.
    plan = gpu_wheels.plan_calls({"a.whl": 40 * MIB, "b.whl": 10 * MIB}, tree_bytes=2 * MIB)
    assert plan == [[("a.whl", None, 0, 40 * MIB), ("b.whl", None, 0, 10 * MIB)]]
    # Two calls, largest first, and each call's share with the tree within 64 MiB.
    files = {"ray.whl": 45 * MIB, "diffusers.whl": 6 * MIB, "small.whl": 5 * MIB, "more.whl": 15 * MIB}
    plan = gpu_wheels.plan_calls(files, tree_bytes=MIB)
    assert len(plan) == 2 and plan[0][0][0] == "ray.whl"
    assert all(sum(length for *_, length in call) + MIB <= gpu_wheels.LIMIT - gpu_wheels.MARGIN for call in plan)
    assert sorted(name for call in plan for name, *_ in call) == sorted(files)
    # A file larger than a call's room (Ray's 75.6 MiB wheel untrimmed) travels in parts that add up.
    plan = gpu_wheels.plan_calls({"ray.whl": 76 * MIB, "x.whl": 3 * MIB}, tree_bytes=MIB)
    parts = [(part, offset, length) for call in plan for name, part, offset, length in call if name == "ray.whl"]
    assert [p for p, _, _ in parts] == [0, 1] and parts[1][1] == parts[0][2] and parts[0][2] + parts[1][2] == 76 * MIB
    # Over what two calls carry: refused in one sentence, nothing planned.
    with pytest.raises(gpu_wheels.TooLarge) as refused:
        gpu_wheels.plan_calls({"ray.whl": 76 * MIB, "wandb.whl": 20 * MIB, "torch.whl": 40 * MIB}, tree_bytes=MIB)
    message = str(refused.value)
    assert "136.0 MiB" in message and "carry fewer packages" in message and message.count(". ") == 0
    with pytest.raises(gpu_wheels.TooLarge, match="the working tree alone is 70.0 MiB"):
        gpu_wheels.plan_calls({"a.whl": MIB}, tree_bytes=70 * MIB)


def test_the_tree_that_travels_is_measured_and_the_wheels_folder_is_ignored():
    size = gpu_wheels.tree_size()
    assert 0 < size < 32 * MIB  # every call carries it: it must leave room for the wheels
    ignored = subprocess.run(["git", "check-ignore", "-q", ".gpu_wheels/call1/x.whl"], cwd=REPO)
    assert ignored.returncode == 0, ".gpu_wheels/ must be ignored, or the wheels would travel in every call"


def test_the_wheel_set_leaves_out_what_the_gpu_image_has_and_pins_the_rest():
    # The dev venv's versions, the ones the suite passes with; omegaconf 2.4 would break hydra-core 1.3.
    pins = gpu_wheels.dev_pins()
    assert pins["omegaconf"].startswith("2.3.") and pins["ray"].startswith("2.60.")
    assert {"torch", "lightning", "numpy", "transformers"} <= gpu_wheels.IMAGE
    assert not {"ray", "hydra-core", "omegaconf", "diffusers", "deepspeed"} & gpu_wheels.IMAGE
    assert gpu_wheels.SDIST_ONLY == {"antlr4-python3-runtime", "deepspeed"}


def test_the_wheel_set_carries_the_aiohttp_rays_default_extra_needs_over_the_images_older_one(monkeypatch):
    """install.log on the H200 said `unmet ray needs aiohttp>=3.14.4; extra == "default": found 3.14.3`."""
    from importlib import metadata

    from packaging.requirements import Requirement

    monkeypatch.setattr(gpu_wheels, "IMAGE", set(gpu_wheels.IMAGE))  # roots_for takes them out of it
    roots = gpu_wheels.roots_for(with_wandb=False, also=[])
    assert {"aiohttp", "yarl"} <= set(roots) and not {"aiohttp", "yarl"} & gpu_wheels.IMAGE
    pins = gpu_wheels.dev_pins()

    def needs(package: str, name: str, extra: str = "") -> Requirement:
        wanted = [Requirement(r) for r in metadata.requires(package)]
        return next(r for r in wanted if r.name == name and (r.marker is None or r.marker.evaluate({"extra": extra})))

    aiohttp = needs("ray", "aiohttp", extra="default")
    assert aiohttp.specifier.contains(pins["aiohttp"]) and not aiohttp.specifier.contains(gpu_wheels.IMAGE_VERSIONS["aiohttp"])
    assert needs("aiohttp", "yarl").specifier.contains(pins["yarl"])


def _wheel(folder: Path, name: str, body: str, requires: str = "") -> Path:
    """A minimal pure-Python wheel, written by hand (no download, no build)."""
    import zipfile

    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + (f"Requires-Dist: {requires}\n" if requires else "")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", body)
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def test_stage_and_install_across_two_calls_reassemble_verify_and_install(tmp_path, monkeypatch, capsys):
    """What the GPU machine does with the carried wheels, on this machine with two small wheels, one
    split across the two calls: nothing installs until both calls' files are there; then the parts
    are joined, checked against the manifest's sha256, installed, imported and their needs checked."""
    wheels = tmp_path / "prepared"
    wheels.mkdir()
    big = _wheel(wheels, "bigpkg", "VALUE = 42\n" + "# padding\n" * 20000, requires="smallpkg>=2")
    small = _wheel(wheels, "smallpkg", "")
    files = {p.name: p.stat().st_size for p in (big, small)}
    # A call small enough that the big wheel must travel in two parts.
    room = big.stat().st_size // 2 + 4096
    plan = gpu_wheels.plan_calls(files, tree_bytes=0, limit=room, margin=0)
    assert any(part is not None for call in plan for _, part, _, _ in call)
    calls = [
        [
            {"file": n, "part": p, "offset": o, "length": ln, "name": n if p is None else f"{n}.part{p}", "sha256": None}
            for n, p, o, ln in call
        ]
        for call in plan
    ]
    manifest = {"roots": ["bigpkg"], "calls": calls, "wheels": {n: {"sha256": gpu_wheels.sha256(wheels / n)} for n in files}}
    carried = tmp_path / "repo" / ".gpu_wheels"
    for number, items in enumerate(calls, start=1):
        folder = carried / f"call{number}"
        folder.mkdir(parents=True)
        for item in items:
            data = (wheels / item["file"]).read_bytes()[item["offset"] : item["offset"] + item["length"]]
            (folder / item["name"]).write_bytes(data)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    for name, value in {
        "CARRIED": carried,
        "WHEELS": tmp_path / "work" / "wheels",
        "SITE": tmp_path / "work" / "site",
        "RESULTS": tmp_path / "work" / "results",
        "IMPORT_CHECK": ["bigpkg"],
        "REQUIRED": {"bigpkg"},
    }.items():
        monkeypatch.setattr(gpu_suite, name, value)
    call2 = carried / "call2"
    call2.rename(tmp_path / "later")  # the first call carries call1 only
    gpu_suite.stage()
    assert gpu_suite.install() is False
    assert "carry .gpu_wheels/call2" in capsys.readouterr().out
    (tmp_path / "later").rename(call2)  # the second call
    gpu_suite.stage()
    assert gpu_suite.install() is True
    out = capsys.readouterr().out
    assert "reassembled bigpkg-1.0-py3-none-any.whl from 2 parts" in out
    assert "install check: unmet bigpkg needs smallpkg>=2: found 1.0" in out  # a need the installed set does not meet, named
    assert (tmp_path / "work" / "site" / "bigpkg" / "__init__.py").is_file()
    assert gpu_suite.install() is True and "already installed" in capsys.readouterr().out
    # A part that arrived damaged is refused by its sha256, not installed.
    (tmp_path / "work" / "site" / ".installed.json").unlink()
    (tmp_path / "work" / "wheels" / "bigpkg-1.0-py3-none-any.whl").write_bytes(b"damaged")
    with pytest.raises(SystemExit, match="sha256 differs from the manifest for bigpkg"):
        gpu_suite.install()


def test_the_tests_steps_outcomes_come_from_pytests_summary_or_if_killed_from_its_lines_so_far():
    tests = gpu_suite.STEPS[0]
    so_far = "tests/test_a.py::test_x PASSED    [ 50%]\ntests/test_a.py::test_y[ddp] FAILED    [100%]\n"
    assert gpu_suite.table_of(tests, so_far) == "- tests/test_a.py::test_x PASSED\n- tests/test_a.py::test_y[ddp] FAILED"
    whole = (
        so_far
        + "=== short test summary info ===\nPASSED tests/test_a.py::test_x\nFAILED tests/test_a.py::test_y[ddp] - Err\n=== 1 failed, 1 passed in 3.2s ===\n"
    )
    assert gpu_suite.table_of(tests, whole).splitlines() == [
        "- PASSED tests/test_a.py::test_x",
        "- FAILED tests/test_a.py::test_y[ddp] - Err",
        "- 1 failed, 1 passed in 3.2s",
    ]


def test_the_vit_benchmarks_two_sides_train_the_same_model():
    """raydra's side kept model/vit.yaml's conv stem, which the plain loop has not: compiled, raydra
    measured 0.65x of a smaller model. Compared on the seed 002 workload's weights, here on CPU."""
    from helpers import composed
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    workload = gpu.WORKLOADS["seed002"]
    model_config = OmegaConf.to_container(composed(*gpu.raydra_overrides(workload, "bf16-mixed", True, steps=60)).model, resolve=True)
    model_config.pop("shard_blocks")  # read by strategy=fsdp, not passed to the module (as the worker does)
    import torch

    with torch.device("meta"):  # shapes without allocating or initialising ~22 M weights twice
        raydra_side, plain_side = instantiate(model_config), gpu.plain_network(workload)
    plain = {key: tuple(value.shape) for key, value in plain_side.state_dict().items()}
    assert {key: tuple(value.shape) for key, value in raydra_side.state_dict().items()} == {
        f"net.{key}": shape for key, shape in plain.items()
    }


def test_the_sd_benchmark_sweeps_the_batch_to_the_largest_that_fits_and_puts_mfu_beside_images_per_s():
    """benchmarks/sd.py's sweep and table with a stand-in for its train.py runs (each is minutes of
    a GPU): the flags as read, the doubling to the first batch out of CUDA memory, and the MFU cell."""
    import sd

    args = sd.parse(["--gpu", "--latents", "cached"])
    assert args.batches == [16, 64, 128, "max"] and args.steps == 50 and args.workers == [1]
    args = sd.parse([])
    assert args.batches == [4] and args.workers == [1, 2]
    assert sd.parse(["--gpu", "--batches", "64", "--steps", "20"]).batches == [64]
    for wrong in (["--batches", "max"], ["--gpu", "--batches", "16,0"], ["--gpu", "--batches", "big"]):
        with pytest.raises(SystemExit):
            sd.parse(wrong)  # max needs a GPU to run out of; counts are positive

    tried = []

    def measure(batch):
        tried.append(batch)
        if batch > 300:  # what fits on the stand-in GPU
            raise sd.OutOfMemory(batch)
        return {"batch": batch}

    rows, fitted, failed = sd.sweep([128, 16, "max", 64], measure)
    assert tried == [16, 64, 128, 256, 512] and [r["batch"] for r in rows] == [16, 64, 128, 256]
    assert (fitted, failed) == (256, 512)
    tried.clear()
    assert sd.sweep([16, 512, 1024], measure)[1:] == (16, 512) and tried == [16, 512]  # larger would not fit either
    tried.clear()
    assert sd.sweep(["max"], measure)[1:] == (256, 512) and tried == [sd.MAX_FROM, 32, 64, 128, 256, 512]
    assert sd.is_out_of_memory("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")

    # 256 images/s on one GPU at 539 GFLOP an image (SD 2 base's UNet at 256 px) is 138 TFLOP/s,
    # 13.9% of an H100's 989.4 dense bf16 TFLOP/s; on CPU, no peak and no MFU.
    row = {"batch": 64, "workers": 1, "latents": "cached", "steps_per_s": 4.0, "images_per_s": 256.0, "images_per_s_per_worker": 256.0}
    row["peak_memory_gib"] = 40.0
    assert sd.table_row(row, 539e9, 989.4e12) == "| 64 | 1 | cached | 4.00 | 256.0 | 256.0 | 138 | 13.9% | 40.00 |"
    assert sd.table_row(row, 539e9, None).endswith("| 138 | - | 40.00 |")


def test_the_sd_benchmarks_flop_count_is_its_unets_forward_and_backward():
    """The count benchmarks/sd.py takes on the meta device is what a real step of the run's UNet
    counts (on CPU with the math attention, which the counter sees; the GPU's flash and
    memory-efficient kernels count the same), and --gpu's UNet is SD 2 base's."""
    import sd
    import torch
    from helpers import composed
    from omegaconf import OmegaConf
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from raydra.models.stable_diffusion_parts import unet_from

    overrides = sd.overrides_for(1, False, 2, "cached", 4, 40)  # sd_tiny, as `python benchmarks/sd.py` runs it
    per_image = sd.unet_flops_per_image(overrides)
    model = OmegaConf.to_container(composed(*overrides).model, resolve=True)
    unet = unet_from(model["parts"])
    latents = torch.randn(3, 4, model["resolution"] // 2, model["resolution"] // 2)
    text = torch.randn(3, model["parts"]["tokenizer"]["max_length"], model["parts"]["text_encoder"]["hidden_size"])
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        torch.nn.functional.mse_loss(unet(latents, torch.randint(0, 1000, (3,)), text).sample, torch.randn_like(latents)).backward()
    assert counter.get_total_flops() == 3 * per_image > 0

    full = OmegaConf.to_container(composed(*sd.overrides_for(1, True, 2, "cached", 64, 20)).model, resolve=True)
    with torch.device("meta"):
        assert sum(p.numel() for p in unet_from(full["parts"]).parameters()) == pytest.approx(865.9e6, rel=1e-3)
