"""What a run directory holds, made safe to print on a terminal.

summary.json, configs and metric names are whatever the run (or whoever wrote the directory)
put there. Printed as they are, control characters act on the terminal: `\\x1b[2J` clears the
screen, `\\r` or a cursor move overwrites a line ("failed" shown as "completed"), and Unicode's
bidirectional overrides show text in another order. `raydra show` and `raydra compare` print
through `inert`, which writes each such character as its escape instead.
"""

import re

# C0 controls but tab and newline (which lay out the text), DEL, C1 controls (the 8-bit CSI 0x9b
# among them), and the bidirectional marks, embeddings, overrides and isolates.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def inert(text: str) -> str:
    """`text` with every control character written as its escape (`\\x1b`, `\\r` as `\\x0d`)."""
    return CONTROL.sub(_escape, text)
