"""``mpgpu-edu simulate allreduce --algo hierarchical``: JSON, closed form, one-line errors."""

from __future__ import annotations

import json

import pytest

from mpgpu_edu.cli import main
from mpgpu_edu.collectives import cost
from mpgpu_edu.cluster.hardware import LINKS


def test_json_report_on_two_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "allreduce", "--algo", "hierarchical", "--cluster", "2x8xH100-ib",
                 "--bytes", "64MiB", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert {"algo": "hierarchical", "world_size": 16, "nodes": 2, "gpus_per_node": 8,
            "bytes": 2**26}.items() <= r.items()
    nvl, nic = LINKS["nvlink4-nvswitch"], LINKS["ib-ndr"]
    assert (r["inter_node_alpha_s"], r["inter_node_beta_Bps"]) == (nvl.alpha_s + nic.alpha_s,
                                                                   nic.beta_Bps)
    want = cost.hierarchical_allreduce_time(2, 8, 2**26, nvl.alpha_s, nvl.beta_Bps,
                                            nvl.alpha_s + nic.alpha_s, nic.beta_Bps)
    assert r["closed_form_s"] == pytest.approx(want, rel=1e-12)
    assert r["time_s"] >= want  # the preset also charges the additions
    sent = cost.hierarchical_bytes_sent(2, 8, 2**26)
    assert r["bytes_sent_inside_node_per_rank"] == [sent["intra"]] * 16
    assert r["bytes_sent_across_nodes_per_rank"] == [sent["inter"]] * 16
    assert r["busbw"] == pytest.approx(r["algbw"] * 2 * 15 / 16)


def test_text_report_names_both_link_classes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "allreduce", "--algo", "hierarchical", "--cluster", "2x8xA100-ib",
                 "--bytes", "1MiB"]) == 0
    out = capsys.readouterr().out
    for words in ("hierarchical all-reduce of 1.00 MiB", "2 x 8 GPUs", "across nodes",
                  "closed form with both link classes"):
        assert words in out


@pytest.mark.parametrize("argv, words", [
    (["--cluster", "8xA100-nvlink"], "needs a cluster of two or more nodes"),
    (["--cluster", "2x8xH100-ib", "--world-size", "12"], "multiple of 8"),
    (["--cluster", "2x8xH100-ib", "--world-size", "8"], "from 16"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                          words: str) -> None:
    assert main(["simulate", "allreduce", "--algo", "hierarchical", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
