"""Generated markdown blocks are replaced between their markers, and a missing marker is a clear error."""

from __future__ import annotations

import pytest

from dprec_torch.errors import ConfigError
from dprec_torch.study.markers import splice


def test_splice_replaces_only_its_block(tmp_path) -> None:
    doc = tmp_path / "README.md"
    doc.write_text("head\n<!-- a:start -->\nold a\n<!-- a:end -->\nmid\n<!-- b:start -->\nold b\n<!-- b:end -->\ntail\n")
    splice(doc, "a", "| new | a |\n")
    assert doc.read_text() == ("head\n<!-- a:start -->\n| new | a |\n<!-- a:end -->\nmid\n"
                               "<!-- b:start -->\nold b\n<!-- b:end -->\ntail\n")
    splice(doc, "a", "back\\slash \\1 kept")  # no regex escapes interpreted in the body
    assert "back\\slash \\1 kept" in doc.read_text()


def test_missing_marker_names_the_fix(tmp_path) -> None:
    doc = tmp_path / "README.md"
    doc.write_text("no markers here\n")
    with pytest.raises(ConfigError, match="<!-- x:start -->"):
        splice(doc, "x", "body")
    assert doc.read_text() == "no markers here\n"
