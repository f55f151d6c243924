"""A written report: every file there and non-empty, each CSV the figure's data, the HTML self-contained
and embedding every figure (golden check), the Markdown linking every PNG."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pandas as pd
import pytest

from planner.result_json import infeasible_json
from reports.build import ReportInputs, build_charts, write_report
from simulator import Result, simulate_plan
from tiersim.api import JobRequest, make_job, make_plan

COVERAGE = {"kind": "tiersim.coverage", "hardware": "a100", "rows": [
    {"policy": p, "model": m, "params": n, "feasible": ok, "tokens_per_s": t, "tflops_per_gpu": f, "binding": b,
     "knobs": {}}
    for p, rows in {"none": [("gpt2", 1.2e8, True, 95000.0, 140.0, None), ("7b", 6.7e9, False, None, None, "gpu0")],
                    "zero-offload": [("gpt2", 1.2e8, True, 61000.0, 90.0, None),
                                     ("7b", 6.7e9, True, 2100.0, 88.0, None)]}.items()
    for m, n, ok, t, f, b in rows]}
WHATIF = {"kind": "tiersim.whatif", "hardware": "a100x8", "model": "70b", "base": {"tokens_per_s": 2236.0},
          "scenarios": [], "sensitivity": [
              {"change": "pcie.gen=5", "base_tokens_per_s": 2236.0, "tokens_per_s": 2800.0, "gain": 0.25,
               "makes_feasible": False},
              {"change": "host.dram=512GB", "base_tokens_per_s": 2236.0, "tokens_per_s": 1900.0, "gain": -0.15,
               "makes_feasible": False}]}
REPLAY = {"policy": "zero-offload", "hardware": "calibrated",
          "simulated": {"step_time_s": 0.21, "peak_bytes": {"gpu0": 3.1e6, "cpu": 9.0e6}},
          "measured": {"step_time_s": 0.26, "peak_bytes": {"gpu0": 3.2e6, "cpu": 9.0e6}}, "error": {}}


@pytest.fixture(scope="module")
def inputs() -> ReportInputs:
    from policies import PlanInfeasible

    job, _ = make_job("a100", "gpt2", JobRequest(global_batch=4))
    r = simulate_plan(make_plan(job, "zero-offload"), job.hw)
    bad = infeasible_json(PlanInfeasible("none", "gpu0", 120e9, 79.5e9, "the model states"), job)
    return ReportInputs(items=[r, bad], coverage=[COVERAGE], whatif=[WHATIF], replay=[(None, REPLAY)],
                        title="gpt2 on a100", sources=["test"])


@pytest.fixture(scope="module")
def written(inputs: ReportInputs, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("report") / "out"
    return out, write_report(out, inputs, workers=1)


def test_every_figure_is_written_as_png_svg_and_csv(written: tuple[Path, list[Path]], inputs: ReportInputs) -> None:
    out, paths = written
    names = [c.name for c in build_charts(inputs)]
    assert [int(n[3]) for n in names] == [1, 2, 3, 4, 5, 6, 7]
    for n in names:
        for ext in (".png", ".svg", ".csv"):
            assert (out / f"{n}{ext}").stat().st_size > 0, n + ext
        assert (out / f"{n}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / f"{n}.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    assert sorted(paths) == sorted([out / f"{n}{e}" for n in names for e in (".png", ".svg", ".csv")]
                                   + [out / "report.html", out / "report.md"])
    assert all(p.stat().st_size > 0 for p in paths)


def test_csvs_hold_the_figures_data(written: tuple[Path, list[Path]], inputs: ReportInputs) -> None:
    out, _ = written
    r = inputs.results[0]
    comp = pd.read_csv(out / "fig1-comparison.csv")
    assert list(comp["policy"]) == ["zero-offload", "none"]
    assert comp["tokens_per_s"].iloc[0] == pytest.approx(r.tokens_per_s, rel=1e-12)
    assert comp["gpu_peak_bytes"].iloc[0] == pytest.approx(r.peak_bytes["gpu0"], rel=1e-12)
    assert comp["over_by_bytes"].iloc[1] == pytest.approx(120e9 - 79.5e9)
    mem = pd.read_csv(out / "fig2-memory-zero-offload.csv")
    assert mem[mem["pool"] == "gpu0"]["total_bytes"].max() <= r.peak_bytes["gpu0"] * (1 + 1e-12)
    tl = pd.read_csv(out / "fig3-timeline-zero-offload.csv", keep_default_na=False)
    lo, hi = r.window
    assert len(tl[tl["task"] != ""]) == sum(1 for x in r.records if x.device in ("gpu0", "cpu")
                                            and x.end > lo and x.start < hi and x.end > x.start)
    links = pd.read_csv(out / "fig4-links-zero-offload.csv")
    assert set(links["link"]) == {"gpu0.pcie"} and links["rate_Bps"].max() <= links["capacity_Bps"].max()
    cov = pd.read_csv(out / "fig5-coverage-a100.csv")
    assert len(cov) == 4 and cov["tokens_per_s"].max() == 95000.0
    wi = pd.read_csv(out / "fig6-whatif-70b-a100x8.csv")
    assert list(wi["change"]) == ["pcie.gen=5", "host.dram=512GB"]
    rep = pd.read_csv(out / "fig7-replay.csv")
    assert rep[rep["figure"] == "step time"]["error"].iloc[0] == pytest.approx(0.26 / 0.21 - 1)


def test_html_is_self_contained_and_embeds_every_figure(written: tuple[Path, list[Path]],
                                                        inputs: ReportInputs) -> None:
    out, _ = written
    html = (out / "report.html").read_text()
    figures = re.findall(r'<figure id="([^"]+)"[^>]*>\s*<img src="data:image/png;base64,([^"]+)"', html)
    assert [n for n, _ in figures] == [c.name for c in build_charts(inputs)]
    for name, b64 in figures:  # golden: the embedded image is the PNG written beside it, byte for byte
        assert base64.b64decode(b64) == (out / f"{name}.png").read_bytes()
    # nothing fetched from elsewhere: no scripts, stylesheets or images by URL
    assert not re.search(r"<script|<link|src=\"(?!data:)|url\(", html)
    assert "<table" in html and "zero-offload" in html and "NO: gpu0 over by 40.5 GB" in html


def test_markdown_links_every_png_and_csv(written: tuple[Path, list[Path]], inputs: ReportInputs) -> None:
    out, _ = written
    md = (out / "report.md").read_text()
    for c in build_charts(inputs):
        assert f"]({c.name}.png)" in md and f"]({c.name}.csv)" in md
    assert "| policy | feasible |" in md


def test_the_same_inputs_write_the_same_files(tmp_path: Path) -> None:
    one = ReportInputs(coverage=[COVERAGE], whatif=[WHATIF], title="t")
    write_report(tmp_path / "a", one, workers=1)
    write_report(tmp_path / "b", one, workers=2)  # rendered in worker processes: the same bytes
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name


def test_a_result_that_runs_out_of_memory_still_gets_its_figures(tmp_path: Path) -> None:
    job, _ = make_job("a100", "gpt2", JobRequest(micro_batch=256, global_batch=256, checkpointing="none"))
    r: Result = simulate_plan(make_plan(job, "none"), job.hw)
    assert not r.feasible
    charts = build_charts(ReportInputs(items=[r]))
    assert [c.number for c in charts] == [1, 2, 3]  # no link carries bytes: no figure 4
    assert "INFEASIBLE" in charts[1].title
    assert charts[0].data["over_by_bytes"].iloc[0] == pytest.approx(r.oom.over_by_bytes)
