"""What goes to the directory escaped (RFC 4515 filters, RFC 4514 DNs) and what comes
back as text: attribute values, group names, entries."""

from __future__ import annotations

import base64
import re
import uuid
from dataclasses import dataclass
from typing import Any

from ldap3.core.exceptions import LDAPException
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import escape_rdn, parse_dn


def filter_with(template: str, **values: str) -> str:
    """Fill ``{name}`` placeholders with RFC 4515-escaped values (no str.format: a
    filter may hold other braces)."""
    for name, value in values.items():
        template = template.replace("{" + name + "}", escape_filter_chars(value))
    return template


def dn_with(template: str, username: str) -> str:
    # ldap3 escapes NUL as a backslash before a raw NUL; RFC 4514 wants \00.
    value = escape_rdn(username).replace("\\\x00", "\\00")
    return template.replace("{username}", value)


_DN_ESCAPE = re.compile(r"\\([0-9a-fA-F]{2}|.)")


def unescape_dn_value(value: str) -> str:
    """RFC 4514 attribute value to text: ``\\,`` -> ``,``, ``\\2C`` -> ``,``."""
    raw = bytearray()
    pos = 0
    for m in _DN_ESCAPE.finditer(value):
        raw += value[pos : m.start()].encode()
        token = m.group(1)
        raw += bytes.fromhex(token) if len(token) == 2 else token.encode()
        pos = m.end()
    raw += value[pos:].encode()
    return raw.decode("utf-8", errors="replace")


def group_name(dn: str, name_attribute: str) -> str:
    """The group's name from its DN: the first RDN's value when it has the name type."""
    try:
        attr, value, _ = parse_dn(dn)[0]
    except (LDAPException, IndexError):
        return dn
    return unescape_dn_value(value) if attr.lower() == name_attribute.lower() else dn


def text_values(attribute: str, values: list[bytes]) -> list[str]:
    out = []
    for value in values:
        try:
            out.append(value.decode("utf-8"))
        except UnicodeDecodeError:
            if attribute.lower() == "objectguid" and len(value) == 16:
                # AD's canonical GUID string is the little-endian UUID form.
                out.append(str(uuid.UUID(bytes_le=value)))
            else:
                out.append(base64.b64encode(value).decode())
    return out


@dataclass(frozen=True, slots=True)
class Entry:
    dn: str
    # Lower-cased attribute name -> values as text.
    attributes: dict[str, list[str]]

    def first(self, attribute: str) -> str:
        values = self.attributes.get(attribute.lower())
        return values[0] if values else ""

    def all(self, attribute: str) -> list[str]:
        return self.attributes.get(attribute.lower(), [])


def entries_of(response: list[dict[str, Any]] | None) -> list[Entry]:
    # Referrals (AD answers searches at a domain root with some) are not entries.
    return [
        Entry(
            r["dn"],
            {k.lower(): text_values(k, list(v)) for k, v in r.get("raw_attributes", {}).items()},
        )
        for r in response or []
        if r.get("type") == "searchResEntry"
    ]
