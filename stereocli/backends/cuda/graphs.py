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
        self._copy = self._download_node()  # (node, params, context), or None: every map through out_view
        self._target = self.out_view.ctypes.data  # where the download node writes now
        self._feeds = self._upload_nodes()  # per input: [node, params, context, address it reads now], or None

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

    def _download_node(self):
        """(node, its CUDA_MEMCPY3D, the context) of the copy into out_view, or None."""
        nodes, ctx = self._copy_nodes()
        host = self._cu.CUmemorytype.CU_MEMORYTYPE_HOST
        for node, params in nodes:
            if params.dstMemoryType == host and int(params.dstHost) == self.out_view.ctypes.data:
                return node, params, ctx
        return None

    def _upload_nodes(self):
        """Per input view, [node, params, context, address] of the one copy that reads it
        (a flat copy of the whole view), or None: that input is always copied into its view."""
        nodes, ctx = self._copy_nodes()
        host = self._cu.CUmemorytype.CU_MEMORYTYPE_HOST
        feeds = []
        for v in self.views:
            found = [(node, params) for node, params in nodes
                     if params.srcMemoryType == host and int(params.srcHost) == v.ctypes.data]
            ok = len(found) == 1 and int(found[0][1].WidthInBytes) == v.nbytes and int(found[0][1].Height) <= 1
            feeds.append([found[0][0], found[0][1], ctx, v.ctypes.data] if ok else None)
        return feeds

    def feed(self, inputs) -> None:
        """Make the next launch read `inputs`: an input in page-locked memory
        (hostmem.is_pinned: a batch's read slot) of its view's shape and type is read from
        where it is (the copy node is pointed at it), any other is copied into its view."""
        for i, (view, a) in enumerate(zip(self.views, inputs)):
            f = self._feeds[i]
            if (f is not None and a.dtype == view.dtype and a.shape == view.shape and a.flags.c_contiguous
                    and hostmem.is_pinned(a)):
                addr = a.ctypes.data
                if addr == f[3] or self._point_feed(f, addr):
                    continue
            if f is not None and f[3] != view.ctypes.data and not self._point_feed(f, view.ctypes.data):
                raise RuntimeError("could not point a CUDA graph's upload at its own buffer; "
                                   "set STEREOCLI_CUDA_GRAPHS=0 to run without graphs")
            np.copyto(view, a)

    def _point_feed(self, f, addr) -> bool:
        node, params, ctx, _ = f
        params.srcHost = addr
        err, = self._cu.cuGraphExecMemcpyNodeSetParams(self.exec, node, params, ctx)
        if err != self._cu.CUresult.CUDA_SUCCESS:
            return False
        f[3] = addr
        return True

    def retarget(self, out) -> bool:
        """Point the download at `out` when it is a pinned map of the pool of out_view's
        size and layout (True: the next launch fills it), else at out_view (False: the
        caller copies the map from there). If the driver refuses, every later map goes
        through out_view."""
        direct = (self._copy is not None and hostmem.is_pinned(out) and out.flags.c_contiguous
                  and out.dtype == self.out_view.dtype and out.shape == self.out_view.shape)
        target = out.ctypes.data if direct else self.out_view.ctypes.data
        if target == self._target or self._point(target):
            return direct
        own = self.out_view.ctypes.data
        if self._target != own and not self._point(own):  # (still at an earlier map: never launch so)
            raise RuntimeError("could not point a CUDA graph's download at its own buffer; "
                               "set STEREOCLI_CUDA_GRAPHS=0 to run without graphs")
        self._copy = None
        return False

    def _point(self, target) -> bool:
        node, params, ctx = self._copy
        params.dstHost = target
        err, = self._cu.cuGraphExecMemcpyNodeSetParams(self.exec, node, params, ctx)
        if err != self._cu.CUresult.CUDA_SUCCESS:
            return False
        self._target = target
        return True

    def destroy(self):
        if self._cu is not None:
            self._cu.cuGraphExecDestroy(self.exec)
            self._cu.cuGraphDestroy(self.graph)
            self._cu = None
