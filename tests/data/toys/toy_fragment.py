"""toy_fragment: cut the data towards the receiver in pieces of `size` bytes, whole again at the
end; a toy slicer fault (tests/test_extension_toys.py copies it to testbed/nemesis/actions/).
The sim cannot play the `slice` verb, so a scenario with it is refused there before the run.

```yaml
nemesis: [{action: toy_fragment, at: 10s, for: 5s, size: 512}]
```
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from testbed.nemesis.fault import ACTIONS
from testbed.nemesis.link import LinkEvent, LinkFault
from testbed.nemesis.verbs import LinkControl


class ToyFragmentAction(LinkEvent):
    action: Literal["toy_fragment"] = "toy_fragment"
    size: int = Field(gt=0, description="wire bytes per piece")


EVIDENCE = {
    "ToyFragmentAction.action": "tests/test_toys.py::test_the_fault_slices_by_its_size",
    "ToyFragmentAction.size": "tests/test_toys.py::test_the_fault_slices_by_its_size",
}


@ACTIONS.register
class ToyFragmentFault(LinkFault[ToyFragmentAction]):
    config = ToyFragmentAction
    verbs = frozenset({"slice"})

    async def apply(self, link: LinkControl, key: str) -> dict[str, Any]:
        await link.add_slicer(key, average_bytes=self.event.size, variation_bytes=0, delay_s=0.0)
        return {"size": self.event.size}
