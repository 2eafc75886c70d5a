"""A match captured once as a CUDA graph and replayed for the next pairs of its size.

At the shared scenes' size a GPU match is bound by Python, not by the GPU: a dozen
kernel launches, the copies and the timing events cost more host time than the
kernels take. For a pair of the same size and options as one matched before, the
backend replays a graph of the whole match instead: the images are copied into the
graph's pinned buffers, the graph is launched, and the map comes back into the pinned
map the pipeline asked for (hostmem; the graph's copy node is pointed at it before the
launch), or into the graph's own pinned buffer and is copied from there. The
kernels, their order and their arguments are those of the capture, so the maps are the
same as without a graph.

The first match of a key runs as usual: it compiles or loads the kernels, uploads the
constant tables and fills the buffer pool. The second is captured (stream capture in
relaxed mode, so that an allocation during it is allowed) and replayed, later ones only
replayed. A graph keeps its device buffers, pinned buffers and timing events while it
is kept (the last GRAPHS_KEPT keys). A key whose capture fails runs as usual from then
on. STEREOCLI_CUDA_GRAPHS=0 turns graphs off.
"""
import os

import numpy as np

from . import hostmem

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


class _CopyNode:
    """A copy node of an instantiated graph whose host end (`end`: "srcHost" for an
    upload, "dstHost" for the download) can be pointed at another page-locked buffer
    between launches; `address` is where it points now."""

    def __init__(self, cu, exec_, node, params, ctx, end):
        self._cu, self._exec, self._node, self._params, self._ctx, self._end = cu, exec_, node, params, ctx, end
        self.address = int(getattr(params, end))

    def point(self, address) -> bool:
        """Make the next launch copy from/to `address`; False when the driver refuses."""
        setattr(self._params, self._end, address)
        err, = self._cu.cuGraphExecMemcpyNodeSetParams(self._exec, self._node, self._params, self._ctx)
        if err != self._cu.CUresult.CUDA_SUCCESS:
            return False
        self.address = address
        return True


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
        nodes, ctx = self._copy_nodes()
        host = cu.CUmemorytype.CU_MEMORYTYPE_HOST
        # The download: the copy into out_view, or None (every map then goes through out_view).
        self._copy = next((_CopyNode(cu, exec_, node, params, ctx, "dstHost") for node, params in nodes
                           if params.dstMemoryType == host and int(params.dstHost) == self.out_view.ctypes.data), None)
        # Per input view, the one copy that reads it (a flat copy of the whole view), or
        # None: that input is always copied into its view.
        self._feeds = []
        for v in self.views:
            found = [(node, params) for node, params in nodes
                     if params.srcMemoryType == host and int(params.srcHost) == v.ctypes.data]
            ok = len(found) == 1 and int(found[0][1].WidthInBytes) == v.nbytes and int(found[0][1].Height) <= 1
            self._feeds.append(_CopyNode(cu, exec_, *found[0], ctx, "srcHost") if ok else None)

    def _copy_nodes(self):
        """[(node, its CUDA_MEMCPY3D)] of the graph's copies, and the context; ([], None)
        when the driver does not say."""
        cu = self._cu
        err, _, count = cu.cuGraphGetNodes(self.graph, 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return [], None
        err, nodes, count = cu.cuGraphGetNodes(self.graph, count)
        err2, ctx = cu.cuCtxGetCurrent()
        if err != cu.CUresult.CUDA_SUCCESS or err2 != cu.CUresult.CUDA_SUCCESS:
            return [], None
        out = []
        for node in nodes[:count]:
            err, kind = cu.cuGraphNodeGetType(node)
            if err != cu.CUresult.CUDA_SUCCESS or kind != cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY:
                continue
            err, params = cu.cuGraphMemcpyNodeGetParams(node)
            if err == cu.CUresult.CUDA_SUCCESS:
                out.append((node, params))
        return out, ctx

    def feed(self, inputs) -> None:
        """Make the next launch read `inputs`: an input in page-locked memory
        (hostmem.is_pinned: a batch's read slot) of its view's shape and type is read from
        where it is (the copy node is pointed at it), any other is copied into its view."""
        for view, a, f in zip(self.views, inputs, self._feeds):
            if (f is not None and a.dtype == view.dtype and a.shape == view.shape and a.flags.c_contiguous
                    and hostmem.is_pinned(a)):
                addr = a.ctypes.data
                if addr == f.address or f.point(addr):
                    continue
            if f is not None and f.address != view.ctypes.data and not f.point(view.ctypes.data):
                raise RuntimeError("could not point a CUDA graph's upload at its own buffer; "
                                   "set STEREOCLI_CUDA_GRAPHS=0 to run without graphs")
            np.copyto(view, a)

    def retarget(self, out) -> bool:
        """Point the download at `out` when it is a pinned map of the pool of out_view's
        size and layout (True: the next launch fills it), else at out_view (False: the
        caller copies the map from there). If the driver refuses, every later map goes
        through out_view."""
        copy, own = self._copy, self.out_view.ctypes.data
        if copy is None:
            return False
        direct = (hostmem.is_pinned(out) and out.flags.c_contiguous
                  and out.dtype == self.out_view.dtype and out.shape == self.out_view.shape)
        target = out.ctypes.data if direct else own
        if target == copy.address or copy.point(target):
            return direct
        if copy.address != own and not copy.point(own):  # (still at an earlier map: never launch so)
            raise RuntimeError("could not point a CUDA graph's download at its own buffer; "
                               "set STEREOCLI_CUDA_GRAPHS=0 to run without graphs")
        self._copy = None
        return False

    def destroy(self):
        if self._cu is not None:
            self._cu.cuGraphExecDestroy(self.exec)
            self._cu.cuGraphDestroy(self.graph)
            self._cu = None
