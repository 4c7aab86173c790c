"""Issue #33: a definition file that is not UTF-8 text or not YAML is bad input for every command that
reads one (exit 2, the file and the problem named, nothing written), never a decoder's traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fault_checks import Place, assert_clear_error

from microbench.ablate.cli import main as ablate
from microbench.battery.cli import main as battery
from microbench.characterize.cli import main as characterize
from microbench.loadgen.cli import main as loadgen
from microbench.route.cli import main as route
from microbench.sweep.cli import main as sweep
from microbench.transfer.cli import main as transfer

COMMANDS: dict[str, tuple[Callable[[list[str]], int], list[str]]] = {
    "sweep": (sweep, ["--config"]),
    "transfer": (transfer, ["--config"]),
    "ablate": (ablate, ["--config"]),
    "battery": (battery, ["run", "--engine", "sim", "--config"]),
    "loadgen": (loadgen, ["run", "--url", "http://127.0.0.1:9", "--model", "m", "--workload"]),
    "route": (route, ["--config"]),
    "characterize": (characterize, ["--config"]),
}
FILES = {
    "not UTF-8": (b'name: "\xff\xfe latin-1"\n', "is not UTF-8 text"),
    "not YAML": (b"chunks: [512\n  foo: : bar\n", "is not valid YAML"),
}


@pytest.mark.parametrize("fault", list(FILES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_definition_file_that_cannot_be_read_is_named(place: Place, run, command: str, fault: str) -> None:
    content, needle = FILES[fault]
    path: Path = place.tmp / "definition.yaml"
    path.write_bytes(content)
    main, argv = COMMANDS[command]
    out = place.tmp / "out"
    outcome = run(main, *argv, path, "--out", out)
    assert outcome.code == 2, outcome.text[-2000:]
    assert_clear_error(outcome, str(path), needle)
    assert not out.exists() and not list(place.cwd.iterdir())
