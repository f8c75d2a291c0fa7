"""Generated blocks in markdown files: text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``.

Scripts that produce a table (studies, benchmarks) write it between such markers, so README
and docs numbers are regenerated, never hand-edited.
"""

from __future__ import annotations

import re
from pathlib import Path

from dprec_torch.errors import ConfigError


def splice(path: Path | str, name: str, body: str) -> None:
    """Replace the block ``name`` of the markdown file ``path`` by ``body`` (atomically)."""
    path = Path(path)
    text = path.read_text()
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        raise ConfigError(f"{path} has no '{start}' ... '{end}' block to fill; add the two markers where it belongs")
    block = f"{start}\n{body.strip()}\n{end}"
    new = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(new)
    tmp.replace(path)
