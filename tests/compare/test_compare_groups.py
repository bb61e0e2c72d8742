"""`raydra compare` as a results table: group choices as one column, absent keys, seeds aggregated
with confidence intervals, and differences to a baseline with Welch's t-test. Synthetic run
directories (tests/helpers.make_run) whose numbers are known, so every statistic is checked
against a hand calculation."""

import json
import math

import pytest
from helpers import compare, make_run

from raydra.cli import main

CHOICES = {"model": "vit", "data": "digits", "logger": "csv", "experiment": None}
# best val/acc per seed (make_run's best is the max of accs): three learning rates, three seeds each.
SEEDS = {0.01: (0.80, 0.82, 0.84), 0.1: (0.90, 0.91, 0.92), 0.001: (0.81, 0.83, 0.85)}


@pytest.fixture
def seeded(tmp_path):
    root = tmp_path / "sweeps" / "2026-11-22" / "15-20-01_vit_digits"
    job = 0
    for lr, accs in SEEDS.items():
        for seed, acc in enumerate(accs):
            make_run(root, str(job), lr=lr, accs=(0.5, acc), seed=seed, choices=CHOICES)
            job += 1
    return root


def as_json(capsys, *args):
    code = main(["compare", *map(str, args), "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


def test_runs_that_differ_by_seed_are_grouped_with_mean_sd_and_95_ci(seeded, capsys):
    groups, err = as_json(capsys, seeded)
    assert err == ""
    assert [g["group"] for g in groups] == ["model.optimizer.lr=0.01", "model.optimizer.lr=0.1", "model.optimizer.lr=0.001"]
    first = groups[0]
    assert first["n"] == 3 and first["keys"] == {"model.optimizer.lr": 0.01}
    stats = first["val/acc"]
    assert stats["mean"] == pytest.approx(0.82) and stats["std"] == pytest.approx(0.02)
    # t(0.975, df=2) = 4.3027; half width 4.3027 * 0.02 / sqrt(3)
    half = 4.302653 * 0.02 / math.sqrt(3)
    assert stats["ci95"] == pytest.approx([0.82 - half, 0.82 + half], abs=1e-6)

    code, out, _ = compare(capsys, seeded)
    heading, header, _, *lines = out.strip().splitlines()
    assert heading.startswith("9 runs in 3 groups by model.optimizer.lr")
    assert header.split()[:4] == ["group", "n", "val/acc", "val/acc"]
    assert "0.82 ± 0.02" in lines[0] and "[0.7703, 0.8697]" in lines[0]


def test_a_run_its_sweeper_pruned_is_left_out_of_its_groups_statistics_and_said_so(seeded, capsys):
    # A seed race stopped lr 0.01's fourth seed partway, at a value far below the others'.
    make_run(seeded, "9", lr=0.01, accs=(0.1,), seed=3, choices=CHOICES, status="pruned")
    groups, err = as_json(capsys, seeded)
    first = groups[0]
    assert first["n"] == 3 and len(first["runs"]) == 4
    assert first["val/acc"]["mean"] == pytest.approx(0.82) and first["val/acc"]["std"] == pytest.approx(0.02)
    assert "1 run(s) pruned by their sweeper are in the groups' runs but not in their statistics" in err


def test_baseline_difference_ci_and_welch_p_value_say_whether_it_is_seed_noise(seeded, capsys):
    groups, _ = as_json(capsys, seeded, "--baseline", "model.optimizer.lr=0.01")
    base, better, same = groups
    assert "Δ val/acc" not in base
    d = better["Δ val/acc"]
    assert d["diff"] == pytest.approx(0.09)
    # Welch by hand: variances of the means 0.02²/3 and 0.01²/3, Welch–Satterthwaite df.
    v1, v2 = 0.01**2 / 3, 0.02**2 / 3
    se = math.sqrt(v1 + v2)
    df = (v1 + v2) ** 2 / (v1**2 / 2 + v2**2 / 2)
    from scipy import stats

    assert d["ci95"] == pytest.approx([0.09 - stats.t.ppf(0.975, df) * se, 0.09 + stats.t.ppf(0.975, df) * se])
    assert d["p"] == pytest.approx(2 * stats.t.sf(0.09 / se, df))
    assert d["p"] < 0.05 and d["verdict"].startswith("better than the baseline beyond seed noise")
    assert same["Δ val/acc"]["diff"] == pytest.approx(0.01)
    assert same["Δ val/acc"]["p"] > 0.05 and same["Δ val/acc"]["verdict"].startswith("within seed noise")

    code, out, _ = compare(capsys, seeded, "--baseline", "2")  # by number: lr=0.1 is the baseline
    assert code == 0
    lines = out.strip().splitlines()[3:]
    assert "worse than the baseline beyond seed noise" in lines[0] and lines[1].split()[-2:] == ["baseline", "0.1"]


def test_group_by_explicit_none_and_a_baseline_that_names_no_group(seeded, capsys):
    runs, _ = as_json(capsys, seeded, "--group-by", "none")
    assert len(runs) == 9 and runs[0]["seed"] == 0
    one, _ = as_json(capsys, seeded, "--group-by", "model.name")
    assert len(one) == 1 and one[0]["n"] == 9
    code, _, err = compare(capsys, seeded, "--baseline", "model.optimizer.lr=0.5")
    assert code == 2 and "--baseline 'model.optimizer.lr=0.5' matches no group" in err
    code, _, err = compare(capsys, seeded, "--group-by", "model.nmae")
    assert code == 0 and "no run has config key 'model.nmae'" in err


def test_single_seed_groups_have_no_interval_and_too_few_seeds_is_said(tmp_path, capsys):
    make_run(tmp_path, "a0", lr=0.01, accs=(0.5, 0.8), seed=0)
    make_run(tmp_path, "a1", lr=0.01, accs=(0.5, 0.9), seed=1)
    make_run(tmp_path, "b0", lr=0.1, accs=(0.5, 0.7), seed=0)
    groups, _ = as_json(capsys, tmp_path, "--baseline", "model.optimizer.lr=0.01")
    assert groups[1]["n"] == 1 and groups[1]["val/acc"]["std"] is None and groups[1]["val/acc"]["ci95"] is None
    assert groups[1]["Δ val/acc"]["p"] is None and "too few seeds" in groups[1]["Δ val/acc"]["verdict"]


def test_a_differing_group_choice_is_one_column_and_absent_keys_say_absent(tmp_path, capsys):
    wandb = {"csv": {"flush_logs_every_n_steps": 50}, "wandb": {"project": "raydra", "entity": None, "mode": "offline", "tags": []}}
    make_run(tmp_path, "csv_only", lr=0.01, choices=CHOICES)
    make_run(tmp_path, "with_wandb", lr=0.1, choices={**CHOICES, "logger": ["csv", "wandb"]}, config_extra={"logger": wandb})
    make_run(tmp_path, "new_key", lr=0.1, choices=CHOICES, config_extra={"compile": True})
    code, out, err = compare(capsys, tmp_path)
    assert code == 0 and err == ""
    header, _, *lines = out.strip().splitlines()
    assert header.split()[:9] == ["run", "final", "val/acc", "best", "val/acc", "logger", "model.optimizer.lr", "compile", "status"]
    assert not any(column.startswith("logger.") for column in header.split())
    rows = {line.split()[0]: line.split() for line in lines}
    assert rows["with_wandb"][3:5] == ["[csv,", "wandb]"] and rows["csv_only"][3] == "csv"
    assert rows["csv_only"][5] == "absent" and rows["new_key"][5] == "true"

    records, _ = as_json(capsys, tmp_path, "--filter", "logger=csv")
    assert [r["run"] for r in records] == ["csv_only", "new_key"]
    assert "compile" not in records[0] and records[1]["compile"] is True  # absent is not null
