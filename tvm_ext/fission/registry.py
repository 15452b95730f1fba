"""The registry of fission rules: rule name -> module pass class.

One more rule is one :func:`register_fission_rule` call next to its pass class; the umbrella
:class:`~tvm_ext.fission.umbrella.Fission` and :func:`list_fission_rules` see it at once.

Example
-------
>>> from tvm_ext.fission import get_fission_rule, list_fission_rules
>>> "softmax" in list_fission_rules()
True
>>> mod = get_fission_rule("softmax")()(mod)
"""
from __future__ import annotations

from tvm_ext.errors import TvmExtError

#: Rule name -> module pass class, in registration order (the order :class:`Fission` applies them).
_RULES: dict[str, type] = {}


class UnknownFissionRuleError(TvmExtError, KeyError):
    """A fission rule name that no rule was registered under (also a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


def register_fission_rule(name: str, pass_cls: type) -> type:
    """Register ``pass_cls`` (a ``tvm.transform.module_pass`` class) as the rule ``name``.

    Parameters
    ----------
    name : str
        The rule's name, e.g. ``"softmax"``; :class:`Fission` takes it in ``ops``.
    pass_cls : type
        A class whose instances are module passes (built with no arguments).

    Returns
    -------
    type
        ``pass_cls``, so the call can close a class definition.

    Raises
    ------
    ValueError
        ``name`` is taken by another class (a programming error, not user input).

    Example
    -------
    >>> register_fission_rule("my_op", FissionMyOp)
    """
    known = _RULES.get(name)
    if known is not None and known is not pass_cls:
        raise ValueError(f"fission rule {name!r} is already registered ({known.__name__})")
    _RULES[name] = pass_cls
    return pass_cls


def get_fission_rule(name: str) -> type:
    """The module pass class registered as ``name``.

    Raises
    ------
    UnknownFissionRuleError
        No rule has that name; the message lists the known ones.

    Example
    -------
    >>> FissionSoftmax = get_fission_rule("softmax")
    """
    try:
        return _RULES[name]
    except KeyError:
        raise UnknownFissionRuleError(
            f"unknown fission rule {name!r}; known rules: {', '.join(_RULES)}") from None


def list_fission_rules() -> list[str]:
    """Names of the registered fission rules, in the order :class:`Fission` applies them.

    Example
    -------
    >>> list_fission_rules()[:2]
    ['softmax', 'log_softmax']
    """
    return list(_RULES)


__all__ = ["UnknownFissionRuleError", "get_fission_rule", "list_fission_rules", "register_fission_rule"]
