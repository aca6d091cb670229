"""teraio.torch.compile — offloading inside torch.compile'd programs.

The compiled driver of a session (:class:`CompiledSession`, made by
``teraio.torch.offload(..., compile=True)``) and its parts:

* ``session`` — the driver: the backend, regions, the calls into the runtime;
* ``graph`` — one AOTAutograd graph read as kernels and local storages;
* ``passes`` — where in Inductor's compilation a graph is read and gets its
  calls (after the post-grad rewrites);
* ``ops`` — the ``teraio::kernel_begin`` custom operator and its lowering;
* ``profile`` — the trace of a compiled step;
* ``plan`` — a plan read as the calls each graph gets (StepPlan);
* ``code`` — the memory Inductor's generated code holds between calls.

docs/compile.md tells the whole story.
"""
from .session import CompiledOffload, CompiledSession, _graphs

__all__ = ["CompiledSession", "CompiledOffload"]
