"""A match captured once as a CUDA graph and replayed for the next pairs of its size.

At the shared scenes' size a GPU match is bound by Python, not by the GPU: a dozen
kernel launches, the copies and the timing events cost more host time than the
kernels take. For a pair of the same size and options as one matched before, the
backend replays a graph of the whole match instead: the images are copied into the
graph's pinned buffers, the graph is launched, and the map is copied out of its pinned
buffer. The kernels, their order and their arguments are those of the capture, so the
maps are the same as without a graph.

The first match of a key runs as usual: it compiles or loads the kernels, uploads the
constant tables and fills the buffer pool. The second is captured (stream capture in
relaxed mode, so that an allocation during it is allowed) and replayed, later ones only
replayed. A graph keeps its device buffers, pinned buffers and timing events while it
is kept (the last GRAPHS_KEPT keys). A key whose capture fails runs as usual from then
on. STEREOCLI_CUDA_GRAPHS=0 turns graphs off.
"""
import os

GRAPHS_KEPT = 4  # keys whose graphs (and buffers) are kept, the most recently used
ENV = "STEREOCLI_CUDA_GRAPHS"


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


class Capture:
    """What the backend records while a match is captured: the pinned buffer each host
    input was copied into (by the input's identity: the arrays the caller names), the
    pinned buffer the map comes back into, and everything the graph uses and must keep
    alive (device arrays, pinned buffers, events)."""

    def __init__(self, inputs):
        self.inputs = list(inputs)
        self.views = [None] * len(self.inputs)
        self.out_view = None
        self.keep = []

    def uploaded(self, source, pinned):
        """`source` (as the caller passed it) was copied into `pinned`."""
        self.keep.append(pinned)
        for i, a in enumerate(self.inputs):
            if a is source:
                self.views[i] = pinned

    def complete(self) -> bool:
        return self.out_view is not None and all(v is not None for v in self.views)


class Graph:
    """An instantiated graph and what it keeps: the input and output pinned buffers and
    the timing marks [(stage, event)] its event nodes record."""

    def __init__(self, cu, graph, exec_, capture, marks):
        self._cu = cu
        self.graph = graph
        self.exec = exec_
        self.views = capture.views
        self.out_view = capture.out_view
        self.keep = capture.keep
        self.marks = marks

    def destroy(self):
        if self._cu is not None:
            self._cu.cuGraphExecDestroy(self.exec)
            self._cu.cuGraphDestroy(self.graph)
            self._cu = None
