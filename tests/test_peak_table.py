"""The datasheet peak table behind MFU: every row cites its source, dense figures only, and boards of
one chip that run at different clocks (H200 SXM against H200 NVL) get their own figures."""
import re

import pytest

from labkit.engine.device import PEAK_TABLE, TB, table_peak

ROWS = [pytest.param(names, peaks, source, id=names[0]) for names, peaks, source in PEAK_TABLE]


@pytest.mark.parametrize("names, peaks, source", ROWS)
def test_every_row_names_its_document(names, peaks, source):
    # a citation a reader can look up: the vendor, a document (datasheet, whitepaper or web page) and a figure
    assert isinstance(source, str) and source.startswith("NVIDIA"), source
    assert re.search(r"datasheet|whitepaper|web page|nvidia\.com", source), source
    assert re.search(r"\d", source), f"{names[0]}: quote the document's figure so it can be checked"


@pytest.mark.parametrize("names, peaks, source", ROWS)
def test_rows_are_dense_and_consistent(names, peaks, source):
    assert set(peaks) <= {"bf16", "fp16", "tf32", "fp32"} and "fp32" in peaks
    if "bf16" in peaks:
        # bf16 and fp16 run on the same tensor cores at the same rate; tf32 at half that (dense, Ampere on)
        assert peaks["fp16"] == peaks["bf16"]
        assert peaks["tf32"] == pytest.approx(peaks["bf16"] / 2, rel=0.02)
    if "*" in source and "|" not in source:
        # the document printed only the with-sparsity figure: the row must say it halved it
        assert "halved" in source, f"{names[0]}: say that the sparse figure was halved"


def _quoted(pattern, source):
    m = re.search(pattern, source)
    return float(m.group(1).replace(",", "")) if m else None


@pytest.mark.parametrize("names, peaks, source", ROWS)
def test_values_match_the_figures_quoted_from_the_document(names, peaks, source):
    # "BF16 1,979*" (with sparsity only) -> half of it; "BF16 312 | 624*" or "accumulate 165.2 |" -> as printed
    sparse_bf16 = _quoted(r"BF16 ([\d,.]+)\*", source)
    dense_bf16 = _quoted(r"(?:BF16|accumulate) ([\d,.]+) \|", source)
    sparse_tf32 = _quoted(r"TF32 ([\d,.]+)\*", source)
    fp32 = _quoted(r"FP32 ([\d.]+)\)", source) or _quoted(r"FP32 ([\d.]+)[;,)]", source)
    assert fp32 == peaks["fp32"], f"{names[0]}: fp32 {peaks['fp32']} but the source quotes {fp32}"
    if "bf16" in peaks:
        want = dense_bf16 if dense_bf16 is not None else sparse_bf16 / 2
        assert peaks["bf16"] == pytest.approx(want), names[0]
    if sparse_tf32 is not None:
        assert peaks["tf32"] == pytest.approx(sparse_tf32 / 2), names[0]


def test_no_device_name_is_in_two_rows():
    names = [n for row in PEAK_TABLE for n in row[0]]
    assert len(names) == len(set(names))


def test_h200_nvl_is_its_own_lower_clocked_row():
    # NVIDIA's H200 NVL figures: BF16 1,671 TFLOP/s with sparsity -> 835.5 dense; FP32 60 (SXM: 67)
    for p in ("bf16", "fp16", "tf32", "fp32"):
        nvl, nvl_source = table_peak("NVIDIA H200 NVL", p)
        sxm, sxm_source = table_peak("NVIDIA H200", p)
        assert nvl < sxm, p
        assert "NVL" in nvl_source and "SXM" in sxm_source
    assert table_peak("NVIDIA H200 NVL", "bf16")[0] == pytest.approx(835.5 * TB)
    assert table_peak("NVIDIA H200 NVL", "fp32")[0] == pytest.approx(60.0 * TB)
    assert table_peak("NVIDIA H200", "bf16")[0] == pytest.approx(989.5 * TB)


def test_nvl_and_pcie_boards_are_below_their_sxm_parts():
    for slower in ("NVIDIA H100 NVL", "NVIDIA H100 PCIe"):
        for p in ("bf16", "tf32", "fp32"):
            assert table_peak(slower, p)[0] < table_peak("NVIDIA H100 80GB HBM3", p)[0], (slower, p)


@pytest.mark.parametrize("name, sparse_bf16", [("NVIDIA H200", 1979), ("NVIDIA H200 NVL", 1671),
                                                ("NVIDIA H100 80GB HBM3", 1979), ("NVIDIA H100 PCIe", 1513),
                                                ("NVIDIA A100-SXM4-80GB", 624), ("NVIDIA L4", 242)])
def test_never_the_sparse_headline(name, sparse_bf16):
    assert table_peak(name, "bf16")[0] == pytest.approx(sparse_bf16 / 2 * TB, rel=0.01)


def test_cards_without_bf16_tensor_cores_have_no_bf16_row():
    for name in ("Tesla T4", "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-32GB"):
        assert table_peak(name, "bf16") == (None, None)
        assert table_peak(name, "tf32") == (None, None)
        assert table_peak(name, "fp16")[0] is not None


# labkit/whatif/devices.json (the roofline catalogue) keeps its own dense peaks: the two must not drift apart.
CATALOGUE = {"h200-sxm": "NVIDIA H200", "h200-nvl": "NVIDIA H200 NVL", "h100-sxm": "NVIDIA H100 80GB HBM3",
             "h100-pcie": "NVIDIA H100 PCIe", "a100-40gb": "NVIDIA A100-SXM4-40GB",
             "a100-80gb": "NVIDIA A100-SXM4-80GB", "l4": "NVIDIA L4", "t4": "Tesla T4",
             "rtx4090": "NVIDIA GeForce RTX 4090"}


def test_the_device_catalogue_agrees_with_the_peak_table():
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "labkit" / "whatif" / "devices.json"
    if not path.exists():
        pytest.skip("no labkit/whatif/devices.json")
    devices = json.loads(path.read_text())["devices"]
    for key, name in CATALOGUE.items():
        if key not in devices:
            continue
        for p, entry in devices[key]["peak_tflops"].items():
            value = entry.get("value") if isinstance(entry, dict) else entry
            mine = table_peak(name, p)[0]
            assert (value is None) == (mine is None), (key, p)
            if mine is not None:
                assert value * TB == pytest.approx(mine), (key, p, value, mine / TB)
