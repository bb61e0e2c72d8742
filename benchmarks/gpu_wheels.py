"""Prepare, on this machine, the wheels a bare GPU machine lacks for benchmarks/gpu_suite.py.

    python benchmarks/gpu_wheels.py              # download and build into .gpu_wheels/, check sizes, print the carry lists
    python benchmarks/gpu_wheels.py --check      # only the size check and the carry lists, from .gpu_wheels/manifest.json
    python benchmarks/gpu_wheels.py --with-wandb # also W&B (19 MiB; the suite logs to CSV and needs none)
    python benchmarks/gpu_wheels.py --also protobuf  # carry an image package at the dev venv's version, where the
                                                     # suite's `install check: unmet` line says the image's is too old

The GPU machine (the device tool's nvidia-h100-x1 / nvidia-h200) runs Python 3.12 on x86-64 with
torch, Lightning and much else, but not Ray, Hydra, OmegaConf, diffusers or DeepSpeed, and it
reaches no package index. Each call to it carries the working tree and up to 8 ignored paths, at
most 64 MiB in all. So this script:

- walks the dependency closure of ROOTS with the dev venv's versions (the versions the test suite
  passes with; an unpinned `omegaconf` would be 2.4, which hydra-core 1.3.8 refuses), reading
  each wheel's own Requires-Dist, and leaves out what the GPU image already has (IMAGE);
- downloads manylinux x86-64 cp312 wheels, and builds the two that PyPI has as sdists only
  (antlr4-python3-runtime, pure Python; DeepSpeed with DS_BUILD_OPS=0: its CUDA ops compile
  on first use on the GPU machine, with that machine's nvcc and ninja);
- drops ray/jars from Ray's wheel: the Java workers' 31 MiB jar, which raydra never starts; that
  takes Ray from 75.6 MiB, more than a call carries, to about 45;
- plans which call carries which file: the working tree travels with every call, and what is left
  of 64 MiB (less a margin) takes wheels, largest first; a file larger than a call's room is split
  into parts that benchmarks/gpu_suite.py reassembles and checks against the manifest's sha256;
- writes .gpu_wheels/manifest.json and one folder per call (.gpu_wheels/call1, ...), each with a
  copy of the manifest, and prints each call's `carry` list, or fails with one sentence.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEST = REPO / ".gpu_wheels"
MIB = 2**20
LIMIT = 64 * MIB
# Room kept free in each call: the tree grows between the check here and the call there.
MARGIN = 2 * MIB
MAX_CALLS = 2

PYTHON_VERSION = "3.12"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
# Markers evaluated as on the GPU machine.
TARGET_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}

# What the GPU steps import and the image lacks. raydra itself runs from the tree's src/.
ROOTS = ["ray[default,train,tune]", "hydra-core", "omegaconf", "diffusers", "deepspeed"]
# Not in the dev venv (DeepSpeed runs on CUDA only): pinned here.
EXTRA_PINS = {"deepspeed": "0.19.8", "hjson": "3.1.0"}
# PyPI has no wheel for these: built here, both as pure-Python wheels.
SDIST_ONLY = {"antlr4-python3-runtime", "deepspeed"}
BUILD_ENV = {"deepspeed": {"DS_BUILD_OPS": "0", "DS_ACCELERATOR": "cuda"}}

# The GPU image's packages (the device tool's KINDS.md, 'Python packages already there', read on a
# machine running it on 2026-11-17). Not carried: carrying one would shadow the image's build of it.
IMAGE = set(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
    charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
    cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
    formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
    imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
    lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
    matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
    networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
    nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
    nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
    pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
    pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
    python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
    scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
    statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
    tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
    triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
    zipp""".split()
)
# The versions that image's pip list showed (same source): the ones a carried wheel's needs are checked against.
IMAGE_VERSIONS = {
    "accelerate": "1.15.0",
    "aiohttp": "3.14.3",  # from install.log on the H200 (2026-11-27)
    "huggingface-hub": "1.33.0",
    "numpy": "2.5.2",
    "pytorch-lightning": "2.6.6",
    "safetensors": "0.8.0",
    "tokenizers": "0.23.2",
    "torch": "2.11.0",
    "torchmetrics": "1.9.0",
    "torchvision": "0.26.0",
    "transformers": "5.17.0",
    "triton": "3.6.0",
}
# Image packages carried anyway, at the dev venv's versions, because a carried wheel needs newer:
# Ray 2.60's `default` extra needs aiohttp>=3.14.4 and the H200's image had 3.14.3 (install.log,
# 2026-11-27: `unmet ray needs aiohttp>=3.14.4; extra == "default": found 3.14.3`); aiohttp 3.14.4
# and later need yarl>=1.25.1, which that image's aiohttp did not ask of it. 2 MiB in all.
OVER_IMAGE = ["aiohttp", "yarl"]
# Trimmed from a wheel before it travels: (wheel name, path prefix inside it, why).
STRIP = [("ray", "ray/jars/", "Java workers' jar; raydra starts Python workers only")]


