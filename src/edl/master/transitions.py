"""Transition tables: which state may follow which, and the one function that moves through them."""

from __future__ import annotations

from collections.abc import Mapping, Set
from enum import Enum
from typing import Generic, TypeVar

S = TypeVar("S", bound=Enum)


class IllegalTransition(RuntimeError):
    """A state machine was asked for a move its table does not allow: a bug in edl, not bad input."""


class Transitions(Generic[S]):
    def __init__(self, what: str, allowed: Mapping[S, Set[S]]) -> None:
        self.what = what
        self.allowed = {state: frozenset(to) for state, to in allowed.items()}

    def allows(self, state: S, to: S) -> bool:
        return to in self.allowed[state]

    def move(self, state: S, to: S) -> S:
        """``to``, if the table allows it after ``state``; else ``IllegalTransition``."""
        if not self.allows(state, to):
            raise IllegalTransition(f"{self.what}: {state.value} -> {to.value} is not allowed")
        return to
