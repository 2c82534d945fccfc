"""``NamedTuple``: typing's for type checkers, a cheaper class of the same behaviour at run time.

Every hook is a fresh process that defines the records of the modules it
loads. ``typing.NamedTuple`` costs about 90 µs a class on Python 3.11: it
turns each field's annotation into a ``ForwardRef`` (compiling its text) and
``collections.namedtuple`` ``exec``s a ``__new__``. A steady hook loads about
thirty records, about 3 ms of a budget of 15 (docs/explanation/boot-and-hooks.md,
"Hook cost"). The class here reads the field names from the class body's
annotations without evaluating them and shares one ``__new__``: about 10 µs a
class.

Type checkers (``TYPE_CHECKING``) see ``typing.NamedTuple`` itself, so the
fields stay typed and mypy checks every construction. At run time a record
behaves as a ``typing.NamedTuple`` does for what this project uses: a tuple
(equality, hashing, unpacking, indexing), fields by name and read-only,
defaults for trailing fields, ``_fields``, ``_field_defaults``, ``_make``,
``_replace``, ``_asdict``, the same ``repr``, pickling and copying, methods
and properties in the class body, and the same ``TypeError`` for a missing,
repeated or unknown argument. unit_tests/test_record.py compares each of
these with ``typing.NamedTuple``.
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any, Dict, Tuple

if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
else:
    # Names a record class may not define, as typing.NamedTuple refuses them.
    _RESERVED = frozenset(("__new__", "__init__", "__slots__", "__getnewargs__", "_fields",
                           "_field_defaults", "_make", "_replace", "_asdict", "_source",
                           "_required", "_tail"))

    class _Record(tuple):
        """What every record shares; a record's own class adds its fields."""

        __slots__ = ()
        _fields: Tuple[str, ...] = ()
        _field_defaults: Dict[str, Any] = {}

        _required = 0  # how many leading fields have no default
        _tail: Tuple[Any, ...] = ()  # the defaults of the others, in order

        def __new__(cls, *args, **kwargs):
            fields = cls._fields
            if not kwargs and cls._required <= len(args) <= len(fields):
                return tuple.__new__(cls, args + cls._tail[len(args) - cls._required:])
            if not args and len(kwargs) == len(fields):
                try:
                    return tuple.__new__(cls, [kwargs[name] for name in fields])
                except KeyError:
                    pass  # a name that is not a field: _bind says which
            return tuple.__new__(cls, _bind(cls, args, kwargs))

        @classmethod
        def _make(cls, iterable):
            """A record from a sequence or iterable, as namedtuple's ``_make``."""
            values = tuple(iterable)
            if len(values) != len(cls._fields):
                raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(values)}")
            return tuple.__new__(cls, values)

        def _replace(self, **changes):
            """A copy with ``changes`` (field=value)."""
            values = [changes.pop(name, value) for name, value in zip(self._fields, self)]
            if changes:
                raise ValueError(f"Got unexpected field names: {list(changes)!r}")
            return tuple.__new__(type(self), values)

        def _asdict(self):
            """``{field: value}`` in field order."""
            return dict(zip(self._fields, self))

        def __repr__(self):
            return f"{type(self).__name__}(" + ", ".join(
                f"{name}={value!r}" for name, value in zip(self._fields, self)) + ")"

        def __getnewargs__(self):
            return tuple(self)

    def _bind(cls, args, kwargs):
        """The values for ``cls(*args, **kwargs)``, or typing.NamedTuple's TypeError."""
        fields = cls._fields
        if len(args) > len(fields):
            least = cls._required + 1
            takes = f"{least}" if least == len(fields) + 1 else f"from {least} to {len(fields) + 1}"
            raise TypeError(f"{cls.__name__}.__new__() takes {takes} positional "
                            f"arguments but {len(args) + 1} were given")
        values = list(args)
        kwargs = dict(kwargs)
        missing = []
        for name in fields[len(args):]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in cls._field_defaults:
                values.append(cls._field_defaults[name])
            else:
                missing.append(name)
        if kwargs:
            name = next(iter(kwargs))
            if name in fields:
                raise TypeError(f"{cls.__name__}.__new__() got multiple values for argument '{name}'")
            raise TypeError(f"{cls.__name__}.__new__() got an unexpected keyword argument '{name}'")
        if missing:
            quoted = [repr(m) for m in missing]  # as Python words it: 'a', 'b', and 'c'
            named = (" and ".join(quoted) if len(quoted) < 3
                     else ", ".join(quoted[:-1]) + ", and " + quoted[-1])
            raise TypeError(f"{cls.__name__}.__new__() missing {len(missing)} required "
                            f"positional argument{'s' if len(missing) > 1 else ''}: {named}")
        return values

    class _Meta(type):
        """Builds each record class as a subclass of :class:`_Record`."""

        def __new__(mcls, name, bases, namespace):
            if namespace.get("_root"):
                return super().__new__(mcls, name, bases, namespace)
            fields = tuple(namespace.get("__annotations__", ()))
            defaults = {}
            for field in fields:
                if field in namespace:
                    defaults[field] = namespace.pop(field)
                elif defaults:
                    raise TypeError(f"Non-default namedtuple field {field} cannot follow "
                                    f"default field{'s' if len(defaults) > 1 else ''} "
                                    f"{', '.join(defaults)}")
            for key in namespace:
                if key in _RESERVED:
                    raise AttributeError(f"Cannot overwrite NamedTuple attribute {key}")
            namespace["__slots__"] = ()
            namespace["_fields"] = fields
            namespace["_field_defaults"] = defaults
            namespace["_required"] = len(fields) - len(defaults)
            namespace["_tail"] = tuple(defaults.values())
            namespace["__match_args__"] = fields
            for index, field in enumerate(fields):
                namespace[field] = property(itemgetter(index), doc=f"Alias for field number {index}")
            return type.__new__(type, name, (_Record,), namespace)

    class NamedTuple(metaclass=_Meta):
        """Subclass this as ``typing.NamedTuple``: ``class Point(NamedTuple): x: int``."""

        _root = True