class TooLarge(Exception):
    """What is to travel does not fit the calls: the message is one sentence."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def plan_calls(files: dict, tree_bytes: int, limit: int = LIMIT, margin: int = MARGIN, max_calls: int = MAX_CALLS) -> list:
    """Which call carries what. files: {file name: size in bytes}; the working tree (tree_bytes)
    travels with every call. Returns one list per call of (file name, part index or None, offset,
    length): files whole where they fit, largest first into the first call with room, and a file
    larger than a call's room split into parts across calls. Raises TooLarge with one sentence."""
    room = limit - margin - tree_bytes
    if room <= 0:
        raise TooLarge(
            f"the working tree alone is {tree_bytes / MIB:.1f} MiB, which leaves no room for wheels under the {limit / MIB:.0f} MiB a call carries"
            f" ({margin / MIB:.0f} MiB kept free): ignore or move what makes it that large."
        )
    total = sum(files.values())
    if total > room * max_calls:
        raise TooLarge(
            f"the wheels come to {total / MIB:.1f} MiB and {max_calls} calls carry at most {room * max_calls / MIB:.1f} MiB of them"
            f" ({limit / MIB:.0f} MiB each, less the {tree_bytes / MIB:.1f} MiB working tree and a {margin / MIB:.0f} MiB margin): carry fewer packages."
        )
    calls = [[] for _ in range(max_calls)]
    free = [room] * max_calls
    for name, size in sorted(files.items(), key=lambda kv: (-kv[1], kv[0])):
        fits = next((i for i in range(max_calls) if free[i] >= size), None)
        if fits is not None:
            calls[fits].append((name, None, 0, size))
            free[fits] -= size
            continue
        offset, part = 0, 0
        for i in range(max_calls):
            if offset == size:
                break
            take = min(free[i], size - offset)
            if take <= 0:
                continue
            calls[i].append((name, part, offset, take))
            free[i] -= take
            offset += take
            part += 1
        if offset < size:
            raise TooLarge(
                f"{name} ({size / MIB:.1f} MiB) does not fit in what {max_calls} calls have left after the other wheels: carry fewer packages."
            )
    return [c for c in calls if c]


def tree_size(repo: Path = REPO) -> int:
    """Bytes of what every device call sends: git-tracked files, untracked files git does not
    ignore, and a shared/ folder inside the checkout, which travels ignored or not."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    paths = {repo / p for p in listed if p}
    if (repo / "shared").is_dir():
        paths |= set((repo / "shared").rglob("*"))
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def dev_pins() -> dict:
    pins = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    pins.update(EXTRA_PINS)
    return pins


def wheel_requirements(wheel: Path, extras: set) -> list:
    """The wheel's Requires-Dist that apply on the GPU machine with these extras."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(name).decode()
    wanted = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or any(req.marker.evaluate({**TARGET_ENV, "extra": e}) for e in (extras or {""})):
            wanted.append(req)
    return wanted


def wheel_name(wheel: Path) -> str:
    return canonical(wheel.name.split("-")[0])


def roots_for(with_wandb: bool, also: list) -> list:
    """What the wheel set is the closure of: ROOTS, W&B if asked, and the image packages carried
    anyway (OVER_IMAGE and --also), which stop counting as the image's."""
    over = [*OVER_IMAGE, *also]
    IMAGE.difference_update(canonical(n) for n in over)
    return ROOTS + (["wandb"] if with_wandb else []) + over


