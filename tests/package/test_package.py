"""raydra as a user installs it: the wheel built from this tree, installed into a fresh venv, composes
the default run from an empty directory, and its commands run there.

The config groups live in the repository's top-level conf/ and ship as the package raydra.conf
(pyproject.toml's package-dir); a checkout finds them beside src/, so only an installed wheel shows
whether they shipped. The fresh venv sees this environment's libraries (torch, Ray, Hydra, ...)
through a .pth file that lists the directories of its import path, less a checkout's src/: a
listed directory's own .pth files are not run, so this environment's raydra (an editable install's
import hook, or a PYTHONPATH) stays out, and the tests check that raydra and its config groups come
from the venv. No download: the wheel is built with this environment's setuptools
(--no-build-isolation) and installed with --no-index.
About 13 s on the project's shared 2-core machine (2026-11-25).
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers import REPO

# What a build never needs from the tree (and what it would write beside the sources).
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "outputs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", "wandb"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """raydra's wheel, built from a copy of the tree (a build writes build/ and *.egg-info beside
    the sources it builds)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "raydra"
    shutil.copytree(REPO, source, ignore=NOT_SOURCES)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(root), str(source)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = root.glob("raydra-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; this environment's libraries visible, its raydra not."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (Path(site_packages) / "this-environments-libraries.pth").write_text("".join(f"{path}\n" for path in libraries()))
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=300
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv


def libraries() -> list:
    """This interpreter's import path less any source tree's src/ (PYTHONPATH, or a static editable
    install's .pth line): the wheel's raydra would come first anyway (the venv's own site-packages
    leads its path), but a checkout must not even be there to fall back on. An editable install's
    import hook is run by a .pth file, and a listed directory's .pth files are not run."""

    def source_tree(entry: Path) -> bool:
        return (entry / "raydra" / "__init__.py").is_file() and (entry.parent / "conf" / "train.yaml").is_file()

    return [entry for entry in dict.fromkeys(sys.path) if entry and Path(entry).is_dir() and not source_tree(Path(entry))]


def run_in(venv: Path, cwd: Path, *command: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RAY_ADDRESS")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1", HYDRA_FULL_ERROR="1")
    cwd.mkdir(exist_ok=True)
    return subprocess.run(list(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_holds_every_module_of_src_and_every_file_of_conf(wheel):
    """The packages pyproject.toml lists (setuptools cannot discover a subpackage mapped elsewhere)
    are the tree's: a package added under src/ and not listed, or a file of conf/ left out, fails here."""
    tree = {
        path.relative_to(REPO / "src").as_posix()
        for path in (REPO / "src").rglob("*")
        if path.is_file() and not {"__pycache__"} & set(path.parts) and ".egg-info" not in str(path) and path.suffix != ".pyc"
    }
    tree |= {
        "raydra/conf/" + path.relative_to(REPO / "conf").as_posix()
        for path in (REPO / "conf").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in name}
    assert shipped == tree
    assert "raydra/conf/train.yaml" in shipped and "raydra/conf/model/vit.yaml" in shipped


def test_the_installed_wheel_composes_the_default_run_from_an_empty_directory(venv, tmp_path):
    empty = tmp_path / "empty"
    where = run_in(
        venv, empty, str(venv / "bin" / "python"), "-c", "import raydra, raydra.entry; print(raydra.__file__); print(raydra.entry.CONF_DIR)"
    )
    assert where.returncode == 0, where.stderr
    module, conf = (Path(line) for line in where.stdout.split())
    assert module.is_relative_to(venv) and conf.is_relative_to(venv), where.stdout
    assert (conf / "train.yaml").is_file()

    job = run_in(venv, empty, str(venv / "bin" / "raydra"), "train", "--cfg", "job")
    assert job.returncode == 0, job.stdout + job.stderr
    cfg = yaml.safe_load(job.stdout)
    assert {"model", "data", "strategy", "scale", "trainer", "logger", "callbacks", "checkpoint", "ray"} <= set(cfg)
    assert cfg["name"] == "vit_digits"
    assert cfg["model"]["_target_"] == "raydra.models.vit.ViTClassifier"  # conf/model/vit.yaml
    assert cfg["data"]["_target_"].startswith("raydra.data.")  # conf/data/digits.yaml
    assert cfg["scale"]["num_workers"] == 2
    assert list(empty.iterdir()) == []  # --cfg job runs nothing and writes nothing


def test_python_m_raydra_composes_an_experiment_and_finds_the_launcher(venv, tmp_path):
    empty = tmp_path / "empty"
    job = run_in(venv, empty, str(venv / "bin" / "python"), "-m", "raydra", "train", "--cfg", "job", "experiment=vit_digits_smoke")
    assert job.returncode == 0, job.stdout + job.stderr
    assert yaml.safe_load(job.stdout)["name"] == "vit_digits_smoke"
    plugins = run_in(venv, empty, str(venv / "bin" / "raydra"), "train", "--info", "plugins")
    assert plugins.returncode == 0, plugins.stdout + plugins.stderr
    assert "RaydraLauncher" in plugins.stdout  # src/hydra_plugins shipped, and Hydra finds it
    usage = run_in(venv, empty, str(venv / "bin" / "raydra"), "--help")
    assert usage.returncode == 0 and "compare" in usage.stdout, usage.stderr


def test_a_runs_driver_and_a_tune_trials_process_import_neither_torch_nor_lightning():
    """The driver and each Tune trial's own process only start and watch the workers: torch and
    Lightning (~9 s of CPU here) are the workers' imports. A module-level import that pulls them in
    (a worker callback's helper imported by the trial module) slowed every trial by that much."""
    import subprocess
    import sys

    script = (
        "import sys; import raydra.entry, raydra.run.driver, raydra.sweep.trial, raydra.multirun.launcher; "
        "print(sorted(m for m in ('torch', 'lightning', 'pytorch_lightning') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
