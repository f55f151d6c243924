"""`tiersim hardware|models|policies list|show`."""

from __future__ import annotations

import pytest

from hardware_models import list_presets, load_hardware
from policies import POLICIES, knob_help
from tiersim.cli import main
from workloads import list_models, load_model


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert (rc, err) == (0, ""), err
    return out


def _first_column(out: str) -> list[str]:
    lines = out.splitlines()
    assert set(lines[1].replace(" ", "")) == {"-"}  # header rule
    return [ln.split()[0] for ln in lines[2:]]


def test_hardware_list_names_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "hardware", "list")
    assert _first_column(out) == list_presets()
    row = next(ln for ln in out.splitlines() if ln.startswith("a100x8 "))
    assert "8x A100-SXM4-80GB" in row


def test_hardware_show_with_an_override(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "hardware", "show", "a100")
    assert out.startswith("a100: ") and "A100-SXM4-80GB" in out
    for field in ("gpu:", "host:", "pcie:", "nvme:", "peak_flops.bf16", "dram", "derived:"):
        assert field in out, field
    spec = load_hardware("a100")
    assert f"[{spec.sources['gpu.hbm_bw']}]" in out  # every figure with its source
    overridden = run(capsys, "hardware", "show", "a100", "--set", "host.dram=1TB")
    dram = next(ln for ln in overridden.splitlines() if ln.split()[:1] == ["dram"])
    assert "1.00 TB" in dram and "[override: host.dram=1TB]" in dram, dram


def test_models_list_names_every_model(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "models", "list")
    assert _first_column(out) == list_models()
    row = next(ln for ln in out.splitlines() if ln.startswith("llama2-70b "))
    assert f"{load_model('llama2-70b').params() / 1e9:.2f}B" in row


@pytest.mark.parametrize("name", ["7b", "llama2-7b", "gpt2"])
def test_models_show(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    m = load_model(name)
    out = run(capsys, "models", "show", name)
    rows = {ln.split()[0]: ln.split(None, 1)[1] for ln in out.splitlines() if ln.strip()}
    assert rows["name"] == m.name
    assert rows["n_layers"] == str(m.n_layers) and rows["hidden"] == str(m.hidden)
    assert rows["params"] == f"{m.params():,}"


def test_policies_list_names_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "policies", "list")
    assert _first_column(out) == list(POLICIES)
    for p in POLICIES.values():
        assert p.summary in out


@pytest.mark.parametrize("name", list(POLICIES))
def test_policies_show_lists_every_knob(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    info = POLICIES[name]
    out = run(capsys, "policies", "show", name)
    assert out.startswith(info.doc.strip().splitlines()[0])
    knob_rows = out.rsplit("\nknob ", 1)[1].splitlines()[2:]  # after the table header and its rule
    assert [r.split()[0] for r in knob_rows] == [k for k, _, _ in knob_help(info)]
    for k, typ, default in knob_help(info):
        assert next(r for r in knob_rows if r.split()[0] == k).split()[1:] == [typ, default]
