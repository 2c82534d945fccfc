"""vgpu.record.NamedTuple behaves as typing.NamedTuple for what the project uses.

Each test builds the same record twice, once with each base, and compares
what they do: the run-time class is only a cheaper way to define it.
"""

import copy
import pickle
import typing

import pytest

from vgpu import record


def _define(base):
    class Point(base):
        """A point."""

        x: int
        y: int
        label: str = "origin"
        tags: tuple = ()

        @property
        def norm(self) -> int:
            return abs(self.x) + abs(self.y)

        def moved(self, dx: int) -> "Point":
            return self._replace(x=self.x + dx)

    return Point


OURS = _define(record.NamedTuple)
THEIRS = _define(typing.NamedTuple)


class Cheap(record.NamedTuple):
    """Defined at module level, so that pickle finds it by name."""

    x: int
    label: str = ""
    tags: tuple = ()


def both():
    return pytest.mark.parametrize("cls", [OURS, THEIRS], ids=["record", "typing"])


def test_the_run_time_class_is_not_typing_s():
    assert record.NamedTuple is not typing.NamedTuple
    assert OURS.__mro__[-2:] == (tuple, object)
    assert "ForwardRef" not in repr(vars(OURS))


@pytest.mark.parametrize("args, kwargs", [
    ((1, 2), {}),
    ((1, 2, "a"), {}),
    ((1,), {"y": 2, "tags": ("t",)}),
    ((), {"x": 1, "y": 2, "label": "b", "tags": ()}),
    ((1, 2, "c", ("u",)), {}),
])
def test_construction_defaults_and_tuple_behaviour_match(args, kwargs):
    ours, theirs = OURS(*args, **kwargs), THEIRS(*args, **kwargs)
    assert tuple(ours) == tuple(theirs)
    assert ours == theirs and hash(ours) == hash(theirs)  # compared as tuples, as typing's are
    assert repr(ours) == repr(theirs)
    assert ours._asdict() == theirs._asdict()
    assert (ours.x, ours.y, ours.label, ours.tags) == (theirs.x, theirs.y, theirs.label, theirs.tags)
    assert ours[1] == theirs[1] and ours[-1] == theirs[-1] and len(ours) == len(theirs)
    x, y, label, tags = ours
    assert (x, y, label, tags) == tuple(theirs)


def test_class_attributes_match():
    assert OURS._fields == THEIRS._fields == ("x", "y", "label", "tags")
    assert OURS._field_defaults == THEIRS._field_defaults == {"label": "origin", "tags": ()}
    assert OURS.__match_args__ == THEIRS.__match_args__
    assert OURS.__doc__ == THEIRS.__doc__ == "A point."
    assert OURS.__module__ == THEIRS.__module__ == __name__


@both()
def test_methods_properties_replace_and_make(cls):
    point = cls(3, -4)
    assert point.norm == 7
    assert point.moved(2) == cls(5, -4) and type(point.moved(2)) is cls
    assert point._replace(label="p") == (3, -4, "p", ())
    assert cls._make([1, 2, "m", ()]) == cls(1, 2, "m")
    assert type(cls._make((1, 2, "m", ()))) is cls
    with pytest.raises(ValueError, match="Got unexpected field names"):
        point._replace(z=1)
    with pytest.raises(TypeError, match="Expected 4 arguments, got 2"):
        cls._make([1, 2])


@both()
def test_fields_are_read_only_and_instances_have_no_dict(cls):
    point = cls(1, 2)
    with pytest.raises(AttributeError):
        point.x = 5
    with pytest.raises(AttributeError):
        point.other = 5
    assert not hasattr(point, "__dict__")


@pytest.mark.parametrize("args, kwargs", [
    ((), {}),
    ((1,), {}),
    ((1, 2, 3, 4, 5), {}),
    ((1, 2), {"x": 3}),
    ((1, 2), {"z": 3}),
    ((), {"y": 1, "label": "l"}),
    ((), {"x": 1, "y": 2, "label": "b", "zz": ()}),
])
def test_bad_arguments_raise_the_same_type_error(args, kwargs):
    with pytest.raises(TypeError) as theirs:
        THEIRS(*args, **kwargs)
    with pytest.raises(TypeError) as ours:
        OURS(*args, **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_three_missing_arguments_are_named_as_typing_names_them():
    class Ours(record.NamedTuple):
        a: int
        b: int
        c: int

    class Theirs(typing.NamedTuple):
        a: int
        b: int
        c: int

    said = []
    for cls in (Ours, Theirs):
        with pytest.raises(TypeError) as raised:
            cls()
        said.append(str(raised.value).split(".", 1)[1])
    assert said[0] == said[1] == ("__new__() missing 3 required positional arguments: "
                                  "'a', 'b', and 'c'")


def test_too_many_arguments_for_a_record_without_defaults_is_said_as_typing_says_it():
    class Ours(record.NamedTuple):
        x: int

    class Theirs(typing.NamedTuple):
        x: int

    for cls, name in ((Ours, "Ours"), (Theirs, "Theirs")):
        with pytest.raises(TypeError) as raised:
            cls(1, 2)
        assert str(raised.value) == f"{name}.__new__() takes 2 positional arguments but 3 were given"


def test_a_field_without_default_after_one_with_is_refused_as_typing_refuses_it():
    for base in (record.NamedTuple, typing.NamedTuple):
        with pytest.raises(TypeError, match="Non-default namedtuple field y cannot follow default field x"):
            class Bad(base):
                x: int = 0
                y: int


@pytest.mark.parametrize("name", ["__new__", "__init__", "_make", "_replace", "_fields"])
def test_overwriting_what_a_record_needs_is_refused(name):
    source = f"class Bad(base):\n    x: int\n    def {name}(self):\n        pass\n"
    for base in (record.NamedTuple, typing.NamedTuple):
        with pytest.raises(AttributeError, match=f"Cannot overwrite NamedTuple attribute {name}"):
            exec(source, {"base": base})


def test_pickle_and_copy_give_an_equal_record_of_the_same_class():
    point = Cheap(1, "p", ("t",))
    for clone in (pickle.loads(pickle.dumps(point)), copy.copy(point), copy.deepcopy(point)):
        assert clone == point and type(clone) is Cheap


def test_records_of_the_project_are_the_cheap_class_and_still_typed_for_mypy():
    from vgpu import pci

    gpu = pci.Gpu(address="0000:81:00.0", device_id="0x26b9", model="L40S", driver="nvidia",
                  class_code="0x030200")
    assert isinstance(gpu, tuple) and type(gpu).__mro__[1].__name__ == "_Record"
    assert gpu.vfs == () and gpu.sriov is False
    # The annotations stay as written, for readers and for mypy (which sees typing.NamedTuple).
    assert pci.Gpu.__annotations__["address"] == "str"


def test_no_module_of_the_charm_defines_records_with_typing_s_named_tuple():
    """A steady hook pays typing.NamedTuple's price for each class: records use vgpu.record's."""
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src"
    offenders = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "record.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "typing" and any(
                    alias.name == "NamedTuple" for alias in node.names):
                offenders.append(str(path.relative_to(src)))
            if isinstance(node, ast.Attribute) and node.attr == "NamedTuple":
                offenders.append(str(path.relative_to(src)))
    assert offenders == []
    users = [p for p in src.rglob("*.py") if "from .record import NamedTuple" in p.read_text()]
    assert users
    # The run-time class reads the fields from the class body's __annotations__, which
    # ``from __future__ import annotations`` keeps as plain strings on every Python.
    assert [str(p.relative_to(src)) for p in users
            if "from __future__ import annotations" not in p.read_text()] == []
