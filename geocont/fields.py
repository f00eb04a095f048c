"""The building blocks every config section is made of: strict frozen models, numbers as users mean
them, and the one error type for bad input.

Its own module, below config.py and every model kind (geocont.kinds), so that a kind can declare its
`model:` section with the same field types without importing the config that looks kinds up.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


class ConfigError(ValueError):
    """Bad user input. `problems` holds one line per problem, each naming the dotted path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))

    def __reduce__(self):
        # Pickled across Ray process boundaries: rebuild from the list, not from the joined message.
        return (type(self), (self.problems,))


class Strict(BaseModel):
    """A config section: unknown keys are errors (a typo fails at load, never mid-run) and it is frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _not_bool(value: Any) -> Any:
    # pydantic reads `true` as 1 for a number field; a user who typed a bool meant something else.
    if isinstance(value, bool):
        raise ValueError(f"got {value!r}, a bool; allowed: a number")
    return value


# Numbers as the config reads them: no bools, no inf/nan (a learning rate of inf is never meant).
Number = Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)]
PositiveFloat = Annotated[Number, Field(gt=0)]
Int = Annotated[int, BeforeValidator(_not_bool)]
PositiveInt = Annotated[Int, Field(gt=0)]
# Continuity compares consecutive layers: one layer has nothing to compare (the metrics would raise mid-run).
Depth = Annotated[Int, Field(ge=2)]


class ModelSection(Strict):
    """The `model:` section of one model kind; each kind's class narrows `kind` to its own name."""

    kind: str
