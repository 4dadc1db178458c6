"""``loopscope compare --junit FILE``: the gate's outcome as JUnit XML.

Jenkins (the JUnit plugin), GitLab (``artifacts:reports:junit``) and most
CI systems read this one format, so a regression gate shows up beside a
project's own tests. One test suite per comparison; one test case per
criterion and probe (``p99 > +10% · timer``), named so that it keeps its
name from run to run (the CI's history of a case follows it):

- a case that passed is empty;
- a failed one carries ``<failure>`` with the rows whose interval lies
  wholly past the bound;
- an inconclusive one is ``<skipped>`` with the rows that could not decide
  it (an interval straddling the bound, a row without one), or a
  ``<failure>`` of type ``inconclusive`` with ``--strict``.

Written with the standard library's ElementTree: the format is a handful
of elements and needs no dependency.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from loopscope.analysis.runcompare import Criterion, Row


def write(path: Path, criteria: list[Criterion], rows: list[Row], baseline: str, strict: bool, seconds: float) -> None:
    """The criteria as one test suite, a case per criterion and probe."""
    suite = ET.Element("testsuite", name=f"loopscope compare against {baseline}")
    cases = failures = skipped = 0
    for c in criteria:
        by_probe: dict[str, list[Row]] = {}
        for r in rows:
            if c.matches(r):
                by_probe.setdefault(r.probe, []).append(r)
        for probe, mine in (by_probe or {c.probe or "(no probe)": []}).items():
            case = ET.SubElement(suite, "testcase", name=f"{c.expr} · {probe}", classname=f"loopscope.compare.{probe}", time="0")
            cases += 1
            verdicts = [(r, c.verdict(r)) for r in mine]
            failed = [r.line() for r, v in verdicts if v == "fail"]
            undecided = [r.line() + (": no interval" if r.ci95 is None else ": the interval straddles the bound") for r, v in verdicts if v == "inconclusive"]
            if failed:
                failures += 1
                el = ET.SubElement(case, "failure", message=f"{c.expr}: {len(failed)} row(s) wholly past the bound", type="regression")
                el.text = "\n".join(failed)
            elif undecided or not mine:
                msg = f"{c.expr}: inconclusive: the data cannot decide" + (f" ({len(undecided)} row(s))" if mine else f" (no row has {c.metric})")
                if strict:
                    failures += 1
                    el = ET.SubElement(case, "failure", message=msg, type="inconclusive")
                else:
                    skipped += 1
                    el = ET.SubElement(case, "skipped", message=msg)
                el.text = "\n".join(undecided)
    suite.set("tests", str(cases))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    suite.set("time", f"{seconds:.3f}")
    root = ET.Element("testsuites", name="loopscope", tests=str(cases), failures=str(failures), errors="0", skipped=str(skipped), time=f"{seconds:.3f}")
    root.append(suite)
    ET.indent(root)
    path.write_bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n")
