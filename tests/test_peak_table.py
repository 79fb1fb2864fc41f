"""The one peak source behind MFU and the what-if model (labkit/engine/gpus.py, reading
labkit/whatif/devices.json): every board names its document and the figures it prints, the peaks are
those figures' dense values, boards of one chip at different clocks (H200 SXM against H200 NVL) have
their own figures, and ``device.PEAK_TABLE`` / ``device.table_peak`` are that source, not a copy."""
import re

import pytest

from labkit.engine import device, gpus
from labkit.engine.device import PEAK_TABLE, TB, table_peak

CAT = gpus.catalogue()
BOARDS = [pytest.param(b, id=b["names"][0]) for b in CAT["boards"]]
FORMATS = ("bf16", "fp16", "tf32", "fp32")


def test_the_engine_reads_the_one_catalogue_file():
    assert gpus.CATALOGUE_FILE.name == "devices.json" and gpus.CATALOGUE_FILE.parent.name == "whatif"
    assert device.PEAK_TABLE is gpus.PEAK_TABLE and device.table_peak is gpus.table_peak
    from labkit import whatif

    assert whatif.catalogue() is gpus.catalogue()  # the what-if model reads the same parsed file
    # no second copy of a peak: only a board the roofline catalogue lacks carries its own numbers
    for b in CAT["boards"]:
        assert ("device" in b) != ("peak_tflops" in b), b["names"]


@pytest.mark.parametrize("board", BOARDS)
def test_every_board_names_a_known_document_and_quotes_its_figures(board):
    src = CAT["sources"][board["source"]]
    assert src["kind"] in ("datasheet", "whitepaper", "vendor web page") and src["url"].startswith("https://")
    assert re.search(r"\d", board["quote"]), f"{board['names'][0]}: quote the document's figures"
    source = gpus.board_source(board)
    assert source.startswith(src["title"]) and board["quote"] in source


@pytest.mark.parametrize("board", BOARDS)
def test_a_board_shares_its_catalogue_devices_peaks(board):
    if "device" not in board:
        assert set(board["peak_tflops"]) == set(FORMATS)
        return
    dev = CAT["devices"][board["device"]]
    want = {p: e["value"] for p, e in dev["peak_tflops"].items() if e["value"] is not None}
    assert gpus.board_peaks(board) == want
    assert all(dev["hardware_units"][p] for p in want)


@pytest.mark.parametrize("board", BOARDS)
def test_peaks_are_dense_and_consistent(board):
    values = gpus.board_peaks(board)
    assert set(values) <= set(FORMATS) and "fp32" in values
    if "bf16" in values:
        # bf16 and fp16 run on the same tensor cores at the same rate; tf32 at half that (dense, Ampere on)
        assert values["fp16"] == values["bf16"]
        assert values["tf32"] == pytest.approx(values["bf16"] / 2, rel=0.02)
    if "*" in board["quote"] and "|" not in board["quote"]:
        # the document printed only the with-sparsity figure: the source must say it was halved
        assert "halved" in gpus.board_source(board)


def _quoted(pattern, text):
    m = re.search(pattern, text)
    return float(m.group(1).replace(",", "")) if m else None


@pytest.mark.parametrize("board", BOARDS)
def test_values_follow_from_the_quoted_figures(board):
    # "BF16 1,979*" (with sparsity only) -> half of it; "BF16 312 | 624*" or "accumulate 165.2 |" -> as printed
    quote, values = board["quote"], gpus.board_peaks(board)
    sparse_bf16 = _quoted(r"BF16 ([\d,.]+)\*", quote)
    dense_bf16 = _quoted(r"(?:BF16|accumulate) ([\d,.]+) \|", quote)
    sparse_tf32 = _quoted(r"TF32 ([\d,.]+)\*", quote)
    fp32 = _quoted(r"FP32 ([\d.]+)\)", quote) or _quoted(r"FP32 ([\d.]+)[;,)]", quote)
    assert fp32 == values["fp32"], f"{board['names'][0]}: fp32 {values['fp32']} but the quote says {fp32}"
    if "bf16" in values:
        want = dense_bf16 if dense_bf16 is not None else sparse_bf16 / 2
        assert values["bf16"] == pytest.approx(want), board["names"]
    if sparse_tf32 is not None:
        assert values["tf32"] == pytest.approx(sparse_tf32 / 2), board["names"]


def test_no_device_name_is_in_two_boards():
    names = [n for row in PEAK_TABLE for n in row[0]]
    assert len(names) == len(set(names))


def test_the_table_is_the_boards_in_order():
    # notebook 01 prints rows of PEAK_TABLE by position: its order is the file's
    assert [row[0] for row in PEAK_TABLE] == [tuple(b["names"]) for b in CAT["boards"]]
    assert PEAK_TABLE[0][0][0] == "NVIDIA H200" and PEAK_TABLE[7][0][0] == "NVIDIA A10"


def test_h200_nvl_is_its_own_lower_clocked_board():
    # NVIDIA's H200 NVL figures: BF16 1,671 TFLOP/s with sparsity -> 835.5 dense; FP32 60 (SXM: 67)
    for p in FORMATS:
        nvl, nvl_source = table_peak("NVIDIA H200 NVL", p)
        sxm, sxm_source = table_peak("NVIDIA H200", p)
        assert nvl < sxm, p
        assert "NVL column" in nvl_source and "SXM column" in sxm_source
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


def test_cards_without_bf16_tensor_cores_have_no_bf16_peak():
    for name in ("Tesla T4", "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-32GB"):
        assert table_peak(name, "bf16") == (None, None)
        assert table_peak(name, "tf32") == (None, None)
        assert table_peak(name, "fp16")[0] is not None


def test_an_unknown_board_has_no_datasheet_peak():
    assert table_peak("NVIDIA H100", "fp64") == (None, None)
    assert table_peak("Some Future GPU", "bf16") == (None, None)