def fetch(names: dict, into: Path) -> None:
    """Download (or build, for SDIST_ONLY) name==version for each of names into `into`."""
    pip = [sys.executable, "-m", "pip"]
    binary = [f"{n}=={v}" for n, v in sorted(names.items()) if n not in SDIST_ONLY]
    if binary:
        platforms = [a for p in PLATFORMS for a in ("--platform", p)]
        cmd = [
            *pip,
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            PYTHON_VERSION,
            "--implementation",
            "cp",
            *platforms,
        ]
        subprocess.run([*cmd, "-d", str(into), *binary], check=True)
    for name in sorted(n for n in names if n in SDIST_ONLY):
        env = {**os.environ, **BUILD_ENV.get(name, {})}
        # No build isolation: DeepSpeed's setup imports torch, which the dev venv has (a CPU build).
        cmd = [*pip, "wheel", "--no-deps", "--no-build-isolation", f"{name}=={names[name]}", "-w", str(into)]
        subprocess.run(cmd, check=True, env=env)


def strip_wheel(wheel: Path, prefix: str) -> int:
    """Rewrite the wheel without the members under prefix (and their RECORD lines); returns bytes saved."""
    before = wheel.stat().st_size
    trimmed = wheel.with_suffix(".trimmed")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.startswith(prefix):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line for line in data.decode().splitlines(keepends=True) if not line.startswith(prefix)).encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    trimmed.replace(wheel)
    return before - wheel.stat().st_size


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_and_fetch(roots: list, wheels: Path) -> dict:
    """Download the closure of roots, rounds at a time; returns {name: {version, wheel, needed_by}} and
    the image packages relied on with what is asked of them."""
    from packaging.requirements import Requirement

    pins = dev_pins()
    carried, relied = {}, {}
    queue = [(Requirement(r), "raydra") for r in roots]
    extras_of = {}
    while queue:
        batch = {}
        for req, parent in queue:
            name = canonical(req.name)
            if name in IMAGE:
                relied.setdefault(name, set()).add(f"{parent}: {req.specifier or 'any'}")
                continue
            if name not in pins:
                raise SystemExit(f"{name} (needed by {parent}) has no pinned version: add it to EXTRA_PINS in {Path(__file__).name}.")
            if req.specifier and not req.specifier.contains(pins[name], prereleases=True):
                raise SystemExit(f"{parent} needs {name}{req.specifier} but the pinned version is {pins[name]}.")
            new_extras = set(req.extras) - extras_of.get(name, set())
            extras_of.setdefault(name, set()).update(req.extras)
            if name in carried:
                carried[name]["needed_by"].add(parent)
                if new_extras and "wheel" in carried[name]:  # its extras' needs, from the wheel already here
                    queue_more = wheel_requirements(wheels / carried[name]["wheel"], new_extras)
                    batch.setdefault("__requeue__", []).extend((r, name) for r in queue_more)
                continue
            batch[name] = pins[name]
            carried[name] = {"version": pins[name], "needed_by": {parent}}
        requeue = batch.pop("__requeue__", [])
        before = set(p.name for p in wheels.glob("*.whl"))
        if batch:
            fetch(batch, wheels)
        queue = list(requeue)
        for wheel in sorted(wheels.glob("*.whl")):
            if wheel.name in before:
                continue
            name = wheel_name(wheel)
            carried[name]["wheel"] = wheel.name
            queue.extend((r, name) for r in wheel_requirements(wheel, extras_of.get(name, set())))
    missing = [n for n, c in carried.items() if "wheel" not in c]
    if missing:
        raise SystemExit(f"no wheel came for {', '.join(missing)}.")
    return carried, relied


def image_conflicts(relied: dict) -> list:
    """Needs of carried wheels that the image's known versions do not meet."""
    from packaging.specifiers import SpecifierSet

    out = []
    for name, asks in sorted(relied.items()):
        have = IMAGE_VERSIONS.get(name)
        for ask in sorted(asks):
            spec = ask.split(": ", 1)[1]
            if have and spec != "any" and not SpecifierSet(spec).contains(have, prereleases=True):
                out.append(f"{ask.split(':')[0]} needs {name}{spec}; the image has {have}")
    return out


def write_calls(manifest: dict, dest: Path) -> list:
    """Lay out .gpu_wheels/callN/ from the plan (whole files hard-linked, parts cut), each with the manifest."""
    wheels = dest / "wheels"
    for old in dest.glob("call*"):
        shutil.rmtree(old)
    carry = []
    for number, items in enumerate(manifest["calls"], start=1):
        folder = dest / f"call{number}"
        folder.mkdir()
        for item in items:
            src = wheels / item["file"]
            if item["part"] is None:
                os.link(src, folder / item["file"])
                continue
            with open(src, "rb") as f, open(folder / item["name"], "wb") as out:
                f.seek(item["offset"])
                out.write(f.read(item["length"]))
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
        carry.append(str(folder.relative_to(REPO)))
    return carry


