"""The battery's requirement table, read off its own code: every requirement a run can report, where it is
checked, and which test of the suite exercises it.

``scan`` parses the battery's modules for the calls that make requirements (``must``, ``should``,
``stand_in``, ``sample_requirements``, ``duration_requirement``) and reads the section each belongs to from
the module's ``register_test`` (a module without one, such as the warm-up's or the disclosures', holds
requirements every test counts). ``link_tests`` names, for each, the first test function under ``tests/``
that asserts on it, so a row reads "tested" only when such a test exists. ``markdown_table`` renders the
README's table (``python -m microbench.battery requirements`` prints it; a unit test keeps the README
equal to it).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Row", "link_tests", "markdown_table", "scan"]

BATTERY = Path(__file__).resolve().parent
_MAKERS = {"must": "MUST", "should": "SHOULD", "stand_in": "SHOULD"}


@dataclass(frozen=True)
class Row:
    """One requirement as the code states it."""

    ref: str
    level: str
    text: str
    section: str  # "5.1 ttft", or "every test" for report-level requirements
    module: str  # path under microbench/battery
    stand_in: bool = False
    test: str = ""  # tests/...py::function, or "" when no test exercises it


def _literal(node: ast.expr) -> str:
    """A string literal, an f-string with its fields as '…', or '…' for anything computed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)  # type: ignore[misc]
    return "…"


def _section(tree: ast.Module) -> str:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "register_test"
            and len(node.args) > 1
        ):
            return f"{_literal(node.args[1])} {_literal(node.args[0])}"
    return "every test"


def _rows_of_call(call: ast.Call) -> list[tuple[str, str, str, bool]]:
    name, args = getattr(call.func, "id", ""), call.args
    if name in ("must", "should") and len(args) >= 2:
        return [(_literal(args[0]), _MAKERS[name], _literal(args[1]), False)]
    if name == "stand_in" and len(args) >= 2:
        return [(_literal(args[0]), "SHOULD", f"runs the draft's {_literal(args[1])} workload", True)]
    if name == "sample_requirements" and args:
        return [
            (_literal(args[0]), "MUST", "at least 1000 samples for P99", False),
            (_literal(args[0]), "MUST", "at least 10000 samples for P99.9", False),
        ]
    if name == "duration_requirement" and len(args) >= 3:
        level = next((_literal(k.value) for k in call.keywords if k.arg == "level"), "MUST")
        value = args[2].value if isinstance(args[2], ast.Constant) else None
        minimum = (
            f"{value:g}" if isinstance(value, int | float) else "…"
        )  # a computed minimum: not known here
        return [(_literal(args[0]), level, f"at least {minimum} s per load level", False)]
    return []


def scan(root: Path = BATTERY) -> list[Row]:
    """Every requirement a battery module can report, in module then line order (definitions skipped)."""
    rows = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        section = _section(tree)
        calls = sorted(
            (n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)
        )
        for call in calls:
            for ref, level, text, stand_in in _rows_of_call(call):
                if ref != "…":  # a helper's own body (its ref is a parameter) is listed where it is called
                    module = str(path.relative_to(root.parent.parent))
                    rows.append(Row(ref, level, text, section, module, stand_in))
    return rows


@dataclass(frozen=True)
class _TestFn:
    node: str  # tests/...py::function
    strings: frozenset[str]  # its string literals
    source: str  # its file's text
    scans: bool  # it calls scan(): it compares the code's rows with a run's report


def _test_functions(tests_root: Path) -> list[_TestFn]:
    found = []
    for path in sorted(tests_root.rglob("test_*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                inner = list(ast.walk(node))
                strings = frozenset(
                    n.value for n in inner if isinstance(n, ast.Constant) and isinstance(n.value, str)
                )
                scans = any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "scan" for n in inner)
                found.append(
                    _TestFn(f"{path.relative_to(tests_root.parent)}::{node.name}", strings, source, scans)
                )
    return found


def _covers(row: Row, fn: _TestFn) -> bool:
    """``fn`` asserts on ``row``: its text (with its section number where the text has a computed part),
    its section number beside the battery test's name or the checking module, or every row of the
    battery tests it names when it compares the scanned rows with a run (``scan``)."""
    name = row.section.split(" ", 1)[-1]  # the battery test's registered name ("test" for "every test")
    if fn.scans and name in fn.strings:
        return True
    longest = max(row.text.split("…"), key=len)
    if any(longest in s for s in fn.strings) and ("…" not in row.text or row.ref in fn.strings):
        return True
    stem = row.module.removesuffix(".py").replace("/", ".")
    return row.ref in fn.strings and (stem in fn.source or name in fn.strings)


def link_tests(rows: list[Row], tests_root: Path) -> list[Row]:
    """Each row with the first test function under ``tests_root`` that asserts on it (``_covers``)."""
    tests = _test_functions(tests_root)
    return [
        Row(**{**row.__dict__, "test": next((fn.node for fn in tests if _covers(row, fn)), "")})
        for row in rows
    ]


def markdown_table(rows: list[Row]) -> str:
    """The README's table: requirement · section · how the suite meets it · test."""
    lines = [
        "| Requirement | Section | How the suite meets it | Test |",
        "|---|---|---|---|",
    ]
    for r in rows:
        if r.stand_in:
            how = f"not met: a stand-in runs; the test's verdict is conditional (`{r.module}`)"
        elif r.test:
            how = f"checked at run time in `{r.module}`, reported met or not"
        else:
            how = f"checked at run time in `{r.module}`; no test exercises it, so not claimed here"
        test = f"`{r.test}`" if r.test else "–"
        lines.append(f"| {r.ref} {r.level}: {r.text} | {r.section} | {how} | {test} |")
    return "\n".join(lines) + "\n"
