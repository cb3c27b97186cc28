"""Every check, in the order reports list them: the driver and software stack first (`stack`),
then the hardware and the system around it (`hardware`)."""

from __future__ import annotations

from gpuconsole.actions.verify import hardware, stack
from gpuconsole.actions.verify.model import Check

CHECKS: tuple[Check, ...] = (*stack.CHECKS, *hardware.CHECKS)
