"""A run's top-level `tags` in `raydra compare` and `raydra show`: read from summary.json (from the
recorded config for runs older than that), shown as a column and in every export, and filtered by
--tag (repeated: all of them; TAG,TAG: either) and --exclude-tag, composing with --filter, --sort,
seed groups and --baseline. Synthetic run directories (tests/helpers.make_run)."""

import csv
import io
import json
import re

import pytest
from helpers import compare, make_run

from raydra.cli import main


@pytest.fixture
def tagged(tmp_path):
    """Five runs: two baselines, two ablations (one of them still work in progress), one untagged
    run from before summary.json recorded tags (its config has them)."""
    root = tmp_path / "runs"
    make_run(root, "base_a", lr=0.01, accs=(0.5, 0.8), tags=("baseline", "digits"))
    make_run(root, "base_b", lr=0.02, accs=(0.5, 0.85), tags=("baseline", "digits"))
    make_run(root, "abl_a", lr=0.03, accs=(0.5, 0.9), tags=("ablation", "digits"))
    make_run(root, "abl_wip", lr=0.04, accs=(0.5, 0.6), tags=("ablation", "digits", "wip"))
    make_run(root, "old", lr=0.05, accs=(0.5, 0.7), tags=("baseline",), tags_in_summary=False)
    make_run(root, "untagged", lr=0.06, accs=(0.5, 0.75))
    return root


def records(capsys, *args):
    code, out, err = compare(capsys, *args, "--format", "json")
    assert code == 0, err
    return {r["run"]: r for r in json.loads(out)}, err


def test_tags_are_a_column_in_the_table_and_every_export(tagged, capsys):
    by_run, err = records(capsys, tagged)
    assert err == ""
    assert list(next(iter(by_run.values())))[:2] == ["run", "tags"]
    assert by_run["base_a"]["tags"] == ["baseline", "digits"]
    assert by_run["abl_wip"]["tags"] == ["ablation", "digits", "wip"]
    assert by_run["old"]["tags"] == ["baseline"]  # from .hydra/config.yaml: its summary.json has none
    assert by_run["untagged"]["tags"] == []

    code, out, _ = compare(capsys, tagged, "--format", "csv")
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO(out))}
    assert json.loads(rows["abl_wip"]["tags"]) == ["ablation", "digits", "wip"]
    assert json.loads(rows["untagged"]["tags"]) == []

    code, out, _ = compare(capsys, tagged)
    header, _, *lines = out.strip().splitlines()
    assert header.split()[:2] == ["run", "tags"]
    # The tags have their own column, so they are not also a differing config key.
    assert header.split().count("tags") == 1 and "model.optimizer.lr" in header.split()
    line = next(line for line in lines if line.startswith("abl_wip"))
    assert re.match(r"abl_wip\s+ablation, digits, wip\s+0\.6\s", line)

    code, out, _ = compare(capsys, tagged, "--format", "markdown")
    assert "| abl_wip | ablation, digits, wip |" in out


def test_no_tags_column_when_no_run_has_tags(tmp_path, capsys):
    make_run(tmp_path, "a", lr=0.01)
    make_run(tmp_path, "b", lr=0.1)
    by_run, _ = records(capsys, tmp_path)
    assert "tags" not in by_run["a"]


def test_repeated_tag_needs_every_one_a_comma_either_and_exclude_tag_leaves_out(tagged, capsys):
    by_run, err = records(capsys, tagged, "--tag", "baseline")
    assert sorted(by_run) == ["base_a", "base_b", "old"] and err == ""
    by_run, _ = records(capsys, tagged, "--tag", "baseline", "--tag", "digits")
    assert sorted(by_run) == ["base_a", "base_b"]
    by_run, _ = records(capsys, tagged, "--tag", "baseline,ablation")
    assert sorted(by_run) == ["abl_a", "abl_wip", "base_a", "base_b", "old"]
    by_run, _ = records(capsys, tagged, "--tag", "baseline,ablation", "--exclude-tag", "wip")
    assert sorted(by_run) == ["abl_a", "base_a", "base_b", "old"]
    by_run, _ = records(capsys, tagged, "--exclude-tag", "wip,baseline")
    assert sorted(by_run) == ["abl_a", "untagged"]
    # With --filter, --sort (best first by the monitor) and labels cut from the runs shown.
    code, out, _ = compare(
        capsys, tagged, "--tag", "digits", "--exclude-tag", "wip", "--filter", "model.name=vit", "--sort", "--format", "json"
    )
    assert [r["run"] for r in json.loads(out)] == ["abl_a", "base_b", "base_a"]


def test_a_tag_filter_that_matches_nothing_names_the_tags_there_are(tagged, capsys):
    code, out, err = compare(capsys, tagged, "--tag", "baseline", "--tag", "ablation")
    assert code == 1 and out == ""
    assert "none of the 6 runs matches tag baseline and tag ablation; their tags are ablation, baseline, digits, wip." in err
    code, _, err = compare(capsys, tagged, "--tag", "basline")
    assert code == 1
    assert err.count("raydra compare:") == 2  # that sentence, then "no run to show."
    assert "matches tag basline; their tags are ablation, baseline, digits, wip." in err
    # One misspelt alternative among others still shows the rest, and says which found nothing.
    by_run, err = records(capsys, tagged, "--tag", "ablation,basline")
    assert sorted(by_run) == ["abl_a", "abl_wip"]
    assert "no run is tagged 'basline', so --tag basline matches nothing; their tags are ablation, baseline, digits, wip." in err

    code, _, err = compare(capsys, tagged, "--tag", "baseline,")
    assert code == 2 and "--tag 'baseline,' holds an empty tag" in err


def test_runs_without_tags_say_how_to_set_them(tmp_path, capsys):
    make_run(tmp_path, "a")
    code, _, err = compare(capsys, tmp_path, "--tag", "baseline")
    assert code == 1
    assert "none of the 1 runs matches tag baseline; none of them has tags (the config's top-level `tags`, e.g. tags=[baseline])." in err


def test_tags_filter_before_seed_groups_and_never_split_them(tmp_path, capsys):
    """Seeds tagged differently (a per-seed tag) still group by lr; --tag picks the runs grouped."""
    root = tmp_path / "sweep"
    job = 0
    for lr, accs in ((0.01, (0.80, 0.82, 0.84)), (0.1, (0.90, 0.91, 0.92))):
        for seed, acc in enumerate(accs):
            make_run(root, str(job), lr=lr, accs=(0.5, acc), seed=seed, tags=("sweep", f"seed{seed}"))
            job += 1
    make_run(root, "wip", lr=0.5, accs=(0.1, 0.2), seed=0, tags=("wip",))
    code, out, err = compare(capsys, root, "--tag", "sweep", "--baseline", "model.optimizer.lr=0.01", "--format", "json")
    assert code == 0, err
    groups = json.loads(out)
    assert [g["group"] for g in groups] == ["model.optimizer.lr=0.01", "model.optimizer.lr=0.1"]
    assert [g["n"] for g in groups] == [3, 3]
    assert groups[1]["Δ val/acc"]["diff"] == pytest.approx(0.09)


def test_show_prints_the_tags(tagged, capsys):
    assert main(["show", str(tagged / "abl_wip")]) == 0
    assert re.search(r"^tags\s+ablation, digits, wip$", capsys.readouterr().out, re.M)
    assert main(["show", str(tagged / "old")]) == 0
    assert re.search(r"^tags\s+baseline$", capsys.readouterr().out, re.M)
    assert main(["show", str(tagged / "untagged")]) == 0
    assert not re.search(r"^tags", capsys.readouterr().out, re.M)
