"""``statemachine.immutable.replace`` makes what ``attrs.evolve`` makes, for state classes too."""

from __future__ import annotations

import attrs
import pytest

from statemachine.immutable import replace
from statemachine.state import Checkpoint, FlowStatus, SessionState, StartedLocally


@attrs.frozen
class Converted:
    name: str
    items: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    positive: int = attrs.field(default=1, validator=attrs.validators.gt(0))


@attrs.frozen
class WithPostInit:
    value: int
    doubled: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "doubled", 2 * self.value)


def test_replace_equals_evolve_and_converts_only_what_changed() -> None:
    value = Converted("a", [1, 2])
    changed = replace(value, items=[3])
    assert changed == attrs.evolve(value, items=[3]) == Converted("a", (3,))
    assert hash(changed) == hash(Converted("a", (3,)))
    assert value == Converted("a", (1, 2))  # the original is untouched
    assert replace(value) == value and replace(value) is not value


def test_replace_runs_the_validator_of_a_changed_field_and_refuses_unknown_fields() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        replace(Converted("a"), positive=0)
    with pytest.raises(TypeError, match="Converted has no field 'nope' to change"):
        replace(Converted("a"), nope=1)


def test_a_class_with_a_post_init_hook_goes_through_evolve() -> None:
    assert replace(WithPostInit(2), value=5).doubled == 10


def test_replace_on_the_checkpoint_matches_evolve() -> None:
    checkpoint = Checkpoint(
        "flow-1", StartedLocally("samples.pingpong.PingFlow", b""), FlowStatus.RUNNABLE, 1.0
    )
    session = SessionState(
        "s1", "s1.r", "O=Bob,L=New York,C=US", True, "samples.pingpong.PingFlow", 1, "pingpong"
    )
    for changes in (
        {"status": FlowStatus.SUSPENDED},
        {"sessions": [session]},
        {"journal": [], "version": 3},
    ):
        assert replace(checkpoint, **changes) == attrs.evolve(checkpoint, **changes)
    with_session = replace(checkpoint, sessions=[session])
    assert with_session.session("s1") == session  # the converter built the session table


@attrs.frozen(weakref_slot=False)
class Built:
    name: str
    items: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    positive: int = attrs.field(default=1, validator=attrs.validators.gt(0))


@pytest.mark.parametrize("cls", [Built, Converted])
def test_a_replaced_value_is_a_frozen_instance_of_its_class_either_way(cls: type) -> None:
    # Built has no __weakref__ slot: replace builds it through a builder class and assigns
    # its __class__; Converted has one, so replace sets its fields with object.__setattr__.
    value = cls("a", [1, 2], 3)
    changed = replace(value, items=[4], positive=5)
    assert type(changed) is cls
    assert changed == attrs.evolve(value, items=[4], positive=5) == cls("a", (4,), 5)
    assert hash(changed) == hash(cls("a", (4,), 5))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        changed.name = "b"  # type: ignore[misc]
    with pytest.raises(ValueError, match="must be > 0"):
        replace(value, positive=0)
    assert value == cls("a", (1, 2), 3)  # the original is untouched


def test_the_flow_state_classes_are_built_without_object_setattr() -> None:
    from statemachine import immutable as values
    from statemachine.state import FlowState, ReceiveProgress

    for cls in (FlowState, Checkpoint, SessionState, ReceiveProgress):
        assert values._builder(cls) is not None, cls
    assert values._builder(Converted) is None  # a __weakref__ slot: another layout
