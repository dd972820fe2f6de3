"""The one counter schema: every field documented, the glossary in docs/outputs.md generated from it."""
from __future__ import annotations

import re
from pathlib import Path

from hotcold.counters import FIELDS, StepCounters, all_host, all_resident, glossary_markdown

GLOSSARY = Path(__file__).resolve().parents[1] / "docs" / "outputs.md"


def test_docs_glossary_is_generated_from_the_definition():
    text = GLOSSARY.read_text()
    block = re.search(r"<!-- counters:begin -->\n(.*?)<!-- counters:end -->", text, re.S)
    assert block, "docs/outputs.md lacks the counters block"
    assert block.group(1) == glossary_markdown(), "regenerate the docs/outputs.md glossary from hotcold.counters"
    assert [f"`{f}`" for f in FIELDS] == re.findall(r"^\| (`\w+`) \|", block.group(1), re.M)


def test_fresh_counters_are_zero_but_the_prefetched_batch():
    c = StepCounters().as_dict()
    assert list(c) == list(FIELDS)
    assert c.pop("prefetch_batch") == -1 and set(c.values()) == {0}


def test_resident_and_host_batches_by_hand():
    d = all_resident(10, 4).as_dict()
    assert (d["hits"], d["misses"], d["unique_hits"], d["unique_misses"]) == (10, 0, 4, 0)
    h = all_host(10, 4, dim=8)
    assert (h.hits, h.misses, h.unique_hits, h.unique_misses) == (0, 10, 0, 4)
    assert h.vector_bytes_h2d == h.grad_bytes_d2h == 10 * 8 * 4 and h.activation_bytes == 640
    h.set_param_traffic(3, 2, row_bytes=36)
    assert (h.param_bytes_h2d, h.param_bytes_d2h, h.param_bytes) == (108, 72, 180)
