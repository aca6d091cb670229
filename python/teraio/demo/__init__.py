"""`make demo`: a real model trains on real text with its tensors offloaded to SSD.

Runs of the same training job, each in its own process so that their
memory can be measured apart (teraio.demo.runs):

* run A — no offloading.  Iteration 1 is profiled to get the memory curve
  M[k] and its peak (the bytes that must be resident without teraio).
* run B — teraio.torch.offload for a capacity of half of run A's peak:
  iterations 0 and 1 are profiled, libteraio plans offloads with the SSD
  bandwidth measured through the engine, and the remaining iterations run
  with tensors moved to files under build/demo/ssd (or --ssd DIR ...) and
  back.  In the same process, on B's trace, run V — the simulator check
  (skipped with --validate-iterations 0): the job under an empty plan, a
  calibration plan and B's plan in turn; teraio.core.fit_host_costs
  (tio_sim_fit_host_costs) fits this CPU's host costs to the first two and
  compares the simulated iteration time of the third with the measured one
  (docs/eval.md).
* with --sweep, instead of B: run S, the capacity sweep — the plans for 0.9,
  0.8, ... 0.1 of the peak, down to the working-set floor (`make
  demo-sweep`).

The model is a Llama-style decoder (teraio.models.llama) trained with AdamW
from a fixed random initialisation on byte-level tokens of the Python
standard library's sources (a fixed, sorted file list).  The parent process
(teraio.demo.cli) compares the losses bit for bit and writes the report
(teraio.demo.report): build/demo/summary.json and memory.svg, or
sweep.json, sweep.md and sweep.svg.
"""
from .cli import main

__all__ = ["main"]
