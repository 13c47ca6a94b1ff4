"""How GitHub renames release-asset file names, as far as public evidence shows.

GitHub documents only that it "renames asset filenames that have special characters,
non-alphanumeric characters, and leading or trailing periods". What this module implements, and
the evidence for it:

- Characters outside ``A-Z a-z 0-9 . _ - +`` become ``.``; a run of such characters together with
  neighbouring dots collapses to a single ``.``. Evidence: an upload of every printable ASCII
  character (travis-ci/dpl#821) turned ``a5_ !#$%&'()+,-.0123456789;=@ABC...`` into
  ``a5_.-.0123456789.ABC...``; spaces, ``~``, ``:``, ``(``, ``)`` reported as dots
  (softprops/action-gh-release#159, actions/upload-release-asset#57, cli/cli#10585).
- ``+`` is kept: it only turned into ``.`` when the client left it unencoded in the query string,
  where it decodes to a space (github/rest-api-description#2968); flash-attention wheel releases
  keep ``+`` in asset names. Our server decodes the query like GitHub, so an unencoded ``+`` arrives
  as a space and becomes ``.``.
- Latin letters with diacritics are transliterated (``ż`` -> ``z``, ``æ`` -> ``ae``, ``ð`` -> ``d``,
  ``ŋ`` -> ``ng``); other non-ASCII characters become ``.`` (travis-ci/dpl#821).
- A leading ``.`` gets the prefix ``default`` (``.env`` -> ``default.env``, as reported for dotfile
  assets in softprops/action-gh-release#741) and trailing dots are dropped. These two are the least
  certain rules; the client never relies on them, it refuses such names before uploading.
"""

from __future__ import annotations

import re
import unicodedata

SAFE = re.compile(r"[A-Za-z0-9._+-]")
_TRANSLIT = {"æ": "ae", "Æ": "AE", "ð": "d", "Ð": "D", "ŋ": "ng", "Ŋ": "NG", "ø": "o", "Ø": "O",
             "ł": "l", "Ł": "L", "ß": "ss", "þ": "th", "Þ": "TH", "œ": "oe", "Œ": "OE", "đ": "d", "Đ": "D"}


def _translit(ch: str) -> str:
    if ch in _TRANSLIT:
        return _TRANSLIT[ch]
    decomposed = unicodedata.normalize("NFKD", ch)
    base = "".join(c for c in decomposed if not unicodedata.combining(c))
    if base and all(SAFE.fullmatch(c) for c in base) and base != ch:
        return base
    return "."


def normalize_asset_name(name: str) -> str:
    out = []
    for ch in name:
        if SAFE.fullmatch(ch):
            out.append(ch)
        elif ord(ch) > 127:
            out.append(_translit(ch))
        else:
            out.append(".")
    result = re.sub(r"\.{2,}", ".", "".join(out))
    result = result.rstrip(".")
    if result.startswith("."):
        result = "default" + result
    return result or "default"
