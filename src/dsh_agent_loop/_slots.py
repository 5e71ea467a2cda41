"""Slot constructors: build a frozen slotted attrs instance without its ``__init__``.

Hot paths (every request, every streamed tool call) build frozen records from parts that are
already valid. (``Event`` is a ``msgspec.Struct`` built by ``events.make_event`` in one C
call; these constructors serve the attrs records.) Calling the class runs its converters and
``object.__setattr__`` per field; writing the slots through their descriptors costs about half.
The field order and the set of fields are read from ``attrs.fields`` here, never written by
hand, and ``slot_constructor`` refuses a constructor that would leave a field unset, so adding
a field to a record cannot silently produce half-built instances.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
from attrs import AttrsInstance

__all__ = ["slot_constructor"]

T = TypeVar("T", bound=AttrsInstance)

_NOTHING = attrs.NOTHING


def _plain_default(default: Any) -> bool:
    return default is not _NOTHING and not isinstance(default, attrs.Factory)  # type: ignore[arg-type]


def slot_constructor(
    cls: type[T],
    params: Sequence[str] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> Callable[..., T]:
    """Return ``make(*params)`` that fills every slot of ``cls`` and skips its converters.

    Args:
        cls: A slotted attrs class.
        params: The fields the constructor takes, in this order (default: every field not in
            ``fixed``, in ``attrs.fields`` order). A trailing run of fields with plain defaults
            is optional.
        fixed: Constant values for fields that are not parameters.

    Returns:
        The constructor; it sets the fields in ``attrs.fields`` order.

    Raises:
        TypeError: ``cls`` is not a slotted attrs class, a name is not one of its fields, or a
            field would be left without a value (no parameter, constant or plain default).
    """
    fields = attrs.fields(cls)
    names = [f.name for f in fields]
    if "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a slotted attrs class")
    fixed = dict(fixed or {})
    unknown = [n for n in (*(params or ()), *fixed) if n not in names]
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {unknown}")
    if "new" in names or any(n.startswith("_") for n in names):
        raise TypeError(f"{cls.__name__}: field names clash with the generated code")
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    by_name = {f.name: f for f in fields}
    if params is None:
        params = [n for n in names if n not in fixed]
    signature: list[str] = []
    for i, name in enumerate(params):
        default = by_name[name].default
        optional = all(_plain_default(by_name[n].default) for n in params[i:])
        if optional:
            namespace[f"_d_{name}"] = default
            signature.append(f"{name}=_d_{name}")
        else:
            signature.append(name)
    body = ["    new = _new(_cls)"]
    for f in fields:
        namespace[f"_s_{f.name}"] = cls.__dict__[f.name].__set__
        if f.name in params:
            value = f.name
        elif f.name in fixed:
            namespace[f"_c_{f.name}"] = fixed[f.name]
            value = f"_c_{f.name}"
        elif _plain_default(f.default):
            namespace[f"_c_{f.name}"] = f.default
            value = f"_c_{f.name}"
        else:
            raise TypeError(f"{cls.__name__}.{f.name} would be left unset")
        body.append(f"    _s_{f.name}(new, {value})")
    body.append("    return new")
    name = f"make_{cls.__name__}"
    source = f"def {name}({', '.join(signature)}):\n" + "\n".join(body) + "\n"
    exec(compile(source, f"<slot constructor {cls.__qualname__}>", "exec"), namespace)
    made: Callable[..., T] = namespace[name]
    made.__qualname__ = name
    made.__module__ = cls.__module__
    made.__doc__ = f"Build a ``{cls.__name__}`` from valid parts (fields {names})."
    return made
