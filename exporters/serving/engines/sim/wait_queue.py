"""The scheduler's waiting queue: FCFS or priority order."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from exporters.serving.engines.sim.sched_types import Policy, SchedRequest


class WaitQueue:
    """FCFS deque or priority heap behind one interface."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._fifo: deque[SchedRequest] = deque()
        self._heap: list[tuple[int, int, SchedRequest]] = []

    def __len__(self) -> int:
        return len(self._heap) if self.policy is Policy.PRIORITY else len(self._fifo)

    def __iter__(self) -> Iterator[SchedRequest]:
        if self.policy is Policy.PRIORITY:
            return iter([entry[2] for entry in sorted(self._heap, key=lambda e: (e[0], e[1]))])
        return iter(self._fifo)

    def unordered(self) -> Iterator[SchedRequest]:
        """Every waiting request, cheaply, in no particular order."""
        if self.policy is Policy.PRIORITY:
            return (entry[2] for entry in self._heap)
        return iter(self._fifo)

    def add(self, req: SchedRequest) -> None:
        if self.policy is Policy.PRIORITY:
            heapq.heappush(self._heap, (req.priority, req.seq, req))
        else:
            self._fifo.append(req)

    def add_front(self, req: SchedRequest) -> None:
        """Preempted or skipped requests: FCFS puts them first; the heap orders them by key anyway."""
        if self.policy is Policy.PRIORITY:
            heapq.heappush(self._heap, (req.priority, req.seq, req))
        else:
            self._fifo.appendleft(req)

    def peek(self) -> SchedRequest:
        return self._heap[0][2] if self.policy is Policy.PRIORITY else self._fifo[0]

    def pop(self) -> SchedRequest:
        return heapq.heappop(self._heap)[2] if self.policy is Policy.PRIORITY else self._fifo.popleft()

    def remove(self, req: SchedRequest) -> None:
        if self.policy is Policy.PRIORITY:
            self._heap = [e for e in self._heap if e[2] is not req]
            heapq.heapify(self._heap)
        else:
            self._fifo.remove(req)
