"""The golden gate's session runner (``golden_runs.GoldenRunner``) and its summary table."""

import pytest
from golden_runs import TREES, VERDICTS, GoldenRunner, tree_paths


@pytest.fixture(scope="session")
def golden_runner(tiny_fixtures_dir, tmp_path_factory):
    return GoldenRunner(tiny_fixtures_dir, tmp_path_factory.mktemp("golden"), tree_paths())


def pytest_terminal_summary(terminalreporter):
    runs = [run for runner in GoldenRunner.instances for run in runner.runs.values()]
    if not runs:
        return
    terminalreporter.section("golden equivalence: fork vs TRL 0.16.1 on default paths")
    terminalreporter.write_line(f"{'trainer':<18}{'mode':<8}{'base':>7}{'fork':>7}  verdict")
    cases = sorted({(r.trainer, r.mode) for r in runs})
    for trainer, mode in cases:
        times = []
        for tree in TREES:
            run = next((r for r in runs if (r.trainer, r.mode, r.tree) == (trainer, mode, tree)), None)
            times.append(f"{run.launch.duration:>6.0f}s" if run else f"{'-':>7}")
        verdict = VERDICTS.get((trainer, mode), "not compared")
        terminalreporter.write_line(f"{trainer:<18}{mode:<8}{''.join(times)}  {verdict}")
