"""The Logs pane labels torchrun's --log-dir files by rank, as `diagnose --run` does: one labelling function
(logs.names.label_source) for both.

torchrun --log-dir DIR --redirects 3 writes each rank's output to DIR/<run id>/attempt_0/<local rank>/stdout.log and
stderr.log: the same two names in every rank's folder, and stdout lines carry no rank prefix. The pane labelled them
"stdout.log" whatever the rank (the diagnosis said "rank1:attempt_0/1/stdout.log"), so rank 0's and rank 1's lines
looked alike. The files are a real run's (tests/data/torchrun_gloo_setup_peer_killed), followed by the real console.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states

from opsconsole.commands.diagnose import _decoded_lines
from opsconsole.config import Config, LogsConfig
from opsconsole.diagnosis.run import diagnose_run
from opsconsole.logs.names import label_source
from opsconsole.tui.app import OpsConsole
from opsconsole.tui.logs import LogsPane
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "tests" / "data" / "torchrun_gloo_setup_peer_killed"
SIZE = (140, 40)


async def test_the_logs_pane_labels_torchruns_rank_folders_by_rank_as_diagnose_run_does(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(KEPT, run)
    files = sorted(run.glob("torchrun/*/attempt_0/*/*.log"))
    lines = sum(len(path.read_text().splitlines()) for path in files)
    written = [path for path in files if path.stat().st_size]
    assert {path.name for path in written} == {"stdout.log", "stderr.log"} and lines
    config = Config(logs=LogsConfig(paths=(str(run / "torchrun" / "*" / "attempt_0" / "*" / "*.log"),)))
    app = OpsConsole(config, FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)
    diagnosed = diagnose_run([str(run / "torchrun")], _decoded_lines)
    by_path = {source.path: source for source in diagnosed.sources.values()}
    async with app.run_test(size=SIZE) as pilot:
        pane = app.panes["logs"]
        assert isinstance(pane, LogsPane)
        await pilot.press("6")
        await wait_for(lambda: len(pane.view.entries) >= lines, "%d lines" % lines, pilot=pilot)
        entries = list(pane.view.entries)
        assert len(entries) == lines
        for entry in entries:
            path = entry.line.source.path
            folder = Path(path).parent.name  # the local rank: the global one on this single node
            # The label the pane draws is the diagnosis's for that file, with the folder's rank.
            assert entry.label == by_path[path].label == "rank%s:attempt_0/%s/%s" % (folder, folder, Path(path).name)
            assert entry.line.rank == by_path[path].rank == int(folder)
        # Each written file one label: rank 0's and rank 1's stdout.log apart.
        assert len({entry.label for entry in entries}) == len(written)
        assert {source.label for source in pane.feed.sources()} == {
            label_source("local", str(path)).label for path in files
        }
