"""The run files named on a Snakemake command line: read from it, checked against the config, trained alone.

The Snakemake side (one training job for one named record, a bad path failing the dry run) is in
tests/test_workflow.py.
"""
from __future__ import annotations

import pytest

from hotcold.config import ConfigError
from hotcold.workflow.matrix import Matrix, Run
from hotcold.workflow.settings import workflow_config
from hotcold.workflow.targets import CommandLine, check_configfiles, check_gpus, check_named, lone_runs, named_runs

MATRIX = Matrix(workflow_config())  # the default config: kaggle, terabyte, taobao, multihot; seed 0; scale-out at 4 x 2


def test_the_run_files_are_read_from_the_command_line_and_nothing_else():
    argv = ["--cores", "2", "-n", "--forcerun", "results/runs/kaggle/hybrid/base/seed~0/record.json",
            "../another-checkout/results/runs/taobao/lru/5pct/seed~0/steps.parquet",
            "results/runs/kaggle/sharded/row/world~4-rpn~2/seed~0/record.json",
            "results/tables/summary.csv", "results/runs/kaggle/lru/1.5pct/seed~0/train.log", "all"]
    assert [run for _, run in named_runs(argv)] == [
        Run("kaggle", "hybrid", "base", 0), Run("taobao", "lru", "5pct", 0),
        Run("kaggle", "sharded", "row", 0, 4, 2)]


def test_configured_runs_pass_and_only_the_grouped_ones_are_trained_alone():
    named = named_runs(["results/runs/kaggle/lru/1.5pct/seed~0/record.json",
                        "results/runs/kaggle/sharded/row/world~4-rpn~2/seed~0/record.json"])
    check_named(MATRIX, named)
    assert lone_runs(MATRIX, named) == [Run("kaggle", "lru", "1.5pct", 0), Run("kaggle", "sharded", "row", 0, 4, 2)]
    assert lone_runs(MATRIX, named_runs(["all", "results/tables/summary.csv"])) == []
    config = workflow_config()
    config["distributed"]["group_runs"] = False  # a job per scale-out run: it is trained by its own job anyway
    assert lone_runs(Matrix(config), named) == [Run("kaggle", "lru", "1.5pct", 0)]
    config = workflow_config()
    config["timing"]["device"] = "cpu"
    on_cpu = Matrix(config)
    infeasible = on_cpu.device_infeasible()[0]  # a GPU-only variant on a CPU trainer: its one job stays
    assert lone_runs(on_cpu, named_runs([f"{infeasible.dir}/record.json"])) == []


@pytest.mark.parametrize(("path", "expected"), [
    ("results/runs/kagle/lru/1.5pct/seed~0/record.json",
     "no dataset 'kagle' is configured (datasets: kaggle, terabyte, taobao, multihot)"),
    ("results/runs/kaggle/lur/1.5pct/seed~0/record.json", "method 'lur' is not run on kaggle (methods: "),
    ("results/runs/kaggle/lru/1.4pct/seed~0/record.json", "lru has no variant '1.4pct' on kaggle (variants: 1.5pct"),
    ("results/runs/kaggle/lru/1.5pct/seed~7/record.json", "seed 7 is not configured (seeds: 0)"),
    ("results/runs/kaggle/sharded/row/world~3-rpn~1/seed~0/record.json",
     "scale world~3-rpn~1 is not trained (trained scales: world~4-rpn~2)"),
    ("results/runs/kaggle/sharded/row/world~4096-rpn~8/seed~0/record.json", "scale world~4096-rpn~8 is not trained"),
    ("results/runs/kaggle/sharded/row/seed~0/record.json", "sharded runs over ranks: its path names a scale"),
    ("results/runs/kaggle/lru/1.5pct/world~4-rpn~2/seed~0/record.json", "lru runs in one process"),
])
def test_a_path_the_config_does_not_ask_for_is_named_with_what_it_does(path, expected):
    with pytest.raises(ConfigError) as e:
        check_named(MATRIX, named_runs([path]))
    assert str(e.value).startswith(f"{path}: ") and expected in str(e.value)
    assert "\n" not in str(e.value)


def test_runs_are_trained_alone_only_where_every_target_is_a_run_file():
    one = "results/runs/kaggle/lru/1.5pct/seed~0/record.json"
    assert [r for _, r in CommandLine.parse(["--cores", "2", "--force", one]).lone()] == [
        Run("kaggle", "lru", "1.5pct", 0)]
    # with --forcerun the target is every output (`all`): the interleaved jobs train, the run among them
    assert CommandLine.parse(["--cores", "2", "--forcerun", one]).lone() == []
    assert CommandLine.parse(["--cores", "2", one, "results/tables/summary.csv"]).lone() == []
    assert CommandLine.parse(["--cores", "2", one, "--forcerun", one]).forcerun == (one,)


def test_a_target_taken_as_a_config_file_is_named():
    one = "results/runs/kaggle/lru/1.5pct/seed~0/record.json"
    with pytest.raises(ConfigError) as e:
        check_configfiles(CommandLine.parse(["--cores", "2", "--configfile", "more.yaml", one]))
    assert str(e.value).startswith(f"--configfile took {one} as config file(s): write the targets before --configfile")
    check_configfiles(CommandLine.parse(["--cores", "2", one, "--configfile", "more.yaml"]))


def test_fewer_gpus_than_an_nccl_scale_out_job_needs_are_refused():
    config = workflow_config()
    config["timing"]["device"] = "cuda"
    with pytest.raises(ConfigError) as e:
        check_gpus(Matrix(config), CommandLine.parse(["--resources", "gpu=1"]).gpus)
    line = str(e.value)
    assert line.startswith("--resources gpu=1: world 4 needs 4 GPUs over NCCL") and "distributed.backend: gloo" in line
    check_gpus(Matrix(config), 4)
    check_gpus(Matrix(config), None)
    config["distributed"]["backend"] = "gloo"
    check_gpus(Matrix(config), 1)
    check_gpus(MATRIX, 1)  # timing.device auto: the job finds out where it runs
