"""`gpuaudit --help` lists every command without importing any of them (issue 27): the
summaries table equals each command's own help, and the process loads no heavy module."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from gpuaudit.cli import COMMANDS, SUMMARIES, cli

HEAVY = {"numpy", "pyarrow", "pandas", "duckdb", "httpx", "rich", "msgspec", "pynvml",
         "prometheus_client"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_summary_is_the_commands_own_help(name: str) -> None:
    cmd = cli.get_command(click.Context(cli), name)
    assert cmd is not None
    own = " ".join((cmd.help or "").split("\n\n")[0].split())
    assert SUMMARIES[name] == own, f"update SUMMARIES[{name!r}] in gpuaudit/cli/__init__.py"
    for limit in (30, 45, 80):
        assert click.Command(name, help=SUMMARIES[name]).get_short_help_str(limit) == \
            cmd.get_short_help_str(limit)


def test_help_imports_no_command_and_nothing_heavy() -> None:
    code = ("import sys, json\nfrom gpuaudit.cli import run_argv\nrc = run_argv(['--help'])\n"
            "mods = sorted({m.split('.')[0] for m in sys.modules})\n"
            "cli = sorted(m for m in sys.modules if m.startswith('gpuaudit.cli.'))\n"
            "print(json.dumps([rc, mods, cli]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    rc, mods, cli_mods = json.loads(p.stdout.strip().splitlines()[-1])
    assert rc == 0
    assert not HEAVY & set(mods), sorted(HEAVY & set(mods))
    assert cli_mods == ["gpuaudit.cli.console"], cli_mods  # -q/-v/--color: click only
    assert all(name in p.stdout for name in COMMANDS)
