"""Names clients give: what a tube name is made of, and how long it may be (beanstalkd's rules;
tubeq.protocol.limits re-exports them for the wire, tubeq.model.options checks a tube option
by them)."""

from __future__ import annotations

from typing import Final

# The longest tube name: beanstalkd's MAX_TUBE_NAME_LEN is 201 including the C string's NUL, so
# 200 is what 1.12 accepts (201 is BAD_FORMAT).
MAX_TUBE_NAME: Final = 200

# The bytes a tube name is made of (beanstalkd's NAME_CHARS); a name may not start with "-".
TUBE_NAME_CHARS: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-+/;.$_()"
