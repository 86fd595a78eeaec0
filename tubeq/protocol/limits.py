"""The beanstalkd wire protocol's limits and numbers: what a line, a name, a number and a body
may be, each with why its value is right (beanstalkd 1.12's own, or tubeq's for its extensions).

Rules: constants only, imported by the grammar (tubeq.protocol.grammar), the framing
(tubeq.protocol.parser) and every layer that checks a value as the protocol does (the HTTP API,
the command line, the pipeline's writer).
"""

from __future__ import annotations

from typing import Final

from tubeq.model.names import MAX_TUBE_NAME as MAX_TUBE_NAME
from tubeq.model.names import TUBE_NAME_CHARS as TUBE_NAME_CHARS

# ---------------------------------------------------------------------------------------------
# The wire vocabulary
# ---------------------------------------------------------------------------------------------

# A line ends at exactly CR LF; a lone CR or LF is an ordinary byte of the line.
CRLF: Final = b"\r\n"

# The longest tube name (tubeq.model.names: 200, what 1.12 accepts); LINE_MAX below is sized to
# carry it.

# The longest command line, CRLF included. It is beanstalkd's LINE_BUF_SIZE (11 + 201 + 12), just
# enough for the longest legal line: len(b"pause-tube " + b"x" * 200 + b" 4294967295\r\n") == 224.
LINE_MAX: Final = 224

# The longest line of a tubeq extension command (protocol.md, "Extensions"), CRLF included:
# room for options (a dedupe key of up to 200 bytes, several key=value pairs) and for a batch
# of job ids (about 780 ids of 20 digits). Only a line that starts with an extension word may
# pass LINE_MAX, so every beanstalkd line keeps beanstalkd's limit and its BAD_FORMAT.
EXT_LINE_MAX: Final = 16384

# The bytes a tube name is made of: tubeq.model.names's TUBE_NAME_CHARS (re-exported here).

# pri, delay, ttr, body size and pause delay are C uint32 in beanstalkd: 1.12 answers BAD_FORMAT
# above this, so tubeq does too, and the server can rely on every value fitting 32 bits.
U32_MAX: Final = 2**32 - 1

# Job ids are C uint64 in beanstalkd: the largest id a client may name (one more is BAD_FORMAT).
U64_MAX: Final = 2**64 - 1

# beanstalkd's default max-job-size (JOB_DATA_SIZE_LIMIT_DEFAULT, its `-z` flag), so clients see
# JOB_TOO_BIG at the same size: a body of exactly this many bytes is accepted, one more is not.
DEFAULT_MAX_JOB_SIZE: Final = 65535

# reserve-with-timeout is read with strtol and kick with strtoul; on the reference build (Debian,
# x86-64, LP64) `long` is 64 bits, so these are the ranges past which they fail with ERANGE.
C_LONG_MIN: Final = -(2**63)
C_LONG_MAX: Final = 2**63 - 1
C_ULONG_MAX: Final = 2**64 - 1

# The most jobs one list-jobs page may ask for: a page is one script call (1,000 jobs measured
# 2-7 ms of Redis time on a loaded 2-core machine) and its reply stays under 64 KiB (about 20
# bytes a ready job, 45 a delayed one).
LIST_JOBS_MAX: Final = 1000
