"""Hardware profiles: every number positive, cited, and consistent with its spec sheet."""

from __future__ import annotations

import pytest

from mpgpu_edu.cluster.hardware import DTYPES, GIB, GPUS, LINKS, GPUSpec, LinkSpec


@pytest.mark.parametrize("key", ["RTX4090-24GB", "A100-80GB", "H100-SXM-80GB"])
def test_required_gpus_exist(key: str) -> None:
    assert GPUS[key].name == key


@pytest.mark.parametrize("key", ["pcie4-x16", "pcie5-x16", "nvlink3", "nvlink4-nvswitch",
                                 "ib-hdr", "ib-ndr", "loopback-gloo"])
def test_required_links_exist(key: str) -> None:
    assert LINKS[key].name == key


@pytest.mark.parametrize("spec", list(GPUS.values()), ids=list(GPUS))
def test_gpu_numbers_positive_and_cited(spec: GPUSpec) -> None:
    assert set(spec.peak_flops) == set(DTYPES)
    assert all(flops > 0 for flops in spec.peak_flops.values())
    assert spec.memory_bytes > 0
    assert spec.source.strip()
    assert spec.display_name


@pytest.mark.parametrize("spec", list(LINKS.values()), ids=list(LINKS))
def test_link_numbers_positive_and_cited(spec: LinkSpec) -> None:
    assert spec.alpha_s >= 0  # 0 only for the shared parts (host memory, socket link)
    assert spec.beta_Bps > 0
    assert spec.source.strip()
    # Each link says whether its bandwidth is a peak or an effective number (or a default).
    assert any(word in spec.source for word in ("peak", "effective", "rough default"))


def test_spec_sheet_values() -> None:
    assert GPUS["H100-SXM-80GB"].peak_flops["bf16"] == pytest.approx(989.5e12)
    assert GPUS["A100-80GB"].peak_flops["bf16"] == pytest.approx(312e12)
    assert GPUS["RTX4090-24GB"].peak_flops["fp32"] == pytest.approx(82.6e12)
    assert GPUS["RTX4090-24GB"].memory_bytes == 24 * GIB
    assert GPUS["A100-80GB"].memory_bytes == 80 * GIB
    assert LINKS["nvlink3"].peak_Bps == pytest.approx(300e9)
    assert LINKS["nvlink4-nvswitch"].peak_Bps == pytest.approx(450e9)
    assert LINKS["ib-hdr"].peak_Bps == pytest.approx(200e9 / 8)
    assert LINKS["ib-ndr"].peak_Bps == pytest.approx(400e9 / 8)
    assert LINKS["host-ddr4-8ch"].peak_Bps == pytest.approx(8 * 3200e6 * 8)


@pytest.mark.parametrize("key", ["pcie4-x16", "pcie5-x16", "nvlink3", "nvlink4-nvswitch",
                                 "ib-hdr", "ib-ndr", "host-ddr4-8ch", "upi-xeon"])
def test_effective_is_below_peak_and_both_are_cited(key: str) -> None:
    spec = LINKS[key]
    assert 0 < spec.beta_Bps < spec.peak_Bps
    assert "peak" in spec.source and "effective" in spec.source


def test_effective_matches_published_nccl_tests() -> None:
    # Large-message busbw: 8x H100 ring ~370 GB/s (NVIDIA/nccl-tests#212), 8x A100 ~200-240
    # (#149, #212), NDR 46-48 GB/s per NIC (#290), HDR ~24 per NIC (#119).
    assert LINKS["nvlink4-nvswitch"].beta_Bps == pytest.approx(370e9)
    assert 200e9 <= LINKS["nvlink3"].beta_Bps <= 240e9
    assert 46e9 <= LINKS["ib-ndr"].beta_Bps <= 48e9
    assert LINKS["ib-hdr"].beta_Bps == pytest.approx(24e9)


def test_effective_pcie_is_below_raw_rate() -> None:
    raw_gen4 = 16e9 * 16 * 128 / 130 / 8  # 16 GT/s x 16 lanes, 128b/130b, bits -> bytes
    assert 0.7 * raw_gen4 < LINKS["pcie4-x16"].beta_Bps < raw_gen4
    assert 0.7 * 2 * raw_gen4 < LINKS["pcie5-x16"].beta_Bps < 2 * raw_gen4


def test_the_ordering_the_course_teaches() -> None:
    # NVLink beats PCIe by about an order of magnitude; NVLink latency is lower than PCIe's.
    assert LINKS["nvlink3"].peak_Bps > 9 * LINKS["pcie4-x16"].peak_Bps
    assert LINKS["nvlink3"].beta_Bps > 8 * LINKS["pcie4-x16"].beta_Bps
    assert LINKS["nvlink4-nvswitch"].beta_Bps > LINKS["nvlink3"].beta_Bps
    assert LINKS["nvlink3"].alpha_s < LINKS["pcie4-x16"].alpha_s
    # Tensor cores: half precision is faster than fp32 on every GPU.
    for key in ("RTX4090-24GB", "A100-80GB", "H100-SXM-80GB"):
        assert GPUS[key].peak_flops["bf16"] > GPUS[key].peak_flops["fp32"]


def test_link_seconds_is_alpha_beta() -> None:
    link = LINKS["pcie4-x16"]
    assert link.seconds(0) == link.alpha_s
    assert link.seconds(10**9) == pytest.approx(link.alpha_s + 1e9 / link.beta_Bps)


def test_specs_are_frozen_and_hashable() -> None:
    with pytest.raises(AttributeError):
        GPUS["A100-80GB"].memory_bytes = 1  # type: ignore[misc]
    assert len({GPUS["A100-80GB"], GPUS["A100-80GB"]}) == 1
