"""benchmarks/ncu_stalls.py on a small CSV in ncu's source-page format: totals, shares and the order of the
instructions."""

import pytest

HEADER = ['"Address"', '"Source"', '"Warp Stall Sampling (All Samples)"', '"Instructions Executed"',
          '"stall_barrier"', '"stall_long_sb"', '"stall_barrier (Not Issued)"']


@pytest.fixture(scope="module")
def tool(load_benchmark):
    return load_benchmark("ncu_stalls")


def write_csv(path, rows):
    lines = ['"Kernel Name","_hopper_kernel",', ",".join(HEADER)]
    lines += [",".join(f'"{x}"' for x in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def test_summary_sums_reasons_and_ranks_instructions(tool, tmp_path):
    path = tmp_path / "prof.csv"
    write_csv(path, [["0x7f0000000100", "  LDS R1, [R2]", "3", "40", "1", "2", "9"],
                     ["0x7f0000000110", "  WARPGROUP.DEPBAR.LE gsb0, 0x0", "7", "40", "6", "1", "9"],
                     ["0x7f0000000120", "  EXIT", "-", "4", "-", "-", "-"]])
    text = tool.summary(tool.read(str(path)))
    lines = text.splitlines()
    assert lines[0] == "10 samples"
    assert lines[1].split() == ["barrier", "7", "70.0%"]    # the "Not Issued" column is not a second reason
    assert lines[2].split() == ["long_sb", "3", "30.0%"]
    ranked = [line.split()[0] for line in lines[4:]]
    assert ranked == ["0110", "0100", "0120"]
    assert "DEPBAR" in lines[4] and lines[4].split()[4] == "barrier"


def test_read_rejects_a_file_without_the_source_header(tool, tmp_path):
    path = tmp_path / "details.txt"
    path.write_text("Section: GPU Speed Of Light Throughput\n")
    with pytest.raises(ValueError, match="Address,Source"):
        tool.read(str(path))


def test_summary_rejects_a_profile_without_samples(tool, tmp_path):
    path = tmp_path / "prof.csv"
    write_csv(path, [["0x7f0000000100", "  EXIT", "-", "4", "-", "-", "-"]])
    with pytest.raises(ValueError, match="no warp stall samples"):
        tool.summary(tool.read(str(path)))
