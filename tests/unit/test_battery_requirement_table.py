"""The battery's requirement table: read off the code, linked to the tests that assert on each row."""

from pathlib import Path

from microbench.battery.requirement_table import Row, link_tests, markdown_table, scan

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_table_is_the_code_s_own() -> None:
    text = (REPO / "README.md").read_text()
    start, end = "<!-- requirement-table:start -->\n", "<!-- requirement-table:end -->"
    shown = text[text.index(start) + len(start) : text.index(end)]
    assert shown == markdown_table(link_tests(scan(), REPO / "tests")), (
        "the README's requirement table is stale: python -m microbench.battery requirements"
    )


def test_scan_reads_sections_helpers_and_stand_ins(tmp_path: Path) -> None:
    (tmp_path / "sections").mkdir()
    (tmp_path / "sections" / "demo.py").write_text(
        '@register_test("demo", "5.1", "Demo")\n'
        "def run(p, n):\n"
        '    return [must("5.1.2", f"at least {n} samples", True), *sample_requirements("5.1.2.1", n),\n'
        '            duration_requirement("5.3.2", p.s, 60.0, level="SHOULD"),\n'
        '            stand_in("5.6.2", "Skewed", "x")]\n'
    )
    (tmp_path / "helpers.py").write_text(
        'def f(ref):\n    return [should(ref, "computed ref"), must("4.1", "x", 1)]\n'
    )
    rows = scan(tmp_path)
    assert [(r.ref, r.level, r.text, r.section) for r in rows] == [
        ("4.1", "MUST", "x", "every test"),
        ("5.1.2", "MUST", "at least … samples", "5.1 demo"),
        ("5.1.2.1", "MUST", "at least 1000 samples for P99", "5.1 demo"),
        ("5.1.2.1", "MUST", "at least 10000 samples for P99.9", "5.1 demo"),
        ("5.3.2", "SHOULD", "at least 60 s per load level", "5.1 demo"),
        ("5.6.2", "SHOULD", "runs the draft's Skewed workload", "5.1 demo"),
    ]
    assert rows[-1].stand_in and not rows[0].stand_in


def test_a_row_is_linked_only_to_a_test_that_asserts_on_it(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_x.py").write_text(
        "def test_text():\n    assert r.text == 'request queue drained'\n\n"
        "def test_ref_beside_name():\n    run(['prefix_cache']); assert r.ref == '5.7.2'\n\n"
        "def test_unrelated():\n    assert '5.9.2' == ref\n"
    )
    rows = [
        Row("4.5.1", "MUST", "request queue drained", "every test", "microbench/battery/warmup.py"),
        Row(
            "5.7.2", "MUST", "run with cache disabled", "5.7 prefix_cache", "microbench/battery/sections/p.py"
        ),
        Row("5.9.2", "MUST", "fixed output length", "5.9 long_context", "microbench/battery/sections/l.py"),
        Row("5.6.2", "SHOULD", "runs the draft's Skewed workload", "5.6 fairness", "m.py", stand_in=True),
    ]
    linked = link_tests(rows, tests)
    assert [r.test for r in linked] == [
        "tests/test_x.py::test_text",
        "tests/test_x.py::test_ref_beside_name",
        "",
        "",
    ]
    table = markdown_table(linked).splitlines()
    assert "no test exercises it, so not claimed here" in table[4] and table[4].endswith("| – |")
    assert "not met: a stand-in runs" in table[5]
