"""What both bridge generations' messages are made of: bodies read as the Hypha worker's serde
reads them (unknown fields ignored), the integer and metrics types they carry, and how a body
becomes JSON. Each generation's messages are in its folder (alpha17/messages.py,
actions/messages.py), declared once: the executor writes and reads through them, and so does
the local stand-in (its bridge reads requests through them, refusing what serde refuses).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr


class Shape(BaseModel):
    # serde ignores unknown fields unless told otherwise.
    model_config = ConfigDict(frozen=True, extra="ignore")


U32 = Annotated[StrictInt, Field(ge=0, le=2**32 - 1)]
# The scheduler's metrics: f32 by name; JSON has no NaN.
Metrics = dict[StrictStr, StrictFloat | StrictInt]
# Where a receive puts its files when the request names no path (both generations' default).
DEFAULT_RECEIVE_DIR = "incoming"


def wire(body: BaseModel) -> dict[str, Any]:
    """A body as JSON values, by the names the bridge reads. Python's floats stay floats: a
    NaN is refused where the JSON is written, never turned into null."""
    return body.model_dump(by_alias=True)