def build_manifest(dest: Path, carried: dict, relied: dict, tree_bytes: int, stripped: list, roots: list) -> dict:
    wheels = dest / "wheels"
    files = {c["wheel"]: (wheels / c["wheel"]).stat().st_size for c in carried.values()}
    plan = plan_calls(files, tree_bytes)
    calls = [
        [
            {
                "file": name,
                "part": part,
                "offset": offset,
                "length": length,
                "name": name if part is None else f"{name}.part{part}",
                "sha256": sha256(wheels / name) if part is None else None,
            }
            for name, part, offset, length in items
        ]
        for items in plan
    ]
    return {
        "python": PYTHON_VERSION,
        "platforms": PLATFORMS,
        "roots": roots,
        "tree_bytes": tree_bytes,
        "limit_bytes": LIMIT,
        "stripped": stripped,
        "wheels": {
            c["wheel"]: {
                "name": n,
                "version": c["version"],
                "size": files[c["wheel"]],
                "sha256": sha256(wheels / c["wheel"]),
                "needed_by": sorted(c["needed_by"]),
            }
            for n, c in sorted(carried.items())
        },
        "image_relied_on": {n: sorted(a) for n, a in sorted(relied.items())},
        "image_conflicts": image_conflicts(relied),
        "calls": calls,
    }


def report(manifest: dict, carry: list) -> None:
    wheels = manifest["wheels"]
    total = sum(w["size"] for w in wheels.values())
    print(f"\n{len(wheels)} wheels, {total / MIB:.1f} MiB; the working tree {manifest['tree_bytes'] / MIB:.1f} MiB travels with every call")
    for line in manifest["stripped"]:
        print(f"  trimmed: {line}")
    for name, info in sorted(wheels.items(), key=lambda kv: -kv[1]["size"])[:8]:
        print(f"  {info['size'] / MIB:6.1f} MiB  {name}")
    for conflict in manifest["image_conflicts"]:
        print(f"  image version to watch: {conflict}")
    for number, (items, path) in enumerate(zip(manifest["calls"], carry), start=1):
        size = sum(i["length"] for i in items)
        print(
            f'call {number}: carry ["{path}"]: {len(items)} files, {size / MIB:.1f} MiB + tree {manifest["tree_bytes"] / MIB:.1f} MiB'
            f" = {(size + manifest['tree_bytes']) / MIB:.1f} of {manifest['limit_bytes'] / MIB:.0f} MiB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="re-plan the calls from the existing wheels and manifest; no download")
    parser.add_argument("--with-wandb", action="store_true", help="carry W&B too (logger=wandb on the GPU machine)")
    parser.add_argument(
        "--also", action="append", default=[], metavar="NAME", help="carry this package though the image has it (repeatable)"
    )
    args = parser.parse_args()
    roots = roots_for(args.with_wandb, args.also)
    tree_bytes = tree_size()
    DEST.mkdir(exist_ok=True)
    try:
        if args.check:
            old = json.loads((DEST / "manifest.json").read_text())
            carried = {w["name"]: {"version": w["version"], "wheel": f, "needed_by": set(w["needed_by"])} for f, w in old["wheels"].items()}
            manifest = build_manifest(
                DEST, carried, {n: set(a) for n, a in old["image_relied_on"].items()}, tree_bytes, old["stripped"], old["roots"]
            )
        else:
            wheels = DEST / "wheels"
            shutil.rmtree(wheels, ignore_errors=True)
            wheels.mkdir()
            carried, relied = resolve_and_fetch(roots, wheels)
            stripped = []
            for name, prefix, why in STRIP:
                if name in carried:
                    saved = strip_wheel(wheels / carried[name]["wheel"], prefix)
                    stripped.append(f"{prefix} from {carried[name]['wheel']} ({saved / MIB:.1f} MiB): {why}")
            manifest = build_manifest(DEST, carried, relied, tree_bytes, stripped, roots)
    except TooLarge as error:
        sys.exit(f"does not fit: {error}")
    (DEST / "manifest.json").write_text(json.dumps(manifest, indent=1))
    report(manifest, write_calls(manifest, DEST))


if __name__ == "__main__":
    main()
