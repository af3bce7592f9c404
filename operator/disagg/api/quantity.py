"""Kubernetes resource quantities: the grammar the API server accepts, and their value.

The grammar is resource.Quantity's (k8s.io/apimachinery/pkg/api/resource/quantity.go)::

    <quantity>        ::= <signedNumber><suffix>
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= m | "" | k | M | G | T | P | E   (and n, u)
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>

:data:`QUANTITY_PATTERN` is the pattern controller-gen puts on every ``resource.Quantity`` of a CRD
(kubernetes-sigs/controller-tools, pkg/crd/known_types.go), narrowed: no negative amounts (container
resources and volume sizes can't be negative) and an integer exponent of at most two digits, so the API
server is never asked to parse a pathological one. ``"256GB"`` does not match (``GB`` is no suffix:
``256G`` or ``256Gi``).

The API server stores a quantity in canonical form (``"0.5"`` becomes ``"500m"``, ``"1024Mi"`` becomes
``"1Gi"``); :func:`same_quantity` compares by value, so a normalised child is not taken for drift.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

QUANTITY_PATTERN = r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]{1,2}))?$"
QUANTITY_RE = re.compile(QUANTITY_PATTERN)
QUANTITY_HELP = (
    "a Kubernetes quantity such as 500m, 8, 64Gi or 256G (suffixes: Ki Mi Gi Ti Pi Ei n u m k M G T P E)"
)

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_SPLIT = re.compile(r"^\+?([0-9]*\.?[0-9]*)(.*)$")


def is_quantity(value: object) -> bool:
    """Whether the API server accepts ``value`` as a (non-negative) resource quantity."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    return isinstance(value, str) and QUANTITY_RE.match(value) is not None


def quantity_value(value: int | str) -> Decimal:
    """The exact value of a quantity; ValueError when it is not one."""
    if not is_quantity(value):
        raise ValueError(f"{value!r} is not {QUANTITY_HELP}")
    if isinstance(value, int):
        return Decimal(value)
    split = _SPLIT.match(value)
    assert split is not None  # the pattern matched
    number, suffix = split.groups()
    try:
        mantissa = Decimal(number)
    except InvalidOperation as error:  # pragma: no cover - the pattern admits only numbers
        raise ValueError(f"{value!r} is not {QUANTITY_HELP}") from error
    if suffix in _BINARY:
        return mantissa * _BINARY[suffix]
    if suffix in _DECIMAL:
        return mantissa.scaleb(_DECIMAL[suffix])
    return mantissa.scaleb(int(suffix[1:]))  # e/E exponent


def same_quantity(want: object, have: object) -> bool:
    """Whether two values are quantities of equal value (``"0.5"`` and ``"500m"``); False otherwise."""
    if not (isinstance(want, int | str) and isinstance(have, int | str)):
        return False
    if not (is_quantity(want) and is_quantity(have)):
        return False
    return quantity_value(want) == quantity_value(have)
